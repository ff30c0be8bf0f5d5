"""Instruction following at paper scale: RL on allenai/RLVR-IFeval, held-out google/IFEval, IFEval's checkers.

Held-out rows have google/IFEval's schema: ``key`` (int64), ``prompt``, ``instruction_id_list`` (list of string) and
``kwargs``, a list of structs, one per instruction, whose fields are the union of every instruction's argument
names, unused ones null. Nulls are dropped and each instruction's arguments validated when the set is loaded, so a
bad row fails before any compute, naming the config key, the row's key and the argument.

Training rows have allenai/RLVR-IFeval's schema: ``messages`` (one user turn), ``ground_truth`` (a JSON string:
``func_name`` and that function's arguments, the rest null), ``dataset``, ``constraint_type``, ``constraint``. Each
row's constraint is mapped onto the IFEval checker that verifies the same instruction (:data:`RLVR_TO_IFEVAL`:
23 of open-instruct's 25 ``func_name`` s, reaching 23 of IFEval's 25 instruction ids; the data set lists 24
constraint kinds and its ground truth has no ``language`` field, so presumably all but response language occur, 22
of them mapped), so training and evaluation reward the same rules. Rows we cannot verify that way are skipped and counted, by ``func_name`` or
reason, in :attr:`HubIFEvalDomain.skipped`:

- ``verify_paragraph_count``: its prompt asks for paragraphs divided by ``* * *``, IFEval's checker counts ``***``;
- ``validate_choice``: its prompt offers free options (``yes/no/maybe``, ``a), b), c), d)``), IFEval's checker
  accepts only "My answer is yes./no./maybe.";
- ``validate_response_language`` when the row has no ``language`` argument (RLVR-IFeval's ground truth has none);
- any row whose arguments fail validation, or whose ``messages`` is not a single user turn.

RLVR-IFeval asks for counts with ``at most``, ``around`` and exact ``N``; the checkers accept those relations as an
extension (see :mod:`opdgrpo.verifiers.ifeval`). ``validate_repeat_prompt``'s ground truth is the whole user message,
instruction sentence included, while the instruction says "the request you need to repeat does not include this
sentence"; we drop that sentence (the row's ``constraint`` text) from the text to repeat, as the prompt asks.

Reward: IFEval's prompt-level accuracy of the response after the thinking block (none, scoring 0, when the
completion is cut off inside it), strict by default
(``reward: strict|loose``). :meth:`HubIFEvalDomain.extra_metrics` gives all four IFEval accuracies.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Mapping, Sequence

from ..verifiers import THINK_END, answer_after_thinking, ifeval
from .base import Task
from .hub import HubDomain

IFEVAL_COLUMNS = ("key", "prompt", "instruction_id_list", "kwargs")
RLVR_COLUMNS = ("messages", "ground_truth")
REWARDS = ("strict", "loose")

# RLVR-IFeval func_name -> (IFEval instruction id, {checker argument: ground-truth key, or a fixed value in a tuple}).
RLVR_TO_IFEVAL: dict[str, tuple[str, Mapping[str, Any]]] = {
    "verify_keywords": ("keywords:existence", {"keywords": "keyword_list"}),
    "verify_keyword_frequency": ("keywords:frequency", {"keyword": "word", "frequency": "N", "relation": ("exactly",)}),
    "validate_forbidden_words": ("keywords:forbidden_words", {"forbidden_words": "forbidden_words"}),
    "verify_letter_frequency": ("keywords:letter_frequency", {"letter": "letter", "let_frequency": "N",
                                                              "let_relation": ("exactly",)}),
    "validate_response_language": ("language:response_language", {"language": "language"}),
    "validate_word_constraint": ("length_constraints:number_words", {"num_words": "N", "relation": "quantifier"}),
    "verify_sentence_constraint": ("length_constraints:number_sentences", {"num_sentences": "N",
                                                                           "relation": "quantifier"}),
    "validate_paragraphs": ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": "N", "nth_paragraph": "i",
                                                                            "first_word": "first_word"}),
    "verify_postscript": ("detectable_content:postscript", {"postscript_marker": "postscript_marker"}),
    "validate_placeholders": ("detectable_content:number_placeholders", {"num_placeholders": "N"}),
    "verify_bullet_points": ("detectable_format:number_bullet_lists", {"num_bullets": "N"}),
    "validate_title": ("detectable_format:title", {}),
    "validate_highlighted_sections": ("detectable_format:number_highlighted_sections", {"num_highlights": "N"}),
    "validate_sections": ("detectable_format:multiple_sections", {"section_spliter": "section_splitter",
                                                                  "num_sections": "N"}),
    "validate_json_format": ("detectable_format:json_format", {}),
    "validate_repeat_prompt": ("combination:repeat_prompt", {"prompt_to_repeat": "original_prompt"}),
    "validate_two_responses": ("combination:two_responses", {}),
    "validate_uppercase": ("change_case:english_capital", {}),
    "validate_lowercase": ("change_case:english_lowercase", {}),
    "validate_frequency_capital_words": ("change_case:capital_word_frequency", {"capital_frequency": "N",
                                                                                "capital_relation": "quantifier"}),
    "validate_end": ("startend:end_checker", {"end_phrase": "end_phrase"}),
    "validate_quotation": ("startend:quotation", {}),
    "validate_no_commas": ("punctuation:no_comma", {}),
}
RLVR_UNVERIFIED = {
    "verify_paragraph_count": "paragraphs divided by '* * *', not IFEval's '***'",
    "validate_choice": "free answer options, not IFEval's fixed 'My answer is yes./no./maybe.'",
}


def response_text(completion: str) -> str:
    """What the checkers read: the text after the thinking block, without the whitespace the chat template puts
    after ``</think>``; a completion without a thinking block is scored as written (as IFEval does). A completion cut
    off inside its thinking block has no response: the empty text, which follows no instruction (so it scores 0, as
    in the math, code and multiple-choice domains, instead of having its reasoning checked as the response)."""
    answer = answer_after_thinking(completion)
    if answer is None:
        return ""
    return answer.lstrip() if THINK_END in completion else answer


def rlvr_instruction(ground_truth: Any, constraint: str | None = None) -> tuple[str, dict[str, Any]] | str:
    """One RLVR-IFeval ground truth as ``(IFEval id, validated kwargs)``, or the reason it cannot be verified."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError:
            return "ground_truth is not JSON"
    if not isinstance(ground_truth, Mapping):
        return "ground_truth is not a JSON object"
    func = ground_truth.get("func_name")
    if func in RLVR_UNVERIFIED:
        return f"{func}: {RLVR_UNVERIFIED[func]}"
    if func not in RLVR_TO_IFEVAL:
        return f"unknown func_name {func!r}"
    instruction_id, fields = RLVR_TO_IFEVAL[func]
    kwargs = {arg: src[0] if isinstance(src, tuple) else ground_truth.get(src) for arg, src in fields.items()}
    if instruction_id == "combination:repeat_prompt" and isinstance(kwargs["prompt_to_repeat"], str) and constraint:
        kwargs["prompt_to_repeat"] = kwargs["prompt_to_repeat"].replace(constraint.strip(), "").strip()
    try:
        return instruction_id, ifeval.validate(instruction_id, kwargs)
    except ValueError as err:
        return f"{func}: {err}"


