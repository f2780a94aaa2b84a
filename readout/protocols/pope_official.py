"""RUCAIBox/POPE (3df3ba1)'s evaluate.py: its answer rule and metrics over one split file. It
prescribes no prompt or generation: it scores whatever was run, so it runs a family on the family's
default prompt."""
from __future__ import annotations

from typing import Mapping

from ..readouts import NO
from .base import Coverage, FamilyFacts, Protocol

SCRIPT_STOPS = ("the script stops here with ZeroDivisionError "
                "(no yes answer, or no yes answer right)")


def script_prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    """Precision, recall and F1 in the order of operations POPE's evaluate.py and RePOPE's
    compute_results share (float divisions, then 2PR/(P+R)); ZeroDivisionError where those scripts
    stop."""
    precision = float(tp) / float(tp + fp)
    recall = float(tp) / float(tp + fn)
    return precision, recall, 2 * precision * recall / (precision + recall)


def pope_evaluate_metrics(labels: list[str], decided: list[str]) -> dict:
    """RUCAIBox/POPE evaluate.py (3df3ba1) l.23-62, which LLaVA's llava/eval/eval_pope.py copies
    (l.22-61): every answer not "no" a yes prediction; precision, recall, F1 2PR/(P+R) in that order
    of operations, accuracy, and the yes-ratio of the predictions. Fractions. Where the script
    divides by zero (no yes answer, or none right) it stops with ZeroDivisionError: those values are
    None and `error` says so."""
    pred = [0 if d == NO else 1 for d in decided]
    truth = [0 if y == NO else 1 for y in labels]
    tp = sum(1 for p, y in zip(pred, truth) if p == 1 and y == 1)
    fp = sum(1 for p, y in zip(pred, truth) if p == 1 and y == 0)
    tn = sum(1 for p, y in zip(pred, truth) if p == 0 and y == 0)
    fn = sum(1 for p, y in zip(pred, truth) if p == 0 and y == 1)
    out = {"TP": tp, "FP": fp, "TN": tn, "FN": fn, "Accuracy": None, "Precision": None,
           "Recall": None, "F1 score": None, "Yes ratio": pred.count(1) / len(pred)}
    try:
        precision, recall, f1 = script_prf(tp, fp, fn)
    except ZeroDivisionError:
        return {**out, "error": SCRIPT_STOPS}
    return {**out, "Accuracy": (tp + tn) / (tp + tn + fp + fn), "Precision": precision,
            "Recall": recall, "F1 score": f1}


def covers(family: FamilyFacts, config: Mapping) -> Coverage:
    """Any family: evaluate.py scores any run's answers, so the default prompt, at LLaVA's and
    lmms-eval's 128 tokens."""
    return Coverage("any (evaluate.py scores whatever was run): the default prompt",
                    family.default_template, 128)


PROTOCOL = Protocol(
    "pope-official", "RUCAIBox/POPE evaluate.py", "RUCAIBox/POPE 3df3ba1", "pope_official",
    pope_evaluate_metrics, "F1 score", False, str,
    ("evaluate.py l.9-21 (answer rule), l.23-62 (metrics, one split file)",),
    "POPE's evaluate.py per split file; it prescribes no prompt or generation", covers=covers)
