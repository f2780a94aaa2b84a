"""POPE metrics with their uncertainty.

Values are at full precision (tables round them for display only).

Conventions (stated once, used everywhere): an `unknown` answer is kept out of the confusion matrix
and counted on its own. Precision, recall, F1 and the yes-rate are computed over the answered
questions (the yes-rate is that of the *predictions*, not of the labels as in lmms-eval's
`pope_yes_ratio`); accuracy is over all questions, so an unknown never counts as correct.
"""
from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np

from .readouts import NO, UNKNOWN, YES


def _codes(values) -> np.ndarray:
    """yes → 1, no → 0, unknown → -1; anything else is a caller bug."""
    table = {YES: 1, NO: 0, UNKNOWN: -1}
    try:
        return np.fromiter((table[v] for v in values), dtype=np.int8)
    except KeyError as err:
        raise ValueError(f"not a decision: {err.args[0]!r}") from None


def _f1(tp, fp, fn):
    """Vectorised F1 = 2TP / (2TP + FP + FN); 0 where nothing is positive."""
    denom = 2 * tp + fp + fn
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


def confusion(labels, predictions) -> dict[str, int]:
    y, p = _codes(labels), _codes(predictions)
    if len(y) != len(p):
        raise ValueError(f"{len(y)} labels but {len(p)} predictions")
    if (y < 0).any():
        raise ValueError("a label is unknown")
    return {"tp": int(((p == 1) & (y == 1)).sum()), "tn": int(((p == 0) & (y == 0)).sum()),
            "fp": int(((p == 1) & (y == 0)).sum()), "fn": int(((p == 0) & (y == 1)).sum()),
            "unknown": int((p < 0).sum())}


def bootstrap_f1_ci(labels, predictions, *, seed: int = 0, resamples: int = 1000,
                    level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of F1, resampling questions (with their unknowns) with replacement."""
    y, p = _codes(labels), _codes(predictions)
    n = len(y)
    if n == 0:
        return [0.0, 0.0]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))  # [B, n] question indices per resample
    tp = ((p == 1) & (y == 1))[draws].sum(axis=1)
    fp = ((p == 1) & (y == 0))[draws].sum(axis=1)
    fn = ((p == 0) & (y == 1))[draws].sum(axis=1)
    f1 = _f1(tp, fp, fn)
    alpha = (1 - level) / 2
    low, high = np.quantile(f1, [alpha, 1 - alpha])
    return [float(low), float(high)]


def summarize(labels, predictions, *, seed: int = 0, resamples: int = 1000) -> dict:
    c = confusion(labels, predictions)
    answered = c["tp"] + c["tn"] + c["fp"] + c["fn"]
    precision = _ratio(c["tp"], c["tp"] + c["fp"])
    recall = _ratio(c["tp"], c["tp"] + c["fn"])
    return {**c,
            "accuracy": _ratio(c["tp"] + c["tn"], answered + c["unknown"]),
            "precision": precision,
            "recall": recall,
            "f1": float(_f1(np.int64(c["tp"]), c["fp"], c["fn"])),
            "f1_ci95": bootstrap_f1_ci(labels, predictions, seed=seed, resamples=resamples),
            "yes_rate": _ratio(c["tp"] + c["fp"], answered)}


def mcnemar_exact(labels, pred_a, pred_b) -> float:
    """Two-sided exact McNemar p-value for two readouts on the same questions.

    Only discordant questions count: b = a right and b wrong, c = the reverse (unknown is wrong).
    p = min(1, 2 · P[Binomial(b + c, 1/2) ≤ min(b, c)]), computed in exact rationals.
    """
    y, a, b_ = _codes(labels), _codes(pred_a), _codes(pred_b)
    right_a, right_b = a == y, b_ == y
    b = int((right_a & ~right_b).sum())
    c = int((~right_a & right_b).sum())
    n = b + c
    if n == 0:
        return 1.0
    tail = Fraction(sum(comb(n, k) for k in range(min(b, c) + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))
