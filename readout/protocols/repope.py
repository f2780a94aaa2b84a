"""RePOPE's src/evaluate.py (YanNeu/RePOPE bcf22e5): POPE's questions scored under its labels and
POPE's. It prescribes no prompt or length, so it only scores (`eval --protocol` does not take
it)."""
from __future__ import annotations

from ..readouts import NO, YES
from .base import Protocol, count
from .pope_official import SCRIPT_STOPS, script_prf


def repope_metrics(labels: list[str], decided: list[str]) -> dict:
    """RePOPE's compute_results (YanNeu/RePOPE bcf22e5 src/eval_utils.py l.37-79), one subset: an
    answer compute_answer left None (unknown) is in none of TP/FP/TN/FN (l.49-56), so it leaves
    accuracy's and the yes-ratio's denominators too (l.65-66); precision, recall, F1 2PR/(P+R) in
    its order of operations. Fractions. `unknown` counts the answers left out (the script prints
    none). Where it divides by zero (no yes answer, or none right) it stops with ZeroDivisionError:
    those values are None, `error` says so."""
    tp, fp = count(labels, decided, YES, YES), count(labels, decided, NO, YES)
    tn, fn = count(labels, decided, NO, NO), count(labels, decided, YES, NO)
    out = {"TP": tp, "FP": fp, "TN": tn, "FN": fn, "Precision": None, "Recall": None, "F1": None,
           "ACC": None, "Yes Ratio": None, "unknown": sum(1 for d in decided if d not in (YES, NO))}
    try:
        precision, recall, f1 = script_prf(tp, fp, fn)
    except ZeroDivisionError:
        return {**out, "error": SCRIPT_STOPS}
    return {**out, "Precision": precision, "Recall": recall, "F1": f1,
            "ACC": (tp + tn) / (tp + tn + fp + fn), "Yes Ratio": (tp + fp) / (tp + tn + fp + fn)}


PROTOCOL = Protocol(
    "repope", "RePOPE's src/evaluate.py (POPE's questions, its labels and POPE's)",
    "YanNeu/RePOPE bcf22e5", "repope", repope_metrics, "F1", False, str,
    ("src/eval_utils.py l.5-13 (compute_answer), l.37-79 (compute_results, per subset)",
     "src/evaluate.py l.55-67 (one set of responses scored under POPE's and RePOPE's labels)"),
    "its results JSON per subset (TP, FP, TN, FN, Precision, Recall, F1, ACC, Yes Ratio), for "
    "POPE's labels and, with score --labels annotations/coco_repope_{split}.json, RePOPE's",
    unprescribed="RePOPE prescribes no prompt or length: each of its evaluators (src/vlms/) runs "
                 "the model's own code on POPE's question text, with its own max_new_tokens (15 to "
                 "1024): this run's are unchecked")
