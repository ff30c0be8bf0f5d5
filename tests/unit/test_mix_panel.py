"""The S4/S5 mix panel draws the matched points where a reader can see them."""

from __future__ import annotations

import pandas as pd

from opdgrpo.report.plots import PlotContext
from opdgrpo.report.studies.consolidation import _mix_panel


def _curves() -> pd.DataFrame:
    rows = []
    for run, flops in (("joint", 1e12), ("distill", 1e11)):
        for step, acc in ((0, 0.0), (10, 0.01)):
            for domain in ("math", "code"):
                rows.append({"run": run, "study": "S4", "method": "m", "train_domains": "math+code", "seed": 0,
                             "step": step, "cumulative_flops": step * flops, "eval_domain": domain,
                             "eval_set": domain, "accuracy": acc, "mean_response_length": 4.0})
    return pd.DataFrame(rows)


def _panel(threshold: float):
    entry = {"domains": ["math", "code"], "joint": "joint", "distill": "distill", "experts": []}
    savings = {"S4": {"target_accuracy": 0.01, "threshold_accuracy": threshold, "direction": "joint",
                      "expert_flops": 5e11, "joint_flops": 0.0, "pipeline_flops": 5e11, "distill_flops": 0.0}}
    return _mix_panel("S4", entry, PlotContext(curves=_curves(), labels={}, savings=savings))


def test_a_threshold_under_zero_is_drawn_on_the_axis_and_says_so():
    points = _panel(-0.0057).points
    assert [y for _, y, _ in points] == [0.0, 0.0]
    assert "drawn at 0%" in points[0][2]


def test_a_threshold_above_zero_is_drawn_where_it_is():
    points = _panel(0.004).points
    assert [y for _, y, _ in points] == [0.4, 0.4] and points[0][2] == "reached (target - tolerance)"


def test_the_target_line_says_whose_best_it_is_and_a_mixed_row_says_it_is_a_mean():
    from opdgrpo.report.studies.consolidation import target_label

    assert target_label("joint") == "target: joint GRPO's best (smoothed)"
    assert target_label("pipeline") == "target: the distillation's best (smoothed)"
    assert target_label("joint, pipeline") == "target: mean of the seeds' targets (joint, pipeline decide)"
    assert [label for _, label in _panel(0.005).hlines] == ["target: joint GRPO's best (smoothed)"]
