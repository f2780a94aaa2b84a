"""Readout protocols: the rules turning a model's output at the answer position into yes/no/unknown.

Every readout is a pure function of three things seen at the answer position: the logits of its
candidate ids, the full-vocabulary argmax id, and the decoded continuation (when text was
generated). Logit readouts also carry the token sets they compare; those depend on the vocabulary
and the prompt and are derived in `tokens.py`, then stored with every run so that `score` can
recompute decisions from the records without the model.

The legacy id sets are named readouts, not constants anyone relies on: 3582/1217 are 'yes'/'no'
(no leading space) in the LLaMA-2 vocabulary, which LLaVA-1.5 never emits after `ASSISTANT:`; under
other vocabularies they are applied verbatim, which is the paper's "ported" protocol.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping

YES, NO, UNKNOWN = "yes", "no", "unknown"
DECISIONS = (YES, NO, UNKNOWN)

# Kinds say what a readout reads: candidate logits, the argmax id, decoded new tokens, or the
# decoded whole sequence (prompt included).
LOGIT, FIRST_TOKEN, TEXT, SEQUENCE = "logit", "first_token", "text", "sequence"
GENERATING = (TEXT, SEQUENCE)

LEGACY_2TOK = ((3582,), (1217,))
LEGACY_8TOK = ((3582, 8241, 4874, 3869), (1217, 3782, 694, 1939))


@dataclass(frozen=True)
class TokenSets:
    """The yes and no candidate ids of one logit or first-token readout."""

    yes_ids: tuple[int, ...]
    no_ids: tuple[int, ...]

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.yes_ids) | set(self.no_ids)))

    def to_json(self) -> dict:
        return {"yes_ids": list(self.yes_ids), "no_ids": list(self.no_ids)}

    @classmethod
    def from_json(cls, obj: Mapping) -> "TokenSets":
        return cls(tuple(int(i) for i in obj["yes_ids"]), tuple(int(i) for i in obj["no_ids"]))


# Why a logit readout answers unknown: the reasons score, compare and report count per readout (and
# method).
NO_CANDIDATE = "no candidate id"  # a side of the token set is empty: no yes (or no) form is a token
ALL_CUT = "all candidates cut"  # every candidate -inf: a method's plausibility cut removed them all
NON_FINITE = "non-finite logit"  # a NaN or +inf among the candidates: a numerical fault
UNKNOWN_REASONS = (ALL_CUT, NON_FINITE, NO_CANDIDATE)


def undecidable(logits: Mapping[int, float], sets: TokenSets) -> str | None:
    """Why max vs max cannot decide between these candidates (one of UNKNOWN_REASONS), or None.

    A NaN or +inf anywhere among the candidates never decides: max() over a NaN depends on the order
    of the ids, and a +inf is an overflow, not a preference. Only when every candidate, yes and no
    alike, is -inf is the cut the reason: the method's own decoding would emit some token outside
    both sets, so neither answer is its own. Where the cut removed one side only, the other side
    wins, as `compare_max_logits` says why."""
    if not sets.yes_ids or not sets.no_ids:
        return NO_CANDIDATE
    values = [float(logits[i]) for i in sets.ids]
    if any(math.isnan(v) or v == math.inf for v in values):
        return NON_FINITE
    if all(v == -math.inf for v in values):
        return ALL_CUT
    return None


def compare_max_logits(logits: Mapping[int, float], sets: TokenSets) -> str:
    """Yes when the best yes logit is strictly larger than the best no logit; ties are no.

    Unknown where `undecidable` names a reason: a silent 'no' from comparing nothing would be scored
    as an answer. A side whose every candidate is -inf (VCD's, PAI's and ICD's plausibility cut: p <
    beta · max p) loses to a side with a finite candidate: the method itself ruled that side's
    tokens implausible and would sample the other's, so that is the method's answer, not an artefact
    of the readout.
    """
    if undecidable(logits, sets) is not None:
        return UNKNOWN
    best_yes = max(float(logits[i]) for i in sets.yes_ids)
    best_no = max(float(logits[i]) for i in sets.no_ids)
    return YES if best_yes > best_no else NO


def first_token_decision(first_token_id: int | None, sets: TokenSets) -> str:
    """The greedy first token itself, read against the template-aware sets."""
    if first_token_id is None:
        return UNKNOWN
    if first_token_id in sets.yes_ids:
        return YES
    if first_token_id in sets.no_ids:
        return NO
    return UNKNOWN


# re.I as the reference has it: besides case, it lets 'ſ' (U+017F, which lower() keeps) match 's'.
_WORD = re.compile(r"\b(yes|no)\b", re.I)


def string_parse(text: str) -> str:
    """ugaa-research `run_multi_model_audit.py`: strip, lowercase, then the first 64 characters; the
    first whole word yes/no in them wins (case-insensitively). Stripping before the cut matters:
    leading whitespace would otherwise push the answer out of the window."""
    found = _WORD.search(text.strip().lower()[:64])
    if not found:
        return UNKNOWN
    return YES if found.group(1)[0] == "y" else NO  # the word may be 'yeſ'


def pope_official(text: str) -> str:
    """RUCAIBox/POPE `evaluate.py`: only the text before the first '.', commas removed, split on
    spaces; any of `No`/`not`/`no` makes it no, anything else (the empty string too) is yes."""
    words = text.split(".")[0].replace(",", "").split(" ")
    return NO if any(w in ("No", "not", "no") for w in words) else YES


# lmms-eval's default --reasoning_tags (v0.7.2 cb45ac4d lmms_eval/__main__.py l.303-308), which its
# evaluator strips from every generated answer before any task scores it (evaluator.py l.1092-1136).
LMMS_EVAL_REASONING_TAGS = (("<think>", "</think>"), ("<analysis>", "</analysis>"))


def lmms_eval_scored_text(text: str) -> str:
    """The text lmms-eval's tasks score and its samples log keeps: strip_reasoning_tags
    (lmms_eval/api/reasoning.py l.5-35 at cb45ac4d) under the default tags. Per tag pair, while both
    tags occur, the first opening tag through the first closing tag after it is cut out; a closing
    tag left without an opening one (a template that opened the block in the prompt) keeps only what
    follows the last of them; then the whole is stripped."""
    result = text
    for start_tag, end_tag in LMMS_EVAL_REASONING_TAGS:
        while start_tag in result and end_tag in result:
            start = result.find(start_tag)
            end = result.find(end_tag, start)
            if end == -1:  # only a closing tag before the opening one: the loop would never end
                break
            result = result[:start] + result[end + len(end_tag):]
        if end_tag in result and start_tag not in result:
            result = result.rsplit(end_tag, 1)[-1]
    return result.strip()


def exact_match(text: str) -> str:
    """lmms-eval's POPE rule (tasks/pope/utils.py l.17-19) on the text its evaluator hands the task
    (lmms_eval_scored_text): the stripped, lowercased answer must be exactly yes or no."""
    answer = lmms_eval_scored_text(text).lower().strip()
    return answer if answer in (YES, NO) else UNKNOWN


_MARKS = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`",
          ",", "?", "!")
_DIGIT_COMMA = re.compile(r"(\d)(,)(\d)")
_PERIOD = re.compile(r"(?<!\d)\.(?!\d)")


def _punctuation_removed(text: str) -> str:
    """VLMEvalKit `process_punctuation` (vlmeval/smp/misc.py l.18-33 at e8e78f05): each mark is
    deleted where the text has it beside a space (or holds a digit,digit anywhere), else replaced by
    a space, each mark deciding on the text as given; then periods not beside a digit are deleted,
    at most 32 of them (it passes re.UNICODE, 32, where `sub` takes its count)."""
    out = text
    digit_comma = _DIGIT_COMMA.search(text) is not None
    for mark in _MARKS:
        beside_space = mark + " " in text or " " + mark in text
        out = out.replace(mark, "" if beside_space or digit_comma else " ")
    return _PERIOD.sub("", out, count=32)


def yorn(text: str) -> str:
    """VLMEvalKit `YOrN_Extraction` (vlmeval/dataset/utils/yorn.py l.254-261): the lowercased
    answer, its punctuation removed, split on whitespace; yes when the words hold 'yes' and not
    'no', no for the reverse, else unknown (both, or neither: "yes, there is no dog", "**yes**",
    "yes:")."""
    words = _punctuation_removed(text.lower()).split()
    if "yes" in words and "no" not in words:
        return YES
    if "no" in words and "yes" not in words:
        return NO
    return UNKNOWN


def repope(text: str) -> str:
    """RePOPE's `compute_answer` (YanNeu/RePOPE bcf22e5 src/eval_utils.py l.5-13): yes when "yes"
    occurs anywhere in the lowercased answer ("yesterday", "yes, no doubt"), else no when "no" does
    ("not", "none", "know"); its third branch, "not", can never decide, since "not" holds "no".
    Anything else is its None: unknown here, and left out of every count (compute_results
    l.45-56)."""
    lowered = text.lower()
    if "yes" in lowered:
        return YES
    if "no" in lowered:
        return NO
    return UNKNOWN


def vcd(text: str) -> str:
    """VCD's experiments/eval/eval_pope.py (DAMO-NLP-SG/VCD d6568ff l.33-50) without the label it
    reads: "yes" in the lowercased, stripped text and not "no" → yes, the reverse → no; both
    ("yes, there is no...") or neither unknown, since its count of those depends on the label
    (right under either label for both, wrong for neither: `--protocol vcd` counts them so)."""
    lowered = text.lower().strip()
    if ("yes" in lowered) != ("no" in lowered):
        return YES if "yes" in lowered else NO
    return UNKNOWN


@dataclass(frozen=True)
class Generation:
    """How a text readout's reference generates: at most `new_tokens` greedy tokens (fewer where the
    model's positions run out), to a stop token; with `first_sentence`, its text is complete at the
    first '.' too, since it reads nothing after it."""

    new_tokens: int
    first_sentence: bool = False

    def to_json(self) -> dict:
        return {"max_new_tokens": self.new_tokens, "first_sentence": self.first_sentence}


class Missing(Exception):
    """An answer lacks what a readout reads; the message says what."""


@dataclass(frozen=True)
class Readout:
    name: str
    kind: str
    summary: str
    decide: Callable[..., str]
    generation: Generation | None = None  # text and sequence readouts only

    def __call__(self, sets: TokenSets | None, logits: Mapping[int, float] | None,
                 first_token_id: int | None, decoded: str | None) -> str:
        """One decision. Each kind reads only its own input; a missing input is a caller bug."""
        if self.kind == LOGIT:
            if sets is None or logits is None:
                raise ValueError(f"readout {self.name} needs its token sets and candidate logits")
            return self.decide(logits, sets)
        if self.kind == FIRST_TOKEN:
            if sets is None:
                raise ValueError(f"readout {self.name} needs its token sets")
            return self.decide(first_token_id, sets)
        if decoded is None:
            what = ("the decoded whole sequence" if self.kind == SEQUENCE
                    else "the decoded continuation")
            raise ValueError(f"readout {self.name} needs {what}")
        return self.decide(decoded)

    def read(self, sets: TokenSets | None, answer) -> str:
        """The decision from one answer: the one place that says which of an answer's inputs each
        kind reads. `answer` is anything with candidate_logits, first_token_id, decoded_sequence and
        text_for(readout name): an engine's PromptResult, a scored record's Entry. Missing when it
        lacks this readout's input (or its token sets), naming what. An answer whose position was
        never read (a thinking checkpoint's reasoning that did not close: `unanswered`) is unknown
        under every readout."""
        if getattr(answer, "unanswered", None):
            return UNKNOWN
        if self.kind == LOGIT:
            logits = answer.candidate_logits
            if sets is None or logits is None:
                raise Missing("no token sets (meta.json) or no candidate logits")
            absent = [i for i in sets.ids if i not in logits]
            if absent:
                raise Missing(f"candidate logits lack ids {absent}")
            return self(sets, logits, None, None)
        if self.kind == FIRST_TOKEN:
            if sets is None or answer.first_token_id is None:
                raise Missing("no template-aware token sets or no first token")
            return self(sets, None, answer.first_token_id, None)
        if self.kind == SEQUENCE:
            if answer.decoded_sequence is None:
                raise Missing("no decoded whole sequence "
                              "(run with string_parse_with_prompt to record it)")
            return self(None, None, None, answer.decoded_sequence)
        text = answer.text_for(self.name)
        if text is None:
            raise Missing("no decoded text (run with a string readout to generate it)")
        return self(None, None, None, text)

    def why_unknown(self, sets: TokenSets | None, answer) -> str | None:
        """Why this readout cannot decide this answer (`undecidable`'s reason, or why the answer has
        no answer position), None where it can or where the reason is not the candidates' (a text
        readout's unknown, an answer lacking its input: `read` says)."""
        if getattr(answer, "unanswered", None):
            return answer.unanswered
        logits = answer.candidate_logits
        if (self.kind != LOGIT or sets is None or logits is None
                or any(i not in logits for i in sets.ids)):
            return None
        return undecidable(logits, sets)


# The one registry. Order is the order tables show.
READOUTS: dict[str, Readout] = {
    r.name: r
    for r in (
        Readout("legacy_2tok", LOGIT, "fixed LLaMA-2 ids 3582 'yes' vs 1217 'no'",
                compare_max_logits),
        Readout("legacy_8tok", LOGIT,
                "fixed LLaMA-2 ids {yes,Yes,▁yes,▁Yes} vs {no,No,▁no,▁No}, max vs max",
                compare_max_logits),
        Readout("dynamic_single", LOGIT,
                "yes/Yes/ yes/ Yes vs no/No/ no/ No forms that encode to one token",
                compare_max_logits),
        Readout("template_aware", LOGIT,
                "the first answer token after the exact prompt, per form; max vs max",
                compare_max_logits),
        Readout("first_token", FIRST_TOKEN, "greedy first token in the template-aware yes / no set",
                first_token_decision),
        # The paper's run_multi_model_audit.py (--parse-max-new-tokens 6).
        Readout("string_parse", TEXT,
                "ugaa-research: first whole-word yes/no in the first 64 characters, stripped",
                string_parse, Generation(6)),
        # Its InstructBLIP and mPLUG-Owl2 adapters decoded generate's whole output, prompt included,
        # so the prompt's own "yes" decided (the all-yes row). Reproduces that published row; not a
        # recommendation.
        Readout("string_parse_with_prompt", SEQUENCE,
                "string_parse of the decoded whole sequence, prompt included (the paper's "
                "InstructBLIP and mPLUG-Owl2 rows; not a recommended readout)",
                string_parse, Generation(6)),
        # evaluate.py reads the first sentence only; the answers it scores were generated as the
        # references generate (LLaVA's model_vqa_loader and lmms-eval: 128 new tokens at most),
        # never to the end of the model's positions (a model that loops without a period would
        # decode thousands of tokens).
        Readout("pope_official", TEXT,
                "RUCAIBox/POPE evaluate.py: no/not/No before the first '.', else yes",
                pope_official, Generation(128, first_sentence=True)),
        # lmms-eval's pope.yaml: max_new_tokens 128.
        Readout("exact_match", TEXT,
                "lmms-eval: stripped lowercase answer (reasoning blocks cut) equals yes or no",
                exact_match, Generation(128)),
        # VLMEvalKit generates 2048 tokens for most classes (mPLUG-Owl2 512); an ordinary run reads
        # 128 as the others, and `--protocol vlmevalkit` the model class's own length.
        Readout("yorn", TEXT,
                "VLMEvalKit YOrN_Extraction: 'yes' and not 'no' among the words "
                "(punctuation removed), or the reverse; else unknown", yorn, Generation(128)),
        # RePOPE's evaluators generate per model (src/vlms/: 15 to 1024 new tokens); an ordinary run
        # reads 128.
        Readout("repope", TEXT,
                "RePOPE compute_answer: 'yes' anywhere in the lowercased text, else 'no' anywhere; "
                "else unknown (left out of its counts)", repope, Generation(128)),
        # VCD's scripts sample up to 1024 new tokens (--protocol vcd); an ordinary run reads 128 as
        # the others.
        Readout("vcd", TEXT,
                "VCD eval_pope.py: 'yes' in the lowercased text and not 'no' → yes, "
                "the reverse → no; both or neither unknown "
                "(its own count reads the label: --protocol vcd)",
                vcd, Generation(128)),
    )
}
LOGIT_READOUTS = tuple(n for n, r in READOUTS.items() if r.kind == LOGIT)
TEXT_READOUTS = tuple(n for n, r in READOUTS.items() if r.kind in GENERATING)
DEFAULT_READOUT = "template_aware"


def parse_readouts(spec: str | None) -> list[str]:
    """'all' (or None) → every readout; 'a,b' → those, validated, in registry order."""
    if spec is None or spec.strip() == "all":
        return list(READOUTS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError(f"no readout named in {spec!r}; known: {', '.join(READOUTS)}")
    unknown = [n for n in names if n not in READOUTS]
    if unknown:
        raise ValueError(f"unknown readout(s) {', '.join(unknown)}; known: {', '.join(READOUTS)}")
    return [n for n in READOUTS if n in names]
