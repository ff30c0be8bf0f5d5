"""Base models' stop strings: both engines cut a row at the same token, its text before the stop string, its loss
mask over the kept tokens, and the ledger counts what was computed; a hub choice completion that writes its own next
question is read up to its first answer."""

from pathlib import Path

import pytest
import torch
import yaml
from transformers import Qwen3Config, Qwen3ForCausalLM

from opdgrpo.domains.hub_choice import HubChoiceDomain
from opdgrpo.train.engines.vllm_engine import _rollouts
from opdgrpo.train.rollout import PromptFormat
from opdgrpo.train.sampling import sample
from opdgrpo.train.stops import StopStrings, earliest_stop, stop_strings_for

REPO = Path(__file__).resolve().parents[2]
PAD, EOS = 0, 1
LENGTHS = [3, 7, 5, 1, 4, 4, 6, 2]


def make_model() -> torch.nn.Module:
    """A random eager Qwen3, initialised wide enough that greedy ties cannot flip with the batch layout."""
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                         intermediate_size=96, vocab_size=200, tie_word_embeddings=False, pad_token_id=PAD,
                         eos_token_id=EOS, bos_token_id=EOS, initializer_range=0.1, attn_implementation="eager")
    return Qwen3ForCausalLM(config).eval()


def make_prompts(lengths: list[int], vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


class PieceTokenizer:
    """A stand-in tokenizer whose tokens decode to one or two characters (so a stop string can start mid-token);
    PAD and EOS are special (decoded to nothing, as ``skip_special_tokens`` does)."""

    @staticmethod
    def piece(i: int) -> str:
        return "" if i in (PAD, EOS) else chr(97 + i % 6) + ("\n" if i % 4 == 0 else "")

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(self.piece(int(i)) for i in row) for row in ids]


TOK = PieceTokenizer()


def text(ids) -> str:
    return TOK.batch_decode([ids])[0]


def expected_cut(ids: list[int], strings: tuple[str, ...]) -> tuple[int, int, int] | None:
    """(tokens generated up to the one completing the first stop string, tokens kept, text end), by brute force."""
    found = earliest_stop(text(ids), strings)
    if found is None:
        return None
    start, end = found
    generated = next(j for j in range(1, len(ids) + 1) if len(text(ids[:j])) >= end)
    kept = next(k for k in range(0, len(ids) + 1) if len(text(ids[:k])) >= start)
    return generated, kept, start


def test_own_sampler_and_vllm_rule_cut_at_the_same_token():
    model = make_model()
    prompts = make_prompts(LENGTHS, model.config.vocab_size)
    base = sample(model, prompts, max_new_tokens=14, eos_token_id=EOS, pad_token_id=PAD, temperature=0)
    # a stop string from inside row 0's own text (two characters that may span two tokens) for half of the rows
    stop = text(base.completions[0])[5:7]
    rows = tuple((stop,) if r % 2 == 0 else () for r in range(len(prompts)))
    strings = StopStrings(TOK, rows)
    cut = sample(model, prompts, max_new_tokens=14, eos_token_id=EOS, pad_token_id=PAD, temperature=0, stop_strings=strings)
    full = [base.completions[r] + ([EOS] if base.finished[r] else []) for r in range(len(prompts))]
    stopped = 0
    for r, ids in enumerate(full):
        want = expected_cut(base.completions[r], rows[r])
        if want is None:   # no stop string in its text: the row is what it was
            assert cut.completions[r] == base.completions[r] and cut.text_ends[r] is None
            assert torch.equal(cut.completion_mask[r, :len(ids)], base.completion_mask[r, :len(ids)])
            continue
        stopped += 1
        generated, kept, start = want
        assert cut.completions[r] == ids[:kept] and cut.text_ends[r] == start and bool(cut.finished[r])
        assert int(cut.completion_mask[r].sum()) == kept and cut.completion_mask[r, :kept].all()
        assert cut.sequences[r, cut.prompt_len + kept:].eq(PAD).all()   # nothing after the kept tokens is trained on
        assert stop not in text(cut.completions[r])[:start] and text(ids)[:start] == text(cut.completions[r])[:start]
        full[r] = ids[:generated]   # what the sampler generated: up to the token that completed the stop string
    assert stopped >= 2
    # the ledger: every prompt once, then one fed token per generated token but a row's last
    assert cut.tokens_computed == len(prompts) * cut.prompt_len + sum(len(ids) - 1 for ids in full)
    assert cut.flops < base.flops
    # vLLM returns the tokens up to the one completing the stop string; the engine's cut must give the same rollouts
    engine = _rollouts(model.config, prompts, [(ids, [0.0] * len(ids)) for ids in full], {EOS}, PAD, strings)
    assert engine.completions == cut.completions and engine.text_ends == cut.text_ends
    assert torch.equal(engine.finished, cut.finished)
    width = cut.completion_mask.shape[1]
    assert torch.equal(engine.completion_mask[:, :width], cut.completion_mask)
    assert not engine.completion_mask[:, width:].any()


