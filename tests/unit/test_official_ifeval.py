"""The IFEval checkers against Google's official ones, case by case.

Sources, all in google-research/google-research ``instruction_following_eval/``:

* ``instructions_test.py``: the official checkers' own unit tests (one group per instruction id below mirrors
  the group there, with our own texts exercising the same rule);
* ``instructions_util_test.py``: word and sentence counting;
* ``instructions.py``: the ``check_following`` rules the verdicts follow;
* ``evaluation_lib.py``: strict (``response.strip() and check_following(response)``) and loose (any of eight
  variants: the response, without its first line, its last line, both, and each with every ``*`` removed);
* ``instructions_util.count_sentences``: NLTK's pretrained English Punkt model (``tokenizers/punkt``; the same
  parameters ship as ``punkt_tab/english/``: ``abbrev_types.txt``, ``ortho_context.tab``). After a single letter
  and a period (an *initial*) it starts a new sentence when the next word is capitalised and is a word its corpus
  has in lower case (``Take vitamin A. It helps.``: two sentences; nltk ``punkt.py``, ``_second_pass_annotation``,
  rule 4.3), not when the next word is lower case or only ever capitalised, like a surname (``J. Quillfeather``).
  Sixteen letters (c d e f g h k l m n p r s t v w) are abbreviations in that model (``abbrev_types.txt``), and
  after them no sentence ever ends (``Take vitamin C. It helps.``: one sentence).

Each case carries the official verdict; ``departs`` marks where ours deliberately differs, as documented in
:mod:`opdgrpo.verifiers.ifeval`: keywords and markers are matched literally, where the official checkers use them
as regular expressions (so ``e.g.`` is found in "eggs" there). Elsewhere (tests/unit/test_hub_ifeval.py): a missing
argument raises instead of drawing a random target, and the relations "at most", "exactly" and "around" extend
IFEval's two.
"""

from __future__ import annotations

import pytest

from opdgrpo.verifiers import ifeval


def case(instruction_id: str, kwargs: dict, response: str, official: bool):
    return pytest.param(instruction_id, kwargs, response, official, official,
                        id=f"{instruction_id.split(':')[1]}:{response[:30]!r}")


def departs(instruction_id: str, kwargs: dict, response: str, official: bool, ours: bool, why: str):
    return pytest.param(instruction_id, kwargs, response, official, ours,
                        id=f"departs({why}):{instruction_id.split(':')[1]}:{response[:30]!r}")


LT, AL = "less than", "at least"

