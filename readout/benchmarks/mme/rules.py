"""MME's answer rules and aggregations: the official eval_tool's calculation.py's, lmms-eval's and
VLMEvalKit's.

Facts and line numbers are those of ../shared/benchmarks/mme_synthetic/README.md: calculation.py is
BradyFU/Awesome-Multimodal-Large-Language-Models@dd295090 (branch Evaluation) tools/eval_tool.zip,
which has no licence, so nothing of it is copied; lmms-eval is
lmms_eval/tasks/mme/utils.py@75571cfe; VLMEvalKit is vlmeval/dataset/utils/yorn.py@e8e78f05. Every
rule scores an unknown decision as wrong.

The three aggregations give the same numbers up to float rounding whenever each image has exactly
two answers (all the real data has); each is still computed in its tool's own order of operations,
so that full-precision results match the tool's to the last bit. The tools pair an image's answers
differently: calculation.py pairs consecutive lines of a result file (99), lmms-eval groups by
question_id (100-107), VLMEvalKit by image_path (yorn.py:54-61). Answers carry their image, so all
three group by it here; calculation.py would differ only on a file whose two lines of an image are
not consecutive, which `results.py` refuses to read.
"""
from __future__ import annotations

from collections import defaultdict

from ...readouts import NO, UNKNOWN, YES, lmms_eval_scored_text, yorn
from ..base import Answer, Rule

# The 14 subtasks (the parquet's exact `category` names), in calculation.py's eval_type_dict order,
# which lmms-eval's utils.py:8-27 copies.
PERCEPTION = ("existence", "count", "position", "color", "posters", "celebrity", "scene",
              "landmark", "artwork", "OCR")
COGNITION = ("commonsense_reasoning", "numerical_calculation", "text_translation", "code_reasoning")
SUBTASKS = PERCEPTION + COGNITION
GROUPS = {"Perception": PERCEPTION, "Cognition": COGNITION}

OFFICIAL_SOURCE = ("BradyFU/Awesome-Multimodal-Large-Language-Models@dd295090 tools/eval_tool.zip "
                   "calculation.py")
LMMS_EVAL_SOURCE = "EvolvingLMMs-Lab/lmms-eval@75571cfe lmms_eval/tasks/mme/utils.py"
VLMEVALKIT_SOURCE = "open-compass/VLMEvalKit@e8e78f05"
LMMS_EVAL_REMOVED = " Please answer yes or no."  # utils.py:30
# mme.yaml:26-29 (lmms_eval_specific_kwargs.default.post_prompt), the same at v0.7.2 (cb45ac4d) and
# 75571cfe; its generation_kwargs (10-15) are greedy, max_new_tokens 16.
LMMS_EVAL_POST_PROMPT = "\nAnswer the question using a single word or phrase."


def _first_four(pred: str) -> str:
    """The fallback both calculation.py (parse_pred_ans, 23-37) and lmms-eval (utils.py:62-68,
    "brought from Otter Eval") apply: 'yes' in the first 4 characters, else 'no' in them, else
    other."""
    prefix = pred[:4]
    if "yes" in prefix:
        return YES
    if "no" in prefix:
        return NO
    return UNKNOWN


def official_read(text: str) -> str:
    """calculation.py parse_pred_ans (23-37): lower-cased but not stripped, exactly yes/no, else the
    first 4 characters decide ("Not sure" and "None" are no, "  yes", "y", "The answer is yes"
    other).

    The line's trailing "\\n", which readlines() leaves on every line but a file's last, never
    changes this reading: "yes\\n" and "no\\n" fail the exact match but their first 4 characters
    hold the word, and a shorter text's prefix gains only the newline, which completes neither
    word."""
    pred = text.lower()
    if pred in (YES, NO):
        return pred
    return _first_four(pred)


def lmms_eval_read(text: str) -> str:
    """lmms-eval parse_pred_ans (utils.py:48-69) on the text its evaluator hands the task
    (readouts.lmms_eval_scored_text): lower, strip, periods dropped; exactly yes/no; a single
    character y or n; else the first 4 characters as calculation.py reads them."""
    pred = lmms_eval_scored_text(text).lower().strip().replace(".", "")
    if pred in (YES, NO):
        return pred
    if len(pred) == 1:
        return {"y": YES, "n": NO}.get(pred, UNKNOWN)
    return _first_four(pred)