def test_a_stop_string_at_the_start_keeps_nothing():
    strings = StopStrings(TOK, (("ab",),))
    ids = [6, 7, 8]   # "a", "b", "c\n"
    assert strings.cut(0, ids) == (0, 0)
    assert strings.hits([0], [ids[:1]]) == [False] and strings.hits([0], [ids[:2]]) == [True]


def test_a_straddling_token_is_kept_whole():
    strings = StopStrings(TOK, (("\nQ",),))
    ids = [8, 10]   # "c\n" then "e": the stop string "\nQ" never completes; "\ne" would start inside token 8
    assert strings.cut(0, ids) is None
    assert StopStrings(TOK, (("\ne",),)).cut(0, ids) == (1, 1)   # token 8 carries "c": kept; the text ends before "\n"


def test_off_for_chat_models_and_the_tiny_world():
    choice = HubChoiceDomain(yaml.safe_load((REPO / "conf" / "domain" / "paper_knowledge.yaml").read_text()))
    tasks = [type("T", (), {"domain": "knowledge"})()]
    assert stop_strings_for({"knowledge": choice}, tasks, False, TOK) is None
    assert stop_strings_for({"knowledge": choice}, tasks, True, TOK).rows == (choice.stop_strings,)
    tiny = type("Tiny", (), {})()   # a domain without stop strings
    assert stop_strings_for({"knowledge": tiny}, tasks, True, TOK) is None
    assert PromptFormat.from_config({}).stop_strings is False
    assert PromptFormat.from_config({"stop_strings": True}).stop_strings is True


class CharTokenizer:
    """One token per character (ids are code points): decoding is exact, for a fixture response."""

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(map(chr, row)) for row in ids]


BASE_RESPONSE = (
    "Photosynthesis stores light energy as chemical energy in glucose. The answer is (B).\n\n"
    "Which gas do plants release during photosynthesis?\n\nOptions:\nA. Nitrogen\nB. Carbon dioxide\nC. Oxygen\n"
    "D. Helium\n\nThink step by step, then end your response with \"The answer is (X)\", where X is the letter (A-D) "
    "of the correct option.\nPlants split water and release oxygen. The answer is (C)."
)


@pytest.mark.parametrize("response,gold", [
    (BASE_RESPONSE, "B"),
    (BASE_RESPONSE.split("\n\nWhich gas")[0] + "\n\nQuestion: Which gas do plants release?\nAnswer: (C)", "B"),
])
def test_choice_reads_the_first_answer_of_a_base_continuation(response, gold):
    domain = HubChoiceDomain(yaml.safe_load((REPO / "conf" / "domain" / "paper_knowledge.yaml").read_text()))
    task = type("T", (), {"answer": gold, "meta": {"n_options": 4}})()
    strings = StopStrings(CharTokenizer(), (domain.stop_strings,))
    ids = [ord(c) for c in response]
    kept, end = strings.cut(0, ids)
    read = CharTokenizer().batch_decode([ids[:kept]])[0][:end]
    # the next question's text may stay (it ends before its options' instruction); its answer never does
    assert "The answer is (B)." in read and "(C)" not in read.split("The answer is (B).")[1]
    assert domain.score([task], [read]) == [1.0]
