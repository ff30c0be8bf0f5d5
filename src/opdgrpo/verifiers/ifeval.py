"""IFEval's 25 instruction checkers, strict and loose, without any runtime download.

Semantics follow Google's ``instruction_following_eval`` (``instructions.py``, ``instructions_registry.py``,
``evaluation_lib.py``; the same code ships in lm-evaluation-harness ``lm_eval/tasks/ifeval``). This is our own
implementation of those rules, written so that a paper-scale run never touches the network:

- words are counted with ``nltk.tokenize.RegexpTokenizer(r"\\w+")``, exactly as the official code does;
- sentences: the official code loads NLTK's *pretrained* English Punkt model (``tokenizers/punkt/english.pickle``,
  a download). We use an *untrained* :class:`~nltk.tokenize.punkt.PunktSentenceTokenizer` given two fixed lists
  that stand in for what the pretrained model learned from its corpus: common English abbreviations
  (``ABBREVIATIONS``, with the sixteen single letters the pretrained model holds as abbreviations,
  ``INITIAL_ABBREVIATIONS``) and common English words (``LOWERCASE_WORDS``), marked as seen in lower case. Both
  split on ``.``, ``?`` and ``!`` the same way, keep decimals (``3.14``) and ellipses inside a sentence, and do not
  split after ``Dr.`` or ``e.g.``. After an *initial* (one letter and a period) both follow Punkt's rule: a new
  sentence starts when the next word is capitalised and is a word known in lower case (``plan B. The rest``), not
  before a lower-case word or a name (``J. Quillfeather``), and never after one of the abbreviation letters
  (``vitamin C. It helps.`` is one sentence to the pretrained model too). They can differ on an abbreviation the
  pretrained model learned and our list lacks (ours then counts one sentence more), on an initial followed by a
  capitalised word the pretrained model knows in lower case and our word list lacks (ours then counts one
  sentence fewer), and on abbreviations followed by a frequent sentence starter. Only
  ``length_constraints:number_sentences`` and ``change_case:capital_word_frequency`` (whose ``word_tokenize``
  splits sentences first) see the difference;
- ``nltk.word_tokenize`` (needs Punkt too) is rebuilt as our sentence split followed by NLTK's Treebank-style
  :class:`~nltk.tokenize.NLTKWordTokenizer` on each sentence, which is what ``word_tokenize`` does;
- ``langdetect`` is seeded (``DetectorFactory.seed = 0``) so language checks are deterministic; as in the official
  code, text whose language cannot be detected counts as following the instruction.

Where the official code would draw a random value for a missing or invalid argument (e.g. no ``num_words``), we
raise a :class:`ValueError` naming the instruction and the argument instead: a benchmark must not score against a
random target. User-given strings (keywords, markers, section splitters) are matched literally (``re.escape``)
where the official code builds a regular expression from them unescaped; the two agree on every plain-word value.

Relations: IFEval uses ``less than`` and ``at least``. Training sets in the RLVR-IFeval style also ask for ``at
most``, ``around`` and an exact count, so the counting checkers accept ``at most`` (<=), ``exactly`` (==) and
``around`` (within ``max(1, round(N / 10))``) as an extension; google/IFEval never uses them.

Strict: the response as written (an empty or blank response follows nothing). Loose: an instruction is followed
when any of eight variants follows it: the response, with its first line removed, its last line removed, both, and
each of those four with every ``*`` removed (an upper bound that forgives a preamble, a sign-off and markdown).
"""

from __future__ import annotations

import functools
import json
import numbers
import re
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Sequence

# -- relations -------------------------------------------------------------------------------------
OFFICIAL_RELATIONS = ("less than", "at least")
RELATIONS = OFFICIAL_RELATIONS + ("at most", "exactly", "around")

# Phrases of IFEval's constrained-response instruction, and its postscript markers with their own patterns.
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "inc", "ltd",
                           "corp", "u.s", "u.k", "approx", "fig"})