class HubIFEvalDomain(HubDomain):
    """IFEval-style instruction following over hub data. Config keys (``conf/domain/paper_ifeval.yaml``): those of
    :class:`~opdgrpo.domains.hub.HubDomain`, plus ``reward: strict|loose`` (IFEval prompt-level accuracy used as
    the RL reward). ``train`` rows have RLVR-IFeval's schema, ``heldout`` rows google/IFEval's. No next-question
    stop strings (:attr:`~opdgrpo.domains.hub.HubDomain.stop_strings`): the prompts are free-form requests with no
    header a next one would repeat, and lm-eval-harness's ifeval stops at EOS only."""

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
        self.reward = str(cfg.get("reward") or "strict")
        if self.reward not in REWARDS:
            raise ValueError(f"config key `domains.{self.name}.reward` must be one of {list(REWARDS)}, "
                             f"got {cfg.get('reward')!r}")
        self.skipped: Counter[str] = Counter()  # training rows left out, by reason

    def required_columns(self, role: str) -> Sequence[str]:
        return IFEVAL_COLUMNS if role == "heldout" else RLVR_COLUMNS

    def to_task(self, row: Mapping[str, Any], where: str) -> Task | None:
        if "instruction_id_list" in row:
            return self._ifeval_task(row, where)
        return self._rlvr_task(row)

    def _ifeval_task(self, row: Mapping[str, Any], where: str) -> Task:
        ids, kwargs_list = list(row["instruction_id_list"] or []), list(row["kwargs"] or [])
        if not ids or len(ids) != len(kwargs_list):
            raise ValueError(f"config key `{where}.source`: row key {row.get('key')!r} has {len(ids)} instruction ids "
                             f"and {len(kwargs_list)} kwargs entries; they must pair up one to one")
        try:
            kwargs = tuple(ifeval.validate(i, kw) for i, kw in zip(ids, kwargs_list))
        except ValueError as err:
            raise ValueError(f"config key `{where}.source`: row key {row.get('key')!r}: {err}") from None
        answer = {"instruction_id_list": tuple(ids), "kwargs": kwargs, "prompt": row["prompt"]}
        return Task(self.name, self.prompt(row["prompt"]), answer, {"key": row.get("key")})

    def _rlvr_task(self, row: Mapping[str, Any]) -> Task | None:
        messages = row.get("messages") or []
        if len(messages) != 1 or messages[0].get("role") != "user" or not messages[0].get("content"):
            self.skipped["messages is not one user turn"] += 1
            return None
        mapped = rlvr_instruction(row["ground_truth"], row.get("constraint"))
        if isinstance(mapped, str):
            self.skipped[mapped.split(":")[0]] += 1
            return None
        instruction_id, kwargs = mapped
        prompt = messages[0]["content"]
        answer = {"instruction_id_list": (instruction_id,), "kwargs": (kwargs,), "prompt": prompt}
        return Task(self.name, self.prompt(prompt), answer, {"constraint_type": row.get("constraint_type")})

    # -- scoring ----------------------------------------------------------------------------------
    def _check(self, task: Task, completion: str, loose: bool) -> dict[str, Any]:
        a = task.answer
        return ifeval.check(a["instruction_id_list"], a["kwargs"], a["prompt"], response_text(completion), loose=loose)

    def score(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        loose = self.reward == "loose"
        return [float(self._check(t, c, loose)[f"prompt_{self.reward}"])
                for t, c in zip(tasks, completions, strict=True)]

    def extra_metrics(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float]:
        """IFEval's four accuracies: ``prompt_strict``, ``prompt_loose``, ``instruction_strict``,
        ``instruction_loose`` (each sampled completion counts as one response)."""
        return ifeval.aggregate([self._check(t, c, True) for t, c in zip(tasks, completions, strict=True)])

    def constraint_rates(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float]:
        """Strict pass rate per instruction id over the responses whose prompt carries it (IFEval's per-instruction
        table); the evaluation logs it when a domain has it."""
        passed: dict[str, list[bool]] = {}
        for task, completion in zip(tasks, completions, strict=True):
            flags = self._check(task, completion, False)["strict"]
            for instruction_id, ok in zip(task.answer["instruction_id_list"], flags):
                passed.setdefault(instruction_id, []).append(ok)
        return {i: sum(oks) / len(oks) for i, oks in sorted(passed.items())}
