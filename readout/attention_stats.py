"""Statistics of the image-attention probe: do wrong answers draw more image attention than right?

The paper's §5.3 probe (ugaa-research `analysis/diagnostic_stats.py`) averages each question's
image attention over layers 14-19 and compares correct with wrong answers (and TP with FP, TN with
FN): means, medians and standard deviations, the difference of means with a percentile bootstrap
interval, Cohen's d with the pooled standard deviation, and a two-sided Mann-Whitney U test. Here
the p-value is the normal approximation with the tie correction and a continuity correction (scipy's
"asymptotic" method), stated in every result as `mann_whitney_method`.
"""
from __future__ import annotations

import math

import numpy as np

from .readouts import NO, YES

PAPER_LAYERS = (14, 19)  # inclusive; the paper's layers [14:20] of a 32-layer model


def default_layers(num_layers: int) -> tuple[int, int]:
    """The paper's 14-19 on 32-layer models; elsewhere the middle fifth (inclusive bounds)."""
    if num_layers == 32:
        return PAPER_LAYERS
    width = max(1, round(num_layers / 5))
    start = (num_layers - width) // 2
    return start, start + width - 1


def parse_layers(text: str | None) -> tuple[int, int] | None:
    """'FIRST-LAST' (inclusive, e.g. 14-19) → (first, last); None stays None (the default)."""
    if text is None:
        return None
    first, sep, last = text.partition("-")
    if not (sep and first.strip().isdigit() and last.strip().isdigit()) or int(first) > int(last):
        raise ValueError(f"--layers takes FIRST-LAST (e.g. 14-19), not {text!r}")
    return int(first), int(last)


def layer_mean(values: list[float], layers: tuple[int, int]) -> float:
    first, last = layers
    if not 0 <= first <= last < len(values):
        raise ValueError(f"layers {first}-{last} lie outside the probe's {len(values)} layers")
    return float(np.mean(values[first:last + 1]))


def describe(x: np.ndarray) -> dict:
    if not len(x):
        return {"n": 0, "mean": None, "median": None, "sd": None}
    return {"n": int(len(x)), "mean": round(float(x.mean()), 6),
            "median": round(float(np.median(x)), 6),
            "sd": round(float(x.std(ddof=1)), 6) if len(x) > 1 else None}


def cohens_d(a: np.ndarray, b: np.ndarray) -> float | None:
    """(mean a - mean b) / pooled sd, the pooled variance weighting each group's by its n - 1."""
    if len(a) < 2 or len(b) < 2:
        return None
    pooled = ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2)
    return None if pooled == 0 else float((a.mean() - b.mean()) / math.sqrt(pooled))


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sided p of the Mann-Whitney U test: normal approximation, tie-corrected variance,
    continuity correction 0.5."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        return None
    values = np.concatenate([a, b])
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]  # ties share their average rank
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - float((counts**3 - counts).sum()) / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


def bootstrap_difference(a: np.ndarray, b: np.ndarray, *, seed: int,
                         resamples: int) -> list[float] | None:
    """Percentile 95% interval of mean(a) - mean(b), each group resampled with replacement."""
    if not len(a) or not len(b) or resamples < 1:
        return None
    rng = np.random.default_rng(seed)
    draws_a = rng.integers(0, len(a), (resamples, len(a)))
    draws_b = rng.integers(0, len(b), (resamples, len(b)))
    diffs = a[draws_a].mean(1) - b[draws_b].mean(1)
    low, high = np.quantile(diffs, [0.025, 0.975])
    return [round(float(low), 6), round(float(high), 6)]


def compare(a: np.ndarray, b: np.ndarray, *, seed: int, resamples: int) -> dict:
    """Group a against group b: both described, the difference of means (a - b) with its interval,
    Cohen's d and the Mann-Whitney p."""
    d = cohens_d(a, b)
    p = mann_whitney_p(a, b)
    return {"a": describe(a), "b": describe(b),
            "mean_difference": round(float(a.mean() - b.mean()), 6) if len(a) and len(b) else None,
            "mean_difference_ci95": bootstrap_difference(a, b, seed=seed, resamples=resamples),
            "cohens_d": None if d is None else round(d, 4),
            "mann_whitney_p": None if p is None else float(f"{p:.4g}"),
            "mann_whitney_method": "normal approximation, tie-corrected, continuity 0.5"}


def attention_by_outcome(attention: list[float], labels: list[str], predictions: list[str], *,
                         seed: int, resamples: int) -> dict:
    """Correct vs wrong, TP vs FP, TN vs FN (unknown answers left out), each group a against b in
    that order, of per-question image attention already averaged over the chosen layers."""
    x = np.asarray(attention, dtype=np.float64)
    y, p = np.asarray(labels), np.asarray(predictions)
    answered = (p == YES) | (p == NO)
    groups = {"correct_vs_wrong": (answered & (p == y), answered & (p != y)),
              "tp_vs_fp": ((p == YES) & (y == YES), (p == YES) & (y == NO)),
              "tn_vs_fn": ((p == NO) & (y == NO), (p == NO) & (y == YES))}
    return {name: compare(x[a], x[b], seed=seed, resamples=resamples)
            for name, (a, b) in groups.items()}