# The single letters NLTK's pretrained English Punkt model holds as abbreviations (its punkt_tab/english/
# abbrev_types.txt): no sentence ends after "C." or "m."; after the other ten letters ("plan B.", "World War I.")
# one may.
INITIAL_ABBREVIATIONS = frozenset("cdefghklmnprstvw")
# Words that start sentences and that the pretrained model has seen in lower case: after an initial, a capitalised
# one of these begins a new sentence. Names and other words only ever capitalised are left out on purpose.
LOWERCASE_WORDS = frozenset("""
a about above according across actually additionally after afterwards again against all allow almost along
already also although always among an and another any anyone anything are as at back based be because been
before being below besides best better between both but by can cannot certainly check choose clearly come
consider could currently despite did do does doing done during each either else even eventually every
everyone everything except far few finally first five following for four from further
furthermore generally get give go good great had has have having he hence her here hers herself high him
himself his how however if importantly in including indeed instead into is it its itself just keep last
later less let like likely look low make many may maybe meanwhile might more moreover most much must my
myself near neither never nevertheless new next nine no none nor not nothing now of often on once one only
or other others otherwise our ours ourselves out over overall perhaps please plus possibly rather really
remember right second see seven several she should similarly since six so some someone something sometimes
soon still such sure take than thank thanks that the their theirs them themselves then there therefore these
they third this those though three through thus to today together too try two under unless unlike until up
upon us use usually very was we well were what whatever when whenever where whereas wherever whether which
while who whoever whom whose why will with within without would yes yet you your yours yourself
""".split())


def compare(count: int, relation: str, target: int) -> bool:
    """``count <relation> target``; ``relation`` is one of :data:`RELATIONS` (validated before)."""
    if relation == "less than":
        return count < target
    if relation == "at least":
        return count >= target
    if relation == "at most":
        return count <= target
    if relation == "exactly":
        return count == target
    return abs(count - target) <= max(1, round(target / 10))  # around


# -- tokenisation without downloaded data ---------------------------------------------------------
@functools.cache
def _sentence_splitter():
    from nltk.tokenize.punkt import _ORTHO_BEG_UC, _ORTHO_MID_LC, _ORTHO_MID_UC, PunktParameters, PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(ABBREVIATIONS) | set(INITIAL_ABBREVIATIONS)
    # Seen in lower case mid-sentence, and capitalised both at a sentence start and inside one (as common words
    # are in a corpus with headlines). Punkt's initial rule (4.3) then keeps the sentence break before such a
    # word; its abbreviation rule (4.2) still finds no evidence of a sentence start, so "Dr. The" is unchanged.
    for word in LOWERCASE_WORDS:
        params.add_ortho_context(word, _ORTHO_MID_LC | _ORTHO_MID_UC | _ORTHO_BEG_UC)
    return PunktSentenceTokenizer(params)


@functools.cache
def _word_tokenizers():
    from nltk.tokenize import NLTKWordTokenizer, RegexpTokenizer

    return RegexpTokenizer(r"\w+"), NLTKWordTokenizer()


def split_sentences(text: str) -> list[str]:
    return _sentence_splitter().tokenize(text)


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


def count_words(text: str) -> int:
    """Runs of word characters, as IFEval counts words (``RegexpTokenizer(r"\\w+")``)."""
    return len(_word_tokenizers()[0].tokenize(text))


def word_tokens(text: str) -> list[str]:
    """``nltk.word_tokenize`` without Punkt data: our sentence split, then Treebank-style tokens per sentence."""
    treebank = _word_tokenizers()[1]
    return [tok for sentence in split_sentences(text) for tok in treebank.tokenize(sentence)]


@functools.cache
def _langdetect():
    import langdetect

    langdetect.DetectorFactory.seed = 0  # langdetect samples; a fixed seed makes every call deterministic
    return langdetect


def detected_language_is(text: str, language: str) -> bool:
    """Whether langdetect reads ``text`` as ``language``; undetectable text counts as a match (as in IFEval)."""
    detect = _langdetect()
    try:
        return detect.detect(text) == language
    except detect.LangDetectException:
        return True


