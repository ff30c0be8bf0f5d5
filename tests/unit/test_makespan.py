"""The machine's schedule (opdgrpo.cost.makespan): list scheduling by critical path with backfilling, and the local
search over GPU counts, held to the exhaustive optimum on a DAG whose best assignment is known."""

from __future__ import annotations

import itertools

import pytest

from opdgrpo.cost.makespan import Task, bottom_levels, choose, simulate


def _dag() -> dict[str, Task]:
    """A long, well-scaling chain (a -> c) beside four short jobs that scale poorly (b1..b4), on 8 GPUs, after a
    job with no GPU (t, a tokenizer). Best: a on 4 GPUs beside the b's on 1 each (a ends at 4 h, the b's at 3 h),
    then c on all 8 (0.6 h): 4.6 h. Giving a all 8 GPUs first ends it at 2.2 h but leaves the b's (3 h on any
    count) to run after it: 5.2 h at best."""
    poor = {1: 3.0, 2: 2.8, 4: 2.7, 8: 2.6}
    return {"t": Task("t", (), {0: 0.0}),
            "a": Task("a", ("t",), {1: 16.0, 2: 8.0, 4: 4.0, 8: 2.2}),
            "c": Task("c", ("a",), {1: 4.0, 2: 2.0, 4: 1.0, 8: 0.6}),
            **{f"b{i}": Task(f"b{i}", ("t",), dict(poor)) for i in range(1, 5)}}


def _exhaustive(tasks: dict[str, Task], gpus: int) -> float:
    ids = sorted(tasks)
    return min(simulate(tasks, gpus, dict(zip(ids, combo))).makespan
               for combo in itertools.product(*(sorted(tasks[i].hours) for i in ids)))


def test_the_search_finds_the_known_best_assignment():
    tasks = _dag()
    found = choose(tasks, 8)
    assert found.makespan == pytest.approx(4.6) == pytest.approx(_exhaustive(tasks, 8))
    assert {k: v for k, v in found.counts.items() if k != "t"} == {"a": 4, "c": 8, "b1": 1, "b2": 1, "b3": 1, "b4": 1}
    assert found.starts["c"] == pytest.approx(4.0) and max(found.ends[f"b{i}"] for i in range(1, 5)) == pytest.approx(3.0)


def test_jobs_share_the_machine_and_wait_for_what_they_need():
    tasks = {"x": Task("x", (), {4: 2.0}), "y": Task("y", (), {4: 1.0}), "z": Task("z", (), {8: 1.0}),
             "w": Task("w", ("y",), {2: 1.0})}
    s = simulate(tasks, 8, {"x": 4, "y": 4, "z": 8, "w": 2})
    # z is first by its bottom level only after x (2 h) and y + w (2 h): x and y start together, w after y, z last
    assert s.starts == {"x": 0.0, "y": 0.0, "w": 1.0, "z": 2.0} and s.makespan == 3.0
    assert s.gpu_hours == 4 * 2 + 4 + 2 + 8


def test_a_job_that_does_not_fit_is_passed_over_for_one_that_does():
    """Backfilling: b (8 GPUs) waits for a; c (2 GPUs), lower in priority, starts beside a at once."""
    tasks = {"a": Task("a", (), {4: 3.0}), "b": Task("b", (), {8: 2.0}), "c": Task("c", (), {2: 1.0})}
    s = simulate(tasks, 8, {"a": 4, "b": 8, "c": 2})
    assert s.starts == {"a": 0.0, "c": 0.0, "b": 3.0}


def test_a_lone_chain_takes_each_jobs_fastest_count_and_fixed_counts_stay():
    tasks = {"p": Task("p", (), {1: 8.0, 2: 4.0, 4: 2.0, 8: 1.0}), "q": Task("q", ("p",), {1: 8.0, 2: 4.5, 4: 3.0, 8: 3.5})}
    assert choose(tasks, 8).counts == {"p": 8, "q": 4}
    assert choose(tasks, 8, fixed={"p": 2}).counts == {"p": 2, "q": 4}
    assert choose(tasks, 4).counts == {"p": 4, "q": 4}   # 8 is not on a 4-GPU machine


def test_bottom_levels_follow_the_longest_chain():
    tasks = {"a": Task("a", (), {1: 1.0}), "b": Task("b", ("a",), {1: 5.0}), "c": Task("c", (), {1: 3.0})}
    assert bottom_levels(tasks, {"a": 1.0, "b": 5.0, "c": 3.0}) == {"a": 6.0, "b": 5.0, "c": 3.0}


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="job 'a' asks for 8 GPUs of a machine of 4"):
        simulate({"a": Task("a", (), {8: 1.0})}, 4, {"a": 8})
    with pytest.raises(ValueError, match="cycle"):
        simulate({"a": Task("a", ("b",), {1: 1.0}), "b": Task("b", ("a",), {1: 1.0})}, 4, {"a": 1, "b": 1})
