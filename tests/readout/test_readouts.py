import math

import pytest

from pope_fast.readout import READOUTS, TokenSets, parse_readouts
from pope_fast.readout.readouts import (ALL_CUT, NO_CANDIDATE, NON_FINITE, compare_max_logits,
                                        exact_match, first_token_decision, lmms_eval_scored_text,
                                        pope_official, string_parse, undecidable)

SETS = TokenSets(yes_ids=(10, 11), no_ids=(20, 21))


@pytest.mark.parametrize("logits, expected", [
    ({10: 1.0, 11: 3.0, 20: 2.9, 21: -5.0}, "yes"),   # max vs max, the second yes id wins
    ({10: 1.0, 11: 2.0, 20: 2.0, 21: 0.0}, "no"),     # a tie is no: yes needs strictly larger
    ({10: 5.0, 11: 0.0, 20: 0.0, 21: 5.5}, "no"),
    ({10: math.nan, 11: 1.0, 20: 0.0, 21: 0.0}, "unknown"),
], ids=["yes-max", "tie-is-no", "no-max", "nan-unknown"])
def test_compare_max_logits(logits, expected):
    assert compare_max_logits(logits, SETS) == expected


CUT = -math.inf  # what VCD's, PAI's and ICD's plausibility cut gives a token below beta · max p


@pytest.mark.parametrize("logits, expected, reason", [
    ({10: CUT, 11: CUT, 20: CUT, 21: CUT}, "unknown", ALL_CUT),  # was "no": -inf > -inf is false
    # the cut left a no candidate: the method's answer
    ({10: CUT, 11: CUT, 20: CUT, 21: -3.0}, "no", None),
    ({10: CUT, 11: -3.0, 20: CUT, 21: CUT}, "yes", None),        # ... or a yes candidate
    # max(1.0, nan) is 1.0: a NaN would hide
    ({10: 1.0, 11: math.nan, 20: 0.0, 21: 0.0}, "unknown", NON_FINITE),
    # a NaN on the losing side too
    ({10: 1.0, 11: 2.0, 20: math.nan, 21: 0.0}, "unknown", NON_FINITE),
    # +inf is an overflow, not a yes
    ({10: math.inf, 11: 0.0, 20: 0.0, 21: 0.0}, "unknown", NON_FINITE),
    # was "no": inf > inf is false
    ({10: math.inf, 11: 0.0, 20: math.inf, 21: 0.0}, "unknown", NON_FINITE),
    # a fault is named before the cut
    ({10: CUT, 11: CUT, 20: math.nan, 21: CUT}, "unknown", NON_FINITE),
], ids=["all-cut", "yes-side-cut", "no-side-cut", "nan-behind-a-finite-yes", "nan-on-the-no-side",
        "plus-inf", "plus-inf-both", "nan-among-cut"])
def test_a_readout_with_no_candidate_left_answers_unknown_and_says_why(logits, expected, reason):
    assert compare_max_logits(logits, SETS) == expected
    assert undecidable(logits, SETS) == reason
    # the engine's live decision too
    assert READOUTS["template_aware"](SETS, logits, None, None) == expected


def test_empty_side_is_unknown():
    assert undecidable({10: 9.0}, TokenSets((10,), ())) == NO_CANDIDATE
    assert compare_max_logits({10: 9.0}, TokenSets((10,), ())) == "unknown"
    assert first_token_decision(10, TokenSets((), (20,))) == "unknown"


@pytest.mark.parametrize("token, expected", [(11, "yes"), (21, "no"), (99, "unknown"),
                                             (None, "unknown")])
def test_first_token(token, expected):
    assert first_token_decision(token, SETS) == expected


@pytest.mark.parametrize("text, parse, official, exact", [
    ("", "unknown", "yes", "unknown"),
    ("Yes, there is", "yes", "yes", "unknown"),
    ("There is no", "no", "no", "unknown"),
    ("not sure", "unknown", "no", "unknown"),
    ("No.", "no", "no", "unknown"),
    ("I cannot tell", "unknown", "yes", "unknown"),
    (" yes ", "yes", "yes", "yes"),
    ("No", "no", "no", "no"),
    # official reads only the first sentence
    ("Yes. But there is no dog.", "yes", "yes", "unknown"),
    # whole words only: 'Noted' is not 'no'
    ("Noted: yes", "yes", "yes", "unknown"),
    ("x" * 64 + " yes", "unknown", "yes", "unknown"),          # string_parse reads 64 characters
    ("Yes, but not in this image", "yes", "no", "unknown"),   # official: any 'not' makes it no
], ids=lambda v: repr(v)[:20])
def test_string_rules(text, parse, official, exact):
    assert string_parse(text) == parse
    assert pope_official(text) == official
    assert exact_match(text) == exact


@pytest.mark.parametrize("text, scored", [
    (" MsYes ", "MsYes"),                                  # every answer stripped
    ("<think>is it? no</think> Yes", "Yes"),               # a block cut out
    # every block, the first closing tag after each opening
    ("<think>a</think>No<think>b</think>", "No"),
    # a closing tag alone: what follows the last one
    ("the prompt opened it</think>\nYes", "Yes"),
    ("</think>x</think> No", "No"),
    ("<think>never closed Yes", "<think>never closed Yes"),   # an unclosed block stays
    # no closing tag after the opening one: left as is
    ("</think>Yes<think>", "</think>Yes<think>"),
    ("<analysis>yes</analysis><think>no</think>No", "No"),  # both default pairs
    ("<THINK>no</THINK>Yes", "<THINK>no</THINK>Yes"),      # case-sensitive
], ids=lambda v: repr(v)[:24])
def test_lmms_eval_scores_the_text_its_evaluator_strips(text, scored):
    """lmms-eval v0.7.2's strip_reasoning_tags (api/reasoning.py l.5-35) under its default
    --reasoning_tags (__main__.py l.303-308), applied by evaluator.py (l.1129-1136) before
    tasks/pope/utils.py's exact match."""
    assert lmms_eval_scored_text(text) == scored
    assert exact_match(text) == (scored.lower() if scored.lower() in ("yes", "no") else "unknown")


def test_registry_dispatch_checks_inputs():
    assert READOUTS["template_aware"](SETS, {10: 0.0, 11: 1.0, 20: 0.5, 21: 0.0},
                                      None, None) == "yes"
    assert READOUTS["first_token"](SETS, None, 20, None) == "no"
    assert READOUTS["string_parse"](None, None, None, "no way") == "no"
    with pytest.raises(ValueError, match="decoded"):
        READOUTS["exact_match"](None, None, None, None)
    with pytest.raises(ValueError, match="logits"):
        READOUTS["legacy_2tok"](SETS, None, 3, "yes")


def test_parse_readouts():
    assert parse_readouts("all") == list(READOUTS)
    assert parse_readouts("string_parse, legacy_2tok") == ["legacy_2tok", "string_parse"]
    with pytest.raises(ValueError, match="unknown readout"):
        parse_readouts("legacy_3tok")
