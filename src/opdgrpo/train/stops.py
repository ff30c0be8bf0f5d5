"""Stop strings: where a base model's continuation ends before it writes its own next question.

A base (not post-trained) model given a problem often answers it and then goes on: a new question in the prompt's own
layout, and that question's answer. An answer reader that takes the last statement would then read the made-up
question's answer, and a trainer would train on it. Evaluation harnesses stop such models at the next question's
marker (lm-eval-harness's ``until`` lists, MMLU-Pro's ``stop=["Question:"]``); the hub domains name theirs
(:attr:`opdgrpo.domains.hub.HubDomain.stop_strings`), and ``train.stop_strings`` (per model:
``models.<m>.prompt_format.stop_strings``) says which models stop there: base models do, chat models end their turn
with a stop token already.

The rule, the same for both sampling engines (the project's sampler and vLLM):

- a row stops at the token that *completes* a stop string in its decoded text (special tokens skipped, as the
  completions are decoded for scoring); nothing after that token is generated. When several stop strings match, the
  one that completes first wins (vLLM's choice);
- the completion's *text* ends where that stop string starts (the stop text is excluded);
- the completion's *tokens* (``Rollouts.completions``, the loss mask, the response length) are those whose text starts
  before that point: a token that straddles it (``).\\n\\n`` before ``Question:``) is kept whole, since it carries the
  answer's last characters; the token that starts the stop string and every one after it are dropped. The row counts
  as finished (it ended, not truncated);
- the FLOP ledger counts what was computed: the dropped tokens up to the completing one were generated, so their
  decode steps stay in the ledger (and in ``tokens_computed``), as an EOS token's are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

#: Tokens decoded past a stop string's length when a row's tail is checked at each step: a token holds at least one
#: character except byte pieces of one multi-byte character, which this margin covers.
TAIL_MARGIN = 16


def earliest_stop(text: str, strings: Sequence[str]) -> tuple[int, int] | None:
    """(start, end) of the stop string in ``text`` that completes first (ties: the first listed), or None."""
    best: tuple[int, int] | None = None
    for s in strings:
        at = text.find(s)
        if at != -1 and (best is None or at + len(s) < best[1]):
            best = (at, at + len(s))
    return best


@dataclass(frozen=True)
class StopStrings:
    """Each row's stop strings (a row of a domain without any has an empty tuple) and the tokenizer that decodes."""

    tokenizer: object
    rows: tuple[tuple[str, ...], ...]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.tokenizer.batch_decode([list(i) for i in ids], skip_special_tokens=True)

    def tail(self, row: int) -> int:
        """Tokens to decode at the end of ``row`` so that a stop string completed by its last token is seen whole."""
        return max((len(s) for s in self.rows[row]), default=0) + TAIL_MARGIN

    def hits(self, rows: Sequence[int], generated: Sequence[Sequence[int]]) -> list[bool]:
        """Whether each of ``rows`` (their tokens so far in ``generated``) has just completed one of its stop strings.
        Checked after every token, so a match in the decoded tail is one its newest token completed."""
        check = [i for i, r in enumerate(rows) if self.rows[r]]
        out = [False] * len(rows)
        if not check:
            return out
        texts = self.decode([generated[i][-self.tail(rows[i]):] for i in check])
        for i, text in zip(check, texts):
            out[i] = earliest_stop(text, self.rows[rows[i]]) is not None
        return out

    def cut(self, row: int, ids: Sequence[int]) -> tuple[int, int] | None:
        """(tokens kept, characters of text kept) of a row whose decoded ``ids`` hold one of its stop strings, by the
        module's rule; None when none is there."""
        if not self.rows[row]:
            return None
        found = earliest_stop(self.decode([ids])[0], self.rows[row])
        if found is None:
            return None
        start = found[0]
        # The fewest tokens whose text reaches the stop string's start: the tokens that start before it.
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.decode([ids[:mid]])[0]) >= start:
                hi = mid
            else:
                lo = mid + 1
        return lo, start


def stop_strings_for(domains: Mapping[str, object], tasks: Sequence, enabled: bool, tokenizer) -> StopStrings | None:
    """The rows' stop strings (their domains' ``stop_strings``), or None when ``enabled`` is off or no row has any:
    then sampling is exactly what it was without stop strings."""
    if not enabled:
        return None
    rows = tuple(tuple(getattr(domains[t.domain], "stop_strings", ()) or ()) for t in tasks)
    return StopStrings(tokenizer, rows) if any(rows) else None