# -- argument validation ---------------------------------------------------------------------------
def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return int(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value.strip()


def _keep(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _words(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"expected a list of strings, got {value!r}")
    words = tuple(_keep(v) for v in value)  # kept as given: the official checkers do not strip them
    if not words:
        raise ValueError("expected a non-empty list of strings, got []")
    return words


def _relation(value: Any) -> str:
    if value not in RELATIONS:
        raise ValueError(f"expected one of {list(RELATIONS)}, got {value!r}")
    return str(value)


def _letter(value: Any) -> str:
    if not isinstance(value, str) or len(value.strip()) != 1:
        raise ValueError(f"expected a single character, got {value!r}")
    return value.strip().lower()


# -- the checkers: (response, validated kwargs) -> bool --------------------------------------------
def _keywords_exist(text: str, a: Mapping[str, Any]) -> bool:
    return all(re.search(re.escape(k), text, flags=re.IGNORECASE) for k in a["keywords"])


def _keyword_frequency(text: str, a: Mapping[str, Any]) -> bool:
    count = len(re.findall(re.escape(a["keyword"]), text, flags=re.IGNORECASE))
    return compare(count, a["relation"], a["frequency"])


def _forbidden_words(text: str, a: Mapping[str, Any]) -> bool:
    return not any(re.search(r"\b" + re.escape(w) + r"\b", text, flags=re.IGNORECASE) for w in a["forbidden_words"])


def _letter_frequency(text: str, a: Mapping[str, Any]) -> bool:
    return compare(Counter(text.lower())[a["letter"]], a["let_relation"], a["let_frequency"])


def _response_language(text: str, a: Mapping[str, Any]) -> bool:
    return detected_language_is(text, a["language"])


def _number_sentences(text: str, a: Mapping[str, Any]) -> bool:
    return compare(count_sentences(text), a["relation"], a["num_sentences"])


def _number_paragraphs(text: str, a: Mapping[str, Any]) -> bool:
    # Paragraphs are separated by the markdown divider ***; an empty piece may only sit at either end.
    pieces = re.split(r"\s?\*\*\*\s?", text)
    count = len(pieces)
    for i, piece in enumerate(pieces):
        if not piece.strip():
            if i in (0, len(pieces) - 1):
                count -= 1
            else:
                return False
    return count == a["num_paragraphs"]


def _number_words(text: str, a: Mapping[str, Any]) -> bool:
    return compare(count_words(text), a["relation"], a["num_words"])


def _nth_paragraph_first_word(text: str, a: Mapping[str, Any]) -> bool:
    # Paragraphs are split on "\n\n"; blank ones are not counted, but the nth is looked up in the raw split.
    paragraphs = text.split("\n\n")
    count = sum(1 for p in paragraphs if p.strip())
    nth = a["nth_paragraph"]
    if nth > count:
        return False
    paragraph = paragraphs[nth - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    first = ""
    for ch in word:
        if ch in ".,?!'\"":
            break
        first += ch.lower()
    return count == a["num_paragraphs"] and first == a["first_word"]


def _number_placeholders(text: str, a: Mapping[str, Any]) -> bool:
    return len(re.findall(r"\[.*?\]", text)) >= a["num_placeholders"]


def _postscript(text: str, a: Mapping[str, Any]) -> bool:
    marker = a["postscript_marker"]
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
    return bool(re.findall(pattern, text.lower(), flags=re.MULTILINE))


def _number_bullet_lists(text: str, a: Mapping[str, Any]) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == a["num_bullets"]


def _constrained_response(text: str, a: Mapping[str, Any]) -> bool:
    stripped = text.strip()
    return any(option in stripped for option in CONSTRAINED_RESPONSES)


def _number_highlighted_sections(text: str, a: Mapping[str, Any]) -> bool:
    # *single* and **double** highlights both count, each only when it has non-blank content.
    singles = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    doubles = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h[2:-2].strip()]
    return len(singles) + len(doubles) >= a["num_highlights"]


def _multiple_sections(text: str, a: Mapping[str, Any]) -> bool:
    sections = re.split(r"\s?" + re.escape(a["section_spliter"]) + r"\s?\d+\s?", text)
    return len(sections) - 1 >= a["num_sections"]


def _json_format(text: str, a: Mapping[str, Any]) -> bool:
    value = text.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        value = value.removeprefix(fence)
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def _title(text: str, a: Mapping[str, Any]) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", text))


def _two_responses(text: str, a: Mapping[str, Any]) -> bool:
    pieces = text.split("******")
    kept = []
    for i, piece in enumerate(pieces):
        if piece.strip():
            kept.append(piece)
        elif i not in (0, len(pieces) - 1):
            return False
    return len(kept) == 2 and kept[0].strip() != kept[1].strip()


def _repeat_prompt(text: str, a: Mapping[str, Any]) -> bool:
    return text.strip().lower().startswith(a["prompt_to_repeat"].strip().lower())


def _end_checker(text: str, a: Mapping[str, Any]) -> bool:
    return text.strip().strip('"').lower().endswith(a["end_phrase"].strip().lower())


def _capital_word_frequency(text: str, a: Mapping[str, Any]) -> bool:
    capitals = sum(1 for w in word_tokens(text) if w.isupper())
    return compare(capitals, a["capital_relation"], a["capital_frequency"])


def _english_capital(text: str, a: Mapping[str, Any]) -> bool:
    return text.isupper() and detected_language_is(text, "en")


def _english_lowercase(text: str, a: Mapping[str, Any]) -> bool:
    return text.islower() and detected_language_is(text, "en")


def _no_comma(text: str, a: Mapping[str, Any]) -> bool:
    return "," not in text


def _quotation(text: str, a: Mapping[str, Any]) -> bool:
    value = text.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'


# id -> (checker, {kwarg: validator}); every listed kwarg is required.
_Spec = tuple[Callable[[str, Mapping[str, Any]], bool], Mapping[str, Callable[[Any], Any]]]
INSTRUCTIONS: dict[str, _Spec] = {
    "keywords:existence": (_keywords_exist, {"keywords": _words}),
    "keywords:frequency": (_keyword_frequency, {"keyword": _text, "frequency": _int, "relation": _relation}),
    "keywords:forbidden_words": (_forbidden_words, {"forbidden_words": _words}),
    "keywords:letter_frequency": (_letter_frequency, {"letter": _letter, "let_frequency": _int,
                                                      "let_relation": _relation}),
    "language:response_language": (_response_language, {"language": _text}),
    "length_constraints:number_sentences": (_number_sentences, {"num_sentences": _int, "relation": _relation}),
    "length_constraints:number_paragraphs": (_number_paragraphs, {"num_paragraphs": _int}),
    "length_constraints:number_words": (_number_words, {"num_words": _int, "relation": _relation}),
    "length_constraints:nth_paragraph_first_word": (_nth_paragraph_first_word, {
        "num_paragraphs": _int, "nth_paragraph": _int, "first_word": lambda v: _text(v).lower()}),
    "detectable_content:number_placeholders": (_number_placeholders, {"num_placeholders": _int}),
    "detectable_content:postscript": (_postscript, {"postscript_marker": _text}),
    "detectable_format:number_bullet_lists": (_number_bullet_lists, {"num_bullets": _int}),
    "detectable_format:constrained_response": (_constrained_response, {}),
    "detectable_format:number_highlighted_sections": (_number_highlighted_sections, {"num_highlights": _int}),
    "detectable_format:multiple_sections": (_multiple_sections, {"section_spliter": _text, "num_sections": _int}),
    "detectable_format:json_format": (_json_format, {}),
    "detectable_format:title": (_title, {}),
    "combination:two_responses": (_two_responses, {}),
    "combination:repeat_prompt": (_repeat_prompt, {"prompt_to_repeat": _keep}),
    "startend:end_checker": (_end_checker, {"end_phrase": _text}),
    "change_case:capital_word_frequency": (_capital_word_frequency, {"capital_frequency": _int,
                                                                     "capital_relation": _relation}),
    "change_case:english_capital": (_english_capital, {}),
    "change_case:english_lowercase": (_english_lowercase, {}),
    "punctuation:no_comma": (_no_comma, {}),
    "startend:quotation": (_quotation, {}),
}
INSTRUCTION_IDS = tuple(INSTRUCTIONS)


def validate(instruction_id: str, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The arguments one checker uses, checked and normalised; ``None`` values (the unused fields of the hub's
    kwargs struct) are dropped first. Raises ``ValueError`` naming the instruction and argument."""
    if instruction_id not in INSTRUCTIONS:
        raise ValueError(f"unknown IFEval instruction id {instruction_id!r}; known: {list(INSTRUCTION_IDS)}")
    given = {k: v for k, v in (kwargs or {}).items() if v is not None}
    out = {}
    for key, check in INSTRUCTIONS[instruction_id][1].items():
        if key not in given:
            raise ValueError(f"instruction {instruction_id!r} needs argument {key!r}; got {sorted(given)}")
        try:
            out[key] = check(given[key])
        except ValueError as err:
            raise ValueError(f"instruction {instruction_id!r}, argument {key!r}: {err}") from None
    nth_first = instruction_id == "length_constraints:nth_paragraph_first_word"
    if nth_first and not 1 <= out["nth_paragraph"] <= out["num_paragraphs"]:
        raise ValueError(f"instruction {instruction_id!r}: nth_paragraph must be in 1..num_paragraphs, got "
                         f"{out['nth_paragraph']} of {out['num_paragraphs']}")
    return out


def follows(instruction_id: str, kwargs: Mapping[str, Any] | None, response: str) -> bool:
    """Whether one response text follows one instruction (no strict/loose variants; blank text follows nothing)."""
    args = validate(instruction_id, kwargs)
    return bool(response.strip()) and INSTRUCTIONS[instruction_id][0](response, args)


def loose_variants(response: str) -> list[str]:
    """The eight texts loose scoring tries, in IFEval's order."""
    lines = response.split("\n")
    no_first = "\n".join(lines[1:]).strip()
    no_last = "\n".join(lines[:-1]).strip()
    no_both = "\n".join(lines[1:-1]).strip()
    return [response, response.replace("*", ""), no_first, no_last, no_both,
            no_first.replace("*", ""), no_last.replace("*", ""), no_both.replace("*", "")]


def check(instruction_ids: Sequence[str], kwargs_list: Sequence[Mapping[str, Any] | None], prompt: str,
          response: str, *, loose: bool = True) -> dict[str, Any]:
    """Per-instruction booleans for one response: ``{"strict": [...], "loose": [...], "prompt_strict": bool,
    "prompt_loose": bool}`` (the loose entries only when ``loose``). ``prompt`` is accepted for parity with the
    official evaluator, which passes it to instructions whose arguments name a prompt; none of the 25 does."""
    if len(instruction_ids) != len(kwargs_list):
        raise ValueError(f"{len(instruction_ids)} instruction ids but {len(kwargs_list)} kwargs entries")
    specs = [(INSTRUCTIONS[i][0], validate(i, kw)) for i, kw in zip(instruction_ids, kwargs_list)]
    strict = [bool(response.strip()) and fn(response, args) for fn, args in specs]
    out: dict[str, Any] = {"strict": strict, "prompt_strict": all(strict)}
    if loose:
        variants = [v for v in loose_variants(response) if v.strip()]
        out["loose"] = [ok or any(fn(v, args) for v in variants) for ok, (fn, args) in zip(strict, specs)]
        out["prompt_loose"] = all(out["loose"])
    return out


def aggregate(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """IFEval's four accuracies over :func:`check` results: prompt level (share of responses following all their
    instructions) and instruction level (share of all instructions followed), strict and loose."""
    if not results:
        raise ValueError("aggregate needs at least one result")
    out = {}
    for mode in ("strict", "loose"):
        flags = [r[mode] for r in results]
        total = sum(len(f) for f in flags)
        out[f"prompt_{mode}"] = sum(all(f) for f in flags) / len(flags)
        out[f"instruction_{mode}"] = sum(sum(f) for f in flags) / total if total else 0.0
    return out
