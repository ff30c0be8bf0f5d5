"""Math-verify cases shared by the unit tests (one call each) and the integration test (the worker pool)."""

CASES = [   # (gold, completion, expected reward)
    ("17", "The sum is $17$, so the answer is $\\boxed{17}$.", 1.0),
    ("17", "\\boxed{17}", 1.0),
    ("17", "Final answer: \\boxed{ 17 }", 1.0),
    ("055", "Adding up gives \\boxed{55}.", 1.0),
    ("27", "\\boxed{27.0}", 1.0),
    ("\\frac{1}{2}", "so the probability is \\boxed{0.5}", 1.0),
    ("0.5", "\\boxed{\\frac{1}{2}}", 1.0),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}", 1.0),
    ("2\\sqrt{3}", "the height is $\\boxed{\\sqrt{12}}$", 1.0),
    ("2\\sqrt{3}", "\\boxed{2}", 0.0),                       # a bare-text gold parse would have read "2"
    ("336^\\circ", "\\boxed{336}", 1.0),
    ("-1", "\\boxed{-1}", 1.0),
    ("17", "\\boxed{18}", 0.0),
    ("17", "I first guessed \\boxed{17} but the answer is \\boxed{18}.", 0.0),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}", 0.0),
    ("17", "<think>maybe \\boxed{17}?</think>The answer is \\boxed{18}.", 0.0),   # inside <think>: not counted
    ("17", "<think>wrong \\boxed{3}</think>So the answer is \\boxed{17}.", 1.0),
    ("17", "<think>it is \\boxed{17} but I am still thinking", 0.0),            # never finished thinking
    ("17", "", 0.0),
    ("17", "I do not know.", 0.0),
    ("17", "<think>\\boxed{17}</think>", 0.0),                                   # no answer after thinking
]
