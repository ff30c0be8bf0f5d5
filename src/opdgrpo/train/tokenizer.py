"""The tiny world's tokenizer: a byte-pair vocabulary trained on the synthetic domains, saved in
Hugging Face format so every model loads it with ``AutoTokenizer.from_pretrained``.

Digits, whitespace and punctuation are always single tokens (as in Qwen's and Llama's tokenizers),
so a prompt's tokens never merge with its completion's and arithmetic stays digit by digit. Words
merge into whole tokens. The vocabulary is padded with reserved tokens up to ``vocab_size`` (hundreds)
so that the top-k truncation of OPD and the LM-head FLOPs are not trivially small.

On hub domains (the rehearsal profile: the paper's data sets as fixtures, random models) the corpus is the domains'
own prompts and answers, and ``tokenizer.chat`` adds Qwen3's chat tokens and a template with its thinking switch, so
the paper's chat formatting and stop token run unchanged on a tokenizer built here.
"""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any, Iterable, Mapping

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from opdgrpo.domains import build_domain
from opdgrpo.domains.hub import HubDomain

PAD, EOS, UNK = "<|pad|>", "<|endoftext|>", "<|unk|>"
#: Qwen3's chat turn delimiters, added by ``tokenizer.chat``.
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]
#: One user turn and the assistant's start, with Qwen3's thinking switch (an empty think block when it is off).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
_PIECES = r"\d|[A-Za-z_]+|\s|[^\sA-Za-z_\d]"


def corpus(domain_cfgs: Mapping[str, Mapping[str, Any]], samples_per_domain: int, seed: int) -> Iterable[str]:
    """Prompts and demonstrations in both styles, drawn from the pretraining distribution."""
    rng = random.Random(seed)
    for cfg in domain_cfgs.values():
        domain = build_domain(cfg)
        if isinstance(domain, HubDomain):   # no pretraining distribution: the data sets' own texts
            tasks = domain.training_pool() + [t for tasks in domain.heldout_sets().values() for t in tasks]
            for task in rng.sample(tasks, min(samples_per_domain, len(tasks))):
                yield task.prompt + " " + str(task.answer)
            continue
        for _ in range(samples_per_domain):
            task = domain.pretraining_task(rng)
            yield task.prompt + domain.demonstration(task, "brief")
            yield task.prompt + domain.demonstration(task, "thinking")


def build_tokenizer(domain_cfgs: Mapping[str, Mapping[str, Any]], vocab_size: int, samples_per_domain: int = 2000,
                    seed: int = 0, chat: bool = False) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_PIECES), behavior="isolated")
    tok.decoder = decoders.Fuse()
    alphabet = sorted(set(string.printable) - set("\x0b\x0c\r"))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[PAD, EOS, UNK], initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(corpus(domain_cfgs, samples_per_domain, seed), trainer=trainer)
    if chat:
        tok.add_special_tokens(CHAT_TOKENS)
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)


def load_tokenizer(path: Path):
    """The run's tokenizer (ours at tiny scale, the hub model's at paper scale)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer at {path} has no pad or eos token; rebuild it with `opdgrpo tokenizer`")
    return tokenizer
