"""AMBER's discriminative aggregations: the official `inference.py` (junyangwang0410/AMBER
@534babf6) and VLMEvalKit's `AMBER_rating` (vlmeval/dataset/utils/yorn.py:9-47 @e8e78f05).

The official numbers are reproduced float op for float op: its counters start at 0.001
(data/metrics.txt, read by inference.py:40-52) and grow by += 1, which after n steps is not always
the float n + 0.001, and its round(x, 1) acts on the binary value, so any reordering can move a
printed digit.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ...readouts import NO, YES
from ..base import Answer

EXISTENCE, STATE, NUMBER, ACTION, RELATION = (
    "existence", "attribute-state", "attribute-number", "attribute-action", "relation")
SPLITS = (EXISTENCE, STATE, NUMBER, ACTION, RELATION)
# the script's spelling (inference.py:274), as are "Exsitence" and the rest
OVERALL = "Descriminative Task"
# --evaluation_type (inference.py:20); the generative ones aside
EVALUATION_TYPES = ("d", "de", "da", "dr")


@dataclass
class _Tally:
    """One group's counters, named as inference.py names them without its group prefix."""
    qa_correct_score: int = 0
    qa_correct_num: float = 0.001
    qa_no_score: int = 0
    qa_no_num: float = 0.001
    qa_ans_no_score: int = 0
    qa_ans_no_num: float = 0.001

    def add(self, truth: str, decision: str) -> None:
        """inference.py:174-256 for one record; "no" is the positive class."""
        self.qa_correct_num += 1
        if truth == YES:
            self.qa_correct_score += decision == YES  # 188-189: response == 'Yes'
        else:  # 201: any truth but 'yes'
            self.qa_no_num += 1
            if decision == NO:  # 214: response == 'No'
                self.qa_correct_score += 1
                self.qa_no_score += 1
        if decision == NO:  # 233
            self.qa_ans_no_num += 1
            self.qa_ans_no_score += truth == NO  # 245

    def __add__(self, other: "_Tally") -> "_Tally":
        """The Attribute pooling of inference.py:292-294: each counter summed, left to right."""
        return _Tally(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def _block(tally: _Tally, eps: float) -> dict:
    """A printed block (e.g. inference.py:270-273): values round(x*100, 1); F1 from rounded P, R."""
    accuracy = round(tally.qa_correct_score / tally.qa_correct_num * 100, 1)
    precision = round(tally.qa_ans_no_score / tally.qa_ans_no_num * 100, 1)
    recall = round(tally.qa_no_score / tally.qa_no_num * 100, 1)
    f1 = round(2 * (precision / 100) * (recall / 100)
               / ((precision / 100) + (recall / 100) + eps) * 100, 1)
    return {"Accuracy": accuracy, "Precision": precision, "Recall": recall, "F1": f1}


def _tallies(answers: list[Answer]) -> tuple[_Tally, dict[str, _Tally]]:
    overall, groups = _Tally(), {split: _Tally() for split in SPLITS}
    for answer in answers:
        if answer.split not in groups:
            raise ValueError(f"AMBER answer {answer.key}: split {answer.split!r} is none of "
                             f"{', '.join(SPLITS)}")
        overall.add(answer.label, answer.decision)
        groups[answer.split].add(answer.label, answer.decision)
    return overall, groups


def official(answers: list[Answer], evaluation_type: str = "d") -> dict[str, dict]:
    """The blocks inference.py prints for `--evaluation_type` (70-81), in its order and under its
    names. Every answer is counted whatever the type (86-256): the type only picks the blocks (269,
    280, 291, 329)."""
    if evaluation_type not in EVALUATION_TYPES:
        raise ValueError(f"evaluation_type {evaluation_type!r}: one of "
                         f"{', '.join(EVALUATION_TYPES)}")
    overall, groups = _tallies(answers)
    blocks = {}
    if evaluation_type == "d":
        blocks[OVERALL] = _block(overall, 0.0001)  # 270-273
    if evaluation_type in ("d", "de"):
        blocks["Exsitence"] = _block(groups[EXISTENCE], 0.001)  # 281-284: this block's eps is 0.001
    if evaluation_type in ("d", "da"):
        attribute = groups[STATE] + groups[NUMBER] + groups[ACTION]
        blocks["Attribute"] = _block(attribute, 0.0001)  # 292-295
        blocks["State"] = _block(groups[STATE], 0.0001)  # 296-299
        blocks["Number"] = _block(groups[NUMBER], 0.0001)  # 300-303
        blocks["Action"] = _block(groups[ACTION], 0.0001)  # 304-307
    if evaluation_type in ("d", "dr"):
        # 330-333: both relation type strings (183-184)
        blocks["Relation"] = _block(groups[RELATION], 0.0001)
    return blocks


# AMBER_rating's category_mapping (yorn.py:13-20), from our splits (the annotation types they came
# from).
VLMEVALKIT_CATEGORIES = {STATE: "Attribute", NUMBER: "Attribute", ACTION: "Attribute",
                         EXISTENCE: "Existence", RELATION: "Relation"}


def vlmevalkit(answers: list[Answer]) -> dict[str, float]:
    """AMBER_rating (yorn.py:9-47): accuracy in percent, unrounded, per category in order of first
    appearance (a defaultdict, 11), then "Avg ACC", the plain mean of those categories (45). A score
    is the lower-cased answer equal to the lower-cased extraction (image_yorn.py:88-89), so unknown
    is always wrong."""
    scores: dict[str, list[bool]] = {}
    for answer in answers:
        category = VLMEVALKIT_CATEGORIES.get(answer.split, answer.split)  # .get(c, c) as at 28
        scores.setdefault(category, []).append(answer.decision == answer.label)
    # np.mean, not sum()/len: numpy adds a short list as a0 + (a1 + a2), which can move the last
    # bit.
    result = {category: float(np.mean(values) * 100) for category, values in scores.items()}
    result["Avg ACC"] = float(np.mean(list(result.values()))) if result else float("nan")
    return result


def _weighted(weights: np.ndarray, mask) -> np.ndarray:
    return weights @ np.asarray(mask, dtype=np.float64)


def official_resampled(answers: list[Answer], weights: np.ndarray) -> dict[str, np.ndarray]:
    """The overall block's Accuracy and F1 (inference.py:270-273) under per-question bootstrap
    weights ([resamples, n]): each counter a weighted sum from 0.001 as `_Tally.add` counts it, then
    `_block`'s formula, rounded by numpy (round half to even on x*10, which Python's round(x, 1) can
    differ from in the last digit: these feed intervals, never a reported number)."""
    truth_yes = np.array([a.label == YES for a in answers])
    said_yes = np.array([a.decision == YES for a in answers])
    said_no = np.array([a.decision == NO for a in answers])
    score = _weighted(weights, (truth_yes & said_yes) | (~truth_yes & said_no))
    num = 0.001 + weights.sum(axis=1)
    no_score = _weighted(weights, ~truth_yes & said_no)
    no_num = 0.001 + _weighted(weights, ~truth_yes)
    ans_no_score = _weighted(weights, said_no & np.array([a.label == NO for a in answers]))
    ans_no_num = 0.001 + _weighted(weights, said_no)
    precision = np.round(ans_no_score / ans_no_num * 100, 1)
    recall = np.round(no_score / no_num * 100, 1)
    f1 = np.round(2 * (precision / 100) * (recall / 100)
                  / ((precision / 100) + (recall / 100) + 0.0001) * 100, 1)
    return {f"{OVERALL}/Accuracy": np.round(score / num * 100, 1), f"{OVERALL}/F1": f1}


def vlmevalkit_resampled(answers: list[Answer], weights: np.ndarray) -> dict[str, np.ndarray]:
    """AMBER_rating's Avg ACC under per-question bootstrap weights: each category's weighted
    accuracy, their plain mean over the categories a resample holds."""
    right = np.array([a.decision == a.label for a in answers])
    categories = [VLMEVALKIT_CATEGORIES.get(a.split, a.split) for a in answers]
    per = []
    for category in dict.fromkeys(categories):
        held = np.array([c == category for c in categories])
        total = _weighted(weights, held)
        accuracy = _weighted(weights, right & held) / np.maximum(total, 1e-300) * 100
        per.append(np.where(total > 0, accuracy, np.nan))
    return {"Avg ACC": np.nanmean(np.vstack(per), axis=0)}

