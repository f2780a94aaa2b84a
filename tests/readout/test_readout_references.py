"""The three text readouts against the rules of the code they name, string by string.

Expected values come from two places: hand-written cases (the strings on which implementations
disagree, with the reference's answer typed in), and a seeded battery of generated strings scored by
a restatement of each reference's rule:
- RUCAIBox/POPE `evaluate.py`: the text before the first '.', commas removed, split on ' '; 'No',
  'not' or 'no' among the words makes it no, anything else is yes.
- lmms-eval `tasks/pope/utils.py` (`pope_process_results`): `results[0].lower().strip()` compared
  with the label; a prediction that is neither yes nor no is counted in no confusion cell.
- ugaa-research `scripts/run_multi_model_audit.py` (`string_parse`): empty → unknown; else
  `strip().lower()[:64]`, then `\\byes\\b` and `\\bno\\b` searched with re.I, the earlier match
  wins.
"""
import random
import re

import pytest

from pope_fast.readout.readouts import exact_match, pope_official, string_parse


def reference_pope_official(text):
    head = text.split(".")[0] if "." in text else text
    words = head.replace(",", "").split(" ")
    return "no" if {"No", "not", "no"} & set(words) else "yes"


def reference_exact_match(text):
    pred = text.lower().strip()
    return pred if pred in ("yes", "no") else "unknown"


def reference_string_parse(text):
    if not text:
        return "unknown"
    head = text.strip().lower()[:64]
    yes, no = re.search(r"\byes\b", head, re.I), re.search(r"\bno\b", head, re.I)
    if yes and no:
        return "yes" if yes.start() < no.start() else "no"
    return "yes" if yes else "no" if no else "unknown"


FRAGMENTS = ["yes", "Yes", "YES", "no", "No", "NO", "not", "Not", "nope", "noted", "yeſ", "Yeſ",
             "ño", "n't", "yes.", "No.", "no,", "'no'", "(yes)", "_yes", "yes_", "yes-no", "e.g.",
             "1.5", "…", "．", "İ", "there is", "a dog", "in the image", "Answer:", "ASSISTANT:",
             "x" * 30, "\u00a0", "\u3000", "\u2028", "\t", "\n", " ", "  ", ",", ".", "!"]
SEPARATORS = ["", " ", " ", ",", ", ", ".", ". ", "\n", "\t"]


def battery(seed=2610, n=400):
    """Seeded strings from the fragments: leading whitespace up to past the 64-character window,
    1-8 fragments (or, one time in five, a bare answer word), and optional trailing whitespace."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lead = rng.choice(["", " " * rng.randrange(1, 70), "\n" * rng.randrange(1, 4), "\t \u00a0"])
        body = "".join(rng.choice(FRAGMENTS) + rng.choice(SEPARATORS)
                       for _ in range(rng.randrange(1, 9)))
        if rng.random() < 0.2:
            body = rng.choice(["yes", "no", "Yes", "No", "YES", "NO", "yeſ", "no."])
        out.append(lead + body + rng.choice(["", " ", "\n", " " * 40]))
    return out


BATTERY = battery()

# (text, string_parse, pope_official, exact_match): the reference's answers typed in by hand.
HAND = [
    (" " * 62 + "yes", "yes", "yes", "yes"),            # stripped before the 64-character cut
    (" " * 62 + "no", "no", "no", "no"),
    ("\n" * 70 + "No, there is not.", "no", "no", "unknown"),
    ("x" * 61 + " yes", "unknown", "yes", "unknown"),   # 'yes' would end at character 65
    ("x" * 60 + " yes", "yes", "yes", "unknown"),       # ... and here at 64
    ("x" * 61 + " no", "no", "no", "unknown"),
    # lower() doubles 'İ': the cut is after lowering
    ("İ" * 31 + " yes", "unknown", "yes", "unknown"),
    ("Yeſ", "yes", "yes", "unknown"),                   # re.I: 'ſ' matches 's'; lower() keeps 'ſ'
    # official: only No/not/no are negative words
    ("NO", "no", "yes", "no"),
    ("Not really", "unknown", "yes", "unknown"),
    ("not really", "unknown", "no", "unknown"),
    ("No.", "no", "no", "unknown"),
    ("no,", "no", "no", "unknown"),                     # commas are removed before the split
    ("No!", "no", "yes", "unknown"),                    # official: 'No!' is not the word 'No'
    ("Yes. But there is no dog.", "yes", "yes", "unknown"),
    ("Yes, but not in this image", "yes", "no", "unknown"),
    # official splits on ' ' only: 'Yes\nno' is one word
    ("Yes\nno", "yes", "yes", "unknown"),
    ("Yes no", "yes", "no", "unknown"),
    ("no yes", "no", "no", "unknown"),
    # official reads the empty text before the '.'
    (".no", "no", "yes", "unknown"),
    ("", "unknown", "yes", "unknown"),
    ("   ", "unknown", "yes", "unknown"),
    ("\u3000yes\u3000", "yes", "yes", "yes"),           # str.strip() strips Unicode whitespace
    ("\u2028no\u2028", "no", "yes", "no"),            # official: one word, not 'no'
    ("yes_no", "unknown", "yes", "unknown"),            # '_' is a word character: no boundary
    ("yes-no", "yes", "yes", "unknown"),
    ("ño", "unknown", "yes", "unknown"),
    ("nope", "unknown", "yes", "unknown"),
    ("Noted: yes", "yes", "yes", "unknown"),
    ("isn't", "unknown", "yes", "unknown"),
    ("YES", "yes", "yes", "yes"),
    (" Yes ", "yes", "yes", "yes"),
    ("yes.", "yes", "yes", "unknown"),
    ("Answer: no", "no", "no", "unknown"),
]


def _id(text):
    return repr(text)[:24]


@pytest.mark.parametrize("text, parse, official, exact", HAND, ids=[_id(h[0]) for h in HAND])
def test_hand_written_reference_answers(text, parse, official, exact):
    assert (string_parse(text), pope_official(text), exact_match(text)) == (parse, official, exact)


def test_hand_written_answers_agree_with_the_restated_rules():
    """The restatements used as the battery's oracle give the typed-in answers too."""
    for text, parse, official, exact in HAND:
        assert (reference_string_parse(text), reference_pope_official(text),
                reference_exact_match(text)) == (parse, official, exact), repr(text)


@pytest.mark.parametrize("text", BATTERY, ids=[f"{i}:{_id(t)}" for i, t in enumerate(BATTERY)])
def test_battery(text):
    assert string_parse(text) == reference_string_parse(text)
    assert pope_official(text) == reference_pope_official(text)
    assert exact_match(text) == reference_exact_match(text)


def test_battery_covers_every_answer_of_every_readout():
    """A battery where a readout always said the same thing would not test it."""
    for rule in (reference_string_parse, reference_pope_official, reference_exact_match):
        seen = {rule(t) for t in BATTERY}
        assert seen >= ({"yes", "no", "unknown"} if rule is not reference_pope_official
                        else {"yes", "no"})
    # and it holds strings where stripping before the cut decides string_parse
    assert any(reference_string_parse(t) != _unstripped_parse(t) for t in BATTERY)


def _unstripped_parse(text):
    found = re.search(r"\b(yes|no)\b", text.lower()[:64])
    return found.group(1) if found else "unknown"