def lmms_eval_prompt(question: str) -> str:
    """lmms-eval mme_doc_to_text (utils.py:37-45) with the default kwargs (empty pre_prompt): the
    stripped question, its " Please answer yes or no." removed, the post prompt appended."""
    return question.strip().replace(LMMS_EVAL_REMOVED, "") + LMMS_EVAL_POST_PROMPT


def _correct_by_image(answers: list[Answer]) -> dict[str, dict[str, list[bool]]]:
    """subtask -> image -> whether each answer is right, in the order given (unknown is wrong)."""
    grouped: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for answer in answers:
        if answer.split not in SUBTASKS:
            raise ValueError(f"{answer.key}: split {answer.split!r} is not an MME subtask")
        if answer.image is None:
            raise ValueError(f"{answer.key}: no image, and MME's acc+ pairs the two questions of "
                             "an image")
        grouped[answer.split][answer.image].append(answer.decision == answer.label)
    return grouped


def _pairs(subtask: str, images: dict[str, list[bool]], where: str) -> None:
    for image, scores in images.items():
        if len(scores) != 2:
            raise ValueError(f"{subtask} image {image!r} has {len(scores)} answers; {where} needs "
                             "exactly 2")


def _totals(scores: dict[str, float], names: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """Each group's sum over the subtasks present, in the tool's order; a group with none present is
    left out. A group missing some is a partial total, which score marks (missing_subtasks):
    calculation.py reads every subtask's file and VLMEvalKit's scores[c] raises without one, while
    lmms-eval sums those it saw."""
    totals = {}
    for group, subtasks in names.items():
        present = [s for s in subtasks if s in scores]
        if present:
            total = 0
            for subtask in present:
                total += scores[subtask]
            totals[group] = total
    return totals


def official_aggregate(answers: list[Answer]) -> dict[str, float]:
    """calculation.py: acc = accuracy over the subtask's questions (52), acc_plus = share of images
    with both right (132-138), score = acc*100 + acc_plus*100 (141-143); Perception, Cognition sum
    their subtasks (147-149). Returned as "<subtask>/acc", "<subtask>/acc_plus" (both ×100) and
    "<subtask>/score"."""
    grouped = _correct_by_image(answers)
    per, scores = {}, {}
    for subtask in SUBTASKS:
        images = grouped.get(subtask)
        if not images:
            continue
        _pairs(subtask, images, "calculation.py (divide_chunks, 99-109)")
        flat = [right for scores_ in images.values() for right in scores_]
        acc = sum(flat) / len(flat)
        acc_plus = sum(all(v) for v in images.values()) / len(images)
        scores[subtask] = acc * 100 + acc_plus * 100
        per.update({f"{subtask}/acc": acc * 100, f"{subtask}/acc_plus": acc_plus * 100,
                    f"{subtask}/score": scores[subtask]})
    return {**_totals(scores, GROUPS), **per}


def lmms_eval_aggregate(answers: list[Answer]) -> dict[str, float]:
    """lmms-eval mme_aggregate_results (utils.py:93-122): per image acc = mean×100 and acc_plus =
    100 if both right (an assert of exactly 2, 112); the category's score is the mean over images of
    acc + acc_plus; each metric sums its categories in the order they first appear. Categories are
    named as its log names them (120), with "<category>/acc" and "<category>/acc_plus" the means of
    the two terms."""
    grouped = _correct_by_image(answers)
    per, scores = {}, {}
    for subtask, images in grouped.items():
        _pairs(subtask, images, "lmms-eval (utils.py:112)")
        total = acc_total = plus_total = 0
        for image_scores in images.values():
            acc = sum(image_scores) / len(image_scores) * 100.0
            acc_plus = (sum(image_scores) == 2) * 100.0
            total += acc_plus + acc
            acc_total, plus_total = acc_total + acc, plus_total + acc_plus
        scores[subtask] = total / len(images)
        per.update({subtask: scores[subtask], f"{subtask}/acc": acc_total / len(images),
                    f"{subtask}/acc_plus": plus_total / len(images)})
    order = {"mme_perception_score": tuple(s for s in grouped if s in PERCEPTION),
             "mme_cognition_score": tuple(s for s in grouped if s in COGNITION)}
    return {**_totals(scores, order), **per}


# VLMEvalKit's super_cates (yorn.py:77-83), in its order (its sums run in it), cognition called
# "reasoning".
VLMEVALKIT_GROUPS = {"perception": ("OCR", "artwork", "celebrity", "color", "count", "existence",
                                    "landmark", "position", "posters", "scene"),
                     "reasoning": ("code_reasoning", "commonsense_reasoning",
                                   "numerical_calculation", "text_translation")}


def vlmevalkit_aggregate(answers: list[Answer]) -> dict[str, float]:
    """VLMEvalKit MME_rating (yorn.py:50-93): per category, mean of all scores ×100 plus the mean
    over images of val[0]*val[1] ×100 (the product of an image's first two answers; fewer than 2
    raises there too); perception and reasoning sum their categories. Categories are named by
    themselves, with their two terms as "<category>/acc" and "<category>/acc_plus"."""
    grouped = _correct_by_image(answers)
    per, scores = {}, {}
    for subtask, images in grouped.items():
        short = [image for image, v in images.items() if len(v) < 2]
        if short:
            raise ValueError(f"{subtask} image {short[0]!r} has 1 answer; MME_rating's "
                             "val[0]*val[1] needs 2")
        flat = [right for v in images.values() for right in v]
        acc = sum(flat) / len(flat) * 100
        acc_plus = sum(v[0] * v[1] for v in images.values()) / len(images) * 100
        scores[subtask] = acc + acc_plus
        per.update({subtask: scores[subtask], f"{subtask}/acc": acc,
                    f"{subtask}/acc_plus": acc_plus})
    return {**_totals(scores, VLMEVALKIT_GROUPS), **per}


def missing_subtasks(answers: list[Answer]) -> list[str]:
    """What keeps the totals from being the tools' numbers: per group with some of its subtasks and
    not all, which are missing."""
    present = {a.split for a in answers}
    out = []
    for group, subtasks in GROUPS.items():
        missing = [s for s in subtasks if s not in present]
        if missing and len(missing) < len(subtasks):
            out.append(f"{group} is a partial total: {len(subtasks) - len(missing)} of its "
                       f"{len(subtasks)} subtasks (missing: {', '.join(missing)}); MME's "
                       "calculation.py and VLMEvalKit print none without them all, lmms-eval sums "
                       "those present as this does")
    return out


RULES = {
    "official": Rule("official", official_read, official_aggregate, ("Perception", "Cognition"),
                     (f"{OFFICIAL_SOURCE}:23-37 parse_pred_ans, 52 acc, 99-109 pairs, "
                      "113-121 reading, 132-149 acc_plus, score and totals",)),
    "lmms-eval": Rule("lmms-eval", lmms_eval_read, lmms_eval_aggregate,
                      ("mme_perception_score", "mme_cognition_score"),
                      (f"{LMMS_EVAL_SOURCE}:30-45 prompt, 48-69 parse_pred_ans, 72-90 score, "
                       "93-122 aggregation",
                       "EvolvingLMMs-Lab/lmms-eval@75571cfe lmms_eval/tasks/mme/mme.yaml "
                       "post_prompt"),
                      lmms_eval_prompt),
    "vlmevalkit": Rule("vlmevalkit", yorn, vlmevalkit_aggregate, ("perception", "reasoning"), (
        f"{VLMEVALKIT_SOURCE} vlmeval/dataset/utils/yorn.py:254-261 YOrN_Extraction, "
        "50-93 MME_rating",
        f"{VLMEVALKIT_SOURCE} vlmeval/dataset/image_yorn.py:60-91 exact_matching judge, score",
        f"{VLMEVALKIT_SOURCE} vlmeval/dataset/image_base.py:320-337 prompt: the question as is")),
}