STRICT = [
    # -- length_constraints:number_sentences (instructions_test.py test_number_sentences) ---------------------
    case("length_constraints:number_sentences", {"num_sentences": 4, "relation": LT}, "ab,c. de,f! gh/i. j{k}l?", False),
    case("length_constraints:number_sentences", {"num_sentences": 5, "relation": LT}, "abcd. ef,g! hijk. l(m)n?", True),
    case("length_constraints:number_sentences", {"num_sentences": 4, "relation": AL}, "abcd. ef,g! hi|j. k&l m?", True),
    case("length_constraints:number_sentences", {"num_sentences": 5, "relation": AL}, "ab-c. de,f! gh}i. j,kl?", False),
    # an initial before a capitalised common word ends a sentence (pretrained Punkt), except after its 16
    # abbreviation letters
    case("length_constraints:number_sentences", {"num_sentences": 2, "relation": AL}, "Take vitamin A. It helps.", True),
    case("length_constraints:number_sentences", {"num_sentences": 2, "relation": LT}, "Take vitamin A. It helps.", False),
    case("length_constraints:number_sentences", {"num_sentences": 2, "relation": AL}, "We chose plan B. The rest failed.",
         True),
    case("length_constraints:number_sentences", {"num_sentences": 2, "relation": LT}, "Take vitamin A. it helps.", True),
    case("length_constraints:number_sentences", {"num_sentences": 2, "relation": LT}, "Take vitamin C. It helps.", True),
    # -- keywords:existence (test_keyword_checker: every keyword, case-insensitive, as a substring) --------------
    case("keywords:existence", {"keywords": ["river", "Mona Lisa"]}, "The river runs past a mona lisa poster.", True),
    case("keywords:existence", {"keywords": ["romantic", "river"]}, "A romance by the riverside.", False),
    case("keywords:existence", {"keywords": ["river"]}, "Riverside walks.", True),
    departs("keywords:existence", {"keywords": ["e.g."]}, "Fruits, eggs and more.", True, False, why="literal keywords"),
    # -- keywords:frequency (test_keyword_frequency_checker: case-insensitive, substrings count) -----------------
    case("keywords:frequency", {"keyword": "tea", "frequency": 4, "relation": LT}, "tea, Tea, TEA", True),
    case("keywords:frequency", {"keyword": "tea", "frequency": 3, "relation": AL}, "tea, Tea, TEA", True),
    case("keywords:frequency", {"keyword": "TEA", "frequency": 4, "relation": AL}, "*tea\n*Tea\n*TEA", False),
    case("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": AL}, "The cat sat on a catalog.", True),
    # -- keywords:forbidden_words (test_forbidden_words: whole words only, case-insensitive) ---------------------
    case("keywords:forbidden_words", {"forbidden_words": ["POWER", "HOUSE"]}, "They gained power quickly.", False),
    case("keywords:forbidden_words", {"forbidden_words": ["GENE", "TRANSFORM"]}, "Generative transformer models.",
         True),
    case("keywords:forbidden_words", {"forbidden_words": ["text"]}, "Text generation is common.", False),
    # -- keywords:letter_frequency (test_letter_frequency_checker: the lowercased text's characters) -------------
    case("keywords:letter_frequency", {"letter": "t", "let_frequency": 4, "let_relation": AL}, "Take the T. Two T's.",
         True),
    case("keywords:letter_frequency", {"letter": "a", "let_frequency": 4, "let_relation": LT}, "qwerty!!aA", True),
    case("keywords:letter_frequency", {"letter": "p", "let_frequency": 4, "let_relation": AL}, "qwerty!!aA", False),
    case("keywords:letter_frequency", {"letter": "#", "let_frequency": 4, "let_relation": AL}, "#a #b #c #d", True),
    case("keywords:letter_frequency", {"letter": "#", "let_frequency": 4, "let_relation": AL}, "#a #b #c", False),
    # -- language:response_language (test_response_language, test_response_multilanguage; langdetect, seed 0) ---
    case("language:response_language", {"language": "en"}, "This reply is written in plain English words.", True),
    case("language:response_language", {"language": "es"}, "Hoy comemos en el restaurante de la esquina.", True),
    case("language:response_language", {"language": "en"}, "Tomorrow we visit the Prado", True),
    case("language:response_language", {"language": "fr"}, "This reply is written in plain English words.", False),
    # -- length_constraints:number_paragraphs (test_paragraph_checker: *** dividers) -----------------------------
    case("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "first\n***\nsecond\n***\nthird", True),
    case("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "   ***\nfirst\n ***\nsecond\n***\nthird", True),
    case("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "first\n***\nsecond\n***\nthird\n  ***", True),
    case("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "first\n***\nsecond\n***\n***", False),
    # -- length_constraints:number_words (test_num_words_checker, instructions_util_test test_word_count) -------
    case("length_constraints:number_words", {"num_words": 8, "relation": LT}, "h3llo w0rld th1s is 4 t3st.", True),
    case("length_constraints:number_words", {"num_words": 8, "relation": AL}, "L4RGE-ish w0rds, & m0re d4t4 h3re; fine",
         False),
    case("length_constraints:number_words", {"num_words": 4, "relation": AL}, "word1, word2, word3, word4.", True),
    case("length_constraints:number_words", {"num_words": 4, "relation": AL}, "Dash-joined counts twice.", True),
    # -- length_constraints:nth_paragraph_first_word (test_paragraph_first_word) --------------------------------
    case("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "I"},
         "intro\n\nI second part\n\noutro", True),
    case("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "I"},
         "intro\n\nI second part", False),
    case("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "I"},
         "intro\n\nfailing second\n\noutro", False),
    case("length_constraints:nth_paragraph_first_word",
         {"num_paragraphs": 5, "nth_paragraph": 3, "first_word": "really"}, 'a\n\nb\n\n"Really?! yes"\n\nd\n\ne', True),
    case("length_constraints:nth_paragraph_first_word",
         {"num_paragraphs": 5, "nth_paragraph": 3, "first_word": "really"}, "a\n\nb\n\nRea!lly yes\n\nd\n\ne", False),
    # -- detectable_content:number_placeholders (test_number_placeholders) --------------------------------------
    case("detectable_content:number_placeholders", {"num_placeholders": 3}, "[Name]\n[Email]\n[Phone]\nUse it.", True),
    case("detectable_content:number_placeholders", {"num_placeholders": 4}, "My [adj] [noun] is [adj].", False),
    # -- detectable_content:postscript (test_postscript_checker) ------------------------------------------------
    case("detectable_content:postscript", {"postscript_marker": "P.S."}, "Main text.\n\nP.S. Call me.", True),
    case("detectable_content:postscript", {"postscript_marker": "PS:"}, "Main text.\n\nP.S. Call me.", False),
    case("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Body.\n\nP.P.S. One more thing.", True),
    case("detectable_content:postscript", {"postscript_marker": "P.S."}, "Body text (same line) P.S. a joke!", True),
    case("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "body\np.p.s what if lowercase?", True),
    case("detectable_content:postscript", {"postscript_marker": "P.S."}, "Body.\nP. S. Spaces are fine.", True),
    # -- detectable_format:number_bullet_lists (test_number_bullet_lists) ---------------------------------------
    case("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Intro:\n* one\n*(no space)two\n* three\nend",
         True),
    case("detectable_format:number_bullet_lists", {"num_bullets": 2},
         "Inline * star, *, ignored:\n  * one\n  * two\n  . dot", True),
    case("detectable_format:number_bullet_lists", {"num_bullets": 3}, "- one\n- two\n-three", True),
    case("detectable_format:number_bullet_lists", {"num_bullets": 1}, "p1\n***\np2\n***\np3\n* single", True),
    case("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* a\n* b\n- c", False),
    # -- detectable_format:constrained_response (test_constrained_response) -------------------------------------
    case("detectable_format:constrained_response", {}, "\n My answer is yes.\n", True),
    case("detectable_format:constrained_response", {}, "My answer is no.   ", True),
    case("detectable_format:constrained_response", {}, "My answer is maybe. I am still thinking it over.", True),
    case("detectable_format:constrained_response", {}, "my answer is yes.", False),
    # -- detectable_format:number_highlighted_sections (test_number_highlights) ---------------------------------
    case("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "Type *hi*, or bold it: **hi** ",
         True),
    case("detectable_format:number_highlighted_sections", {"num_highlights": 2},
         "Methods:\n*unclosed one\n*closed two*\n*unclosed three\nDone.", False),
    case("detectable_format:number_highlighted_sections", {"num_highlights": 4},
         "two *single one* and *single two*\n**double one** and **double two.**", True),
    # -- detectable_format:multiple_sections (test_section_checker) ---------------------------------------------
    case("detectable_format:multiple_sections", {"section_spliter": "Part", "num_sections": 3},
         'Mark each with "Part X":\nPart 1\n[content]\nPart 2\n[content]', False),
    case("detectable_format:multiple_sections", {"section_spliter": "PART", "num_sections": 2},
         "PART 1\nfirst\nPART 2\nsecond", True),
    # -- detectable_format:json_format (JsonFormat.check_following: optional ``` fences) ------------------------
    case("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True),
    case("detectable_format:json_format", {}, "```JSON\n[1, 2]\n```", True),
    case("detectable_format:json_format", {}, "{a: 1}", False),
    # -- detectable_format:title (test_title_checker) -----------------------------------------------------------
    case("detectable_format:title", {}, "<<Song of Tea>>\nLa la.", True),
    case("detectable_format:title", {}, "Is a title at the end fine?\n<<The End>>", True),
    case("detectable_format:title", {}, "<< >>\nNo title here.", False),
    case("detectable_format:title", {}, "<<Not a title.\nA paragraph.>>", False),
    # -- combination:two_responses (test_two_responses) ---------------------------------------------------------
    case("combination:two_responses", {}, "Reply one.\n******\nReply two.", True),
    case("combination:two_responses", {}, "Same reply.\n******\nSame reply.", False),
    case("combination:two_responses", {}, "a\n******\nb\n******\nc", False),
    case("combination:two_responses", {}, "******\nOne.\n******\n******\nTwo.\n******", False),
    case("combination:two_responses", {}, "******\nOne\n******\nTwo\n******", True),
    # -- combination:repeat_prompt (test_prompt_repeat_answer) --------------------------------------------------
    case("combination:repeat_prompt", {"prompt_to_repeat": "Write a haiku."}, "Write a haiku. Here it is: moon.",
         True),
    case("combination:repeat_prompt", {"prompt_to_repeat": "Write a haiku."}, "Hi. Write a haiku.", False),
    # -- startend:end_checker (test_end_checker) ----------------------------------------------------------------
    case("startend:end_checker", {"end_phrase": "Any more questions?"}, "The result is 7. Any more questions?", True),
    case("startend:end_checker", {"end_phrase": "This is the end."}, "I must end by saying this is the end.", True),
    case("startend:end_checker", {"end_phrase": "This will fail."}, "This will fail. Tea is warm.", False),
    # -- change_case (test_english_capital_checker, test_english_lowercase_checker) -----------------------------
    case("change_case:english_capital", {}, "THIS IS ENGLISH. EVERY LETTER IS UPPER CASE!!! WOW.", True),
    case("change_case:english_capital", {}, "Every Word Is Capitalized In This Line.", False),
    case("change_case:english_lowercase", {}, "every letter in this sentence is lowercase.", True),
    case("change_case:english_lowercase", {}, "Almost every letter in this sentence is lowercase.", False),
    # -- change_case:capital_word_frequency (test_capital_word_frequency; nltk.word_tokenize) -------------------
    case("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": AL},
         "HERE are THREE FUlly CAPITAL words.", True),
    case("change_case:capital_word_frequency", {"capital_frequency": 5, "capital_relation": LT},
         "THESE are Four FULL CAPS WORDS. Others Are Not So.", True),
    case("change_case:capital_word_frequency", {"capital_frequency": 4, "capital_relation": LT},
         "THESE are Four FULL CAPS WORDS. Others Are Not So.", False),
    # -- punctuation:no_comma (test_comma), startend:quotation (test_quotation) ---------------------------------
    case("punctuation:no_comma", {}, "Short sentences. No need for one.", True),
    case("punctuation:no_comma", {}, "Since then, people punctuate.", False),
    case("startend:quotation", {}, '  "All of it is wrapped."  ', True),
    case("startend:quotation", {}, '"Wrapped here." But not all.', False),
    # -- evaluation_lib.py: an empty response follows nothing -------------------------------------------------
    case("punctuation:no_comma", {}, "   \n", False),
]


@pytest.mark.parametrize("instruction_id,kwargs,response,official,ours", STRICT)
def test_strict_against_official(instruction_id, kwargs, response, official, ours):
    assert ifeval.check([instruction_id], [kwargs], "prompt", response, loose=False)["strict"] == [ours]


# (instruction id, kwargs, response, official strict, official loose): evaluation_lib.py's loose variants
LOOSE = [
    ("startend:quotation", {}, 'Here is my answer:\n"Tea is warm."', False, True),                 # first line
    ("punctuation:no_comma", {}, "tea is warm and green\nbest, bot", False, True),                  # last line
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. **Any other questions?**", False, True),
    ("change_case:english_lowercase", {}, "Sure!\nevery word of this reply is in lower case\nThanks!", False, True),
    ("detectable_format:title", {}, "Sure:\n<<>>\nNo title.", False, False),
    ("punctuation:no_comma", {}, "a, b\nc, d\ne, f", False, False),                                 # middle line
    ("detectable_format:json_format", {}, 'Here it is:\n{"a": 1}\nHope it helps.', False, True),    # both lines
]


@pytest.mark.parametrize("instruction_id,kwargs,response,strict,loose", LOOSE)
def test_loose_against_official(instruction_id, kwargs, response, strict, loose):
    result = ifeval.check([instruction_id], [kwargs], "prompt", response)
    assert (result["strict"], result["loose"]) == ([strict], [loose])


# (text, sentences the pretrained Punkt model counts): instructions_util_test.py test_count_sentences and the
# initial rule above
SENTENCES = [
    ("ab,c. de,f! gh/i. j{k}l? m.", 5),
    ("ab,c! defg. h(i)j?", 3),
    ("abcd. ef,g! hi|j. k&l m?", 4),
    ("ab-c]de,f! g{h}ij,k.", 2),
    ("Dr. Smith came home. He slept.", 2),
    ("Pi is 3.14 today. Is it? Yes!", 3),
    ("Wait... what happened? Nothing.", 2),
    ("Take vitamin A. It helps.", 2),
    ("We chose plan B. The rest failed.", 2),
    ("World War I. Then peace came.", 2),
    ("Solve for x. Then check it.", 2),
    ("Take vitamin A. it helps.", 1),                      # a lower-case word goes on the sentence
    ("The author is J. Quillfeather. She writes.", 2),     # a word never seen in lower case: a name
    ("Take vitamin C. It helps.", 1),                      # c is one of the model's abbreviations
    ("Grade C. 5 students passed.", 1),
    ("Ask Dr. Lee. He knows.", 2),
]


@pytest.mark.parametrize("text,official", SENTENCES)
def test_sentence_count_against_pretrained_punkt(text, official):
    assert ifeval.count_sentences(text) == official
