"""What a yes-bias alone can give: the bias-aware statistics `compare` adds for a pair's logit
readouts.

A method that only moves answers toward "yes" changes F1 on POPE without ranking the questions any
better (the "Mirage of Performance Gains", arXiv 2504.10020). From the candidate logits both runs
record, per question:

- the margin, max yes logit - max no logit (the readout answers yes exactly where it is > 0), and
  the yes probability, the softmax over the readout's yes and no candidates together (sum over yes
  ids of e^l over the sum over the union of both sets); where a run recorded the answer position's
  log-sum-exp over the whole vocabulary (--record-mass), the probability mass outside the
  candidates, 1 - sum over the union of e^(l - logsumexp);
- the bias-only control: A's own margins with one threshold moved so that A answers yes as often as
  B does (the k_B questions of largest A margin, equal margins taken in question order), scored
  beside B;
- AUROC and AUPRC of the margin against the labels (yes positive), which a shift of every margin by
  one constant leaves as they are; ECE over ECE_BINS equal-width bins and the Brier score of the yes
  probability, and the mean mass outside the candidates.

Questions whose margin either run cannot give (readouts.undecidable's reasons, or no candidate
logits) are left out of all of these, each side's count by reason stated. Intervals resample IMAGES,
every question of an image together, the same draws for A, B and the control: POPE asks several
questions of each image, and answers about one image move together, so resampling questions alone
would overstate the certainty.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .metrics import ratios, resample_weights
from .readouts import YES, TokenSets, undecidable

LEVEL = 0.95
ECE_BINS = 10  # equal width on [0, 1]: bin b holds b/10 <= p < (b+1)/10, the last one p = 1 too
# a record that lacks a candidate id's logit (an imported file's stored answer)
NO_LOGITS = "no candidate logits"
NO_GAIN, THRESHOLD_ALONE, BEYOND_THRESHOLD = "no gain", "threshold alone", "beyond threshold"
# each run's statistics, and B - A's
COMPARED = ("yes_rate", "auroc", "auprc", "ece", "brier", "outside")


def scores(logits: dict[int, float] | None, sets: TokenSets | None) -> tuple[float, float] | str:
    """(margin, yes probability) of one answer, or why it has none (an undecidable reason,
    NO_LOGITS). The margin is +inf or -inf where one side alone was cut, as compare_max_logits lets
    the other side win."""
    if sets is None or logits is None or any(i not in logits for i in sets.ids):
        return NO_LOGITS
    reason = undecidable(logits, sets)
    if reason is not None:
        return reason
    margin = (max(float(logits[i]) for i in sets.yes_ids)
              - max(float(logits[i]) for i in sets.no_ids))
    top = max(float(logits[i]) for i in sets.ids)  # finite: undecidable rules out all of them -inf
    mass = {i: math.exp(float(logits[i]) - top) for i in sets.ids}
    return margin, sum(mass[i] for i in set(sets.yes_ids)) / sum(mass.values())


def outside(logits: dict[int, float], sets: TokenSets, logsumexp: float | None) -> float | None:
    """The probability mass outside the readout's candidates (its yes and no ids together, each
    once) at the answer position: 1 - sum of e^(l - logsumexp); None where the record holds no
    logsumexp (no --record-mass)."""
    if logsumexp is None:
        return None
    return 1 - sum(math.exp(float(logits[i]) - logsumexp) for i in sets.ids)


def image_clusters(entries) -> np.ndarray:
    """[n] cluster index per question: one cluster per (dataset, image); a record that names no
    image is its own."""
    index: dict[tuple, int] = {}
    return np.array([index.setdefault((e.dataset, e.image) if e.image is not None else (None, i),
                                      len(index))
                     for i, e in enumerate(entries)], dtype=np.int64)


def cluster_weights(clusters: np.ndarray, seed: int, resamples: int) -> np.ndarray:
    """[resamples, n]: how often each resample draws each question. Each resample draws as many
    clusters as there are, with replacement (metrics.resample_weights over the clusters), and a
    question counts as often as its cluster is drawn."""
    if not len(clusters):
        return np.zeros((resamples, 0))
    return resample_weights(int(clusters.max()) + 1, seed, resamples)[:, clusters]


def decision_rates(w: np.ndarray, yes: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per row of weights [R, n]: yes-rate, F1 and accuracy of the yes/no decisions `yes` vs `y`."""
    tp, fp = w @ (yes & y), w @ (yes & ~y)
    fn, tn = w @ (~yes & y), w @ (~yes & ~y)
    total = w.sum(axis=1)
    return {"yes_rate": ratios(tp + fp, total), "f1": ratios(2 * tp, 2 * tp + fp + fn),
            "accuracy": ratios(tp + tn, total)}


def ranking(w: np.ndarray, score: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per row of weights [R, n]: AUROC (the Mann-Whitney count, a tie counted 1/2) and AUPRC
    (average precision: the precision at each distinct score, highest first, weighted by the recall
    it adds) of `score` against `y`; NaN where a row holds no positive or no negative."""
    order = np.argsort(-score, kind="stable")
    ranked = score[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])  # one group per distinct score
    drawn = w[:, order]
    pos = np.add.reduceat(drawn * y[order], starts, axis=1)  # [R, groups], highest score first
    neg = np.add.reduceat(drawn, starts, axis=1) - pos
    total_pos, total_neg = pos.sum(axis=1), neg.sum(axis=1)
    fp = np.cumsum(neg, axis=1)  # negatives at or above each group's score: the rest lie below
    with np.errstate(invalid="ignore", divide="ignore"):
        auroc = 1 - (pos * (fp - neg / 2)).sum(axis=1) / (total_pos * total_neg)
        tp = np.cumsum(pos, axis=1)
        auprc = (pos * ratios(tp, tp + fp)).sum(axis=1) / total_pos
    undefined = (total_pos == 0) | (total_neg == 0)
    return {"auroc": np.where(undefined, np.nan, auroc),
            "auprc": np.where(undefined, np.nan, auprc)}


def calibration(w: np.ndarray, p: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per row of weights [R, n]: ECE (sum over bins of |yes labels - yes probability| over all
    questions) and the Brier score, mean (p - y)^2."""
    bins = np.minimum((p * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    member = np.eye(ECE_BINS)[bins]  # [n, bins]
    total = w.sum(axis=1)
    ece = ratios(np.abs(w @ (member * (y - p)[:, None])).sum(axis=1), total)
    return {"ece": ece, "brier": ratios(w @ (p - y) ** 2, total)}


def matched_control(margins: np.ndarray, k: int) -> tuple[np.ndarray, float | None, int]:
    """A's yes answers at B's yes count k: the k questions of largest margin, equal margins in
    question order (the order given). Returns them, the threshold (the smallest margin answered yes;
    None where k = 0) and how many questions at that margin were left no by the order."""
    order = np.lexsort((np.arange(len(margins)), -margins))
    yes = np.zeros(len(margins), dtype=bool)
    yes[order[:k]] = True
    if k == 0:
        return yes, None, 0
    threshold = float(margins[order[k - 1]])
    return yes, threshold, int(((margins == threshold) & ~yes).sum())


def _interval(values: np.ndarray) -> list[float] | None:
    """Percentile interval over the resamples where the statistic is defined; None where never."""
    kept = values[~np.isnan(values)]
    tail = (1 - LEVEL) / 2
    return [float(q) for q in np.quantile(kept, [tail, 1 - tail])] if len(kept) else None


def _value(x) -> float | None:
    return None if math.isnan(x) else float(x)


def _side(entries, sets) -> tuple[list, Counter]:
    got = [scores(e.candidate_logits, sets) for e in entries]
    return got, Counter(g for g in got if isinstance(g, str))


def bias_statistics(labels: list[str], entries_a, sets_a: TokenSets | None, entries_b,
                    sets_b: TokenSets | None, weights: np.ndarray) -> dict:
    """One logit readout's bias-aware comparison of A and B on the questions both answered
    (`weights`: [R, n] resample weights of those questions, cluster_weights of their images). See
    the module's docstring."""
    got_a, why_a = _side(entries_a, sets_a)
    got_b, why_b = _side(entries_b, sets_b)
    keep = np.array([not isinstance(x, str) and not isinstance(z, str)
                     for x, z in zip(got_a, got_b)], dtype=bool)
    kept = np.flatnonzero(keep)
    result = {"n": len(kept), "excluded": {"a": dict(why_a.most_common()),
                                           "b": dict(why_b.most_common()),
                                           "either": int((~keep).sum())},
              "images": len(set(image_clusters([entries_a[i] for i in kept])))}
    if not len(kept):
        return result
    y = np.array([labels[i] == YES for i in kept])
    margin_a, p_a = (np.array(v) for v in zip(*(got_a[i] for i in kept)))
    margin_b, p_b = (np.array(v) for v in zip(*(got_b[i] for i in kept)))
    w = np.vstack([np.ones(len(kept)), weights[:, kept]])  # row 0: the questions as they are
    yes_a, yes_b = margin_a > 0, margin_b > 0
    control, threshold, ties = matched_control(margin_a, int(yes_b.sum()))
    sides = (("a", yes_a, margin_a, p_a, entries_a, sets_a),
             ("b", yes_b, margin_b, p_b, entries_b, sets_b))
    stats = {side: {**decision_rates(w, yes, y), **ranking(w, margin, y), **calibration(w, p, y),
                    "outside": _mean_outside(w, [entries[i] for i in kept], sets)}
             for side, yes, margin, p, entries, sets in sides}
    stats["control"] = decision_rates(w, control, y)
    beyond = {m: stats["b"][m] - stats["control"][m] for m in ("f1", "accuracy")}
    delta = {m: stats["b"][m] - stats["a"][m] for m in COMPARED}
    beyond_ci = {m: _interval(v[1:]) for m, v in beyond.items()}
    result.update({side: {m: _value(v[0]) for m, v in stats[side].items()} for side in ("a", "b")})
    result["control"] = {**{m: float(v[0]) for m, v in stats["control"].items()},
                         "threshold": threshold, "ties_left_no": ties}
    result.update({"delta": {m: _value(v[0]) for m, v in delta.items()},
                   "delta_ci95": {m: _interval(v[1:]) for m, v in delta.items()},
                   "beyond_control": {m: float(v[0]) for m, v in beyond.items()},
                   "beyond_control_ci95": beyond_ci,
                   "gain": gain(*(stats[k]["f1"][0] for k in ("a", "b", "control")),
                                beyond_ci["f1"])})
    return result


def _mean_outside(w: np.ndarray, entries, sets: TokenSets) -> np.ndarray:
    """Per row of weights [R, n]: the mean mass outside the candidates; NaN lacking a logsumexp."""
    mass = [outside(e.candidate_logits, sets, e.logsumexp) for e in entries]
    if any(m is None for m in mass):
        return np.full(len(w), np.nan)
    return ratios(w @ np.array(mass, dtype=float), w.sum(axis=1))


def gain(f1_a: float, f1_b: float, f1_control: float, beyond_f1_ci: list[float] | None) -> str:
    """NO_GAIN where B's F1 is not above A's; BEYOND_THRESHOLD where B's F1 is above the control's
    and the interval of F1(B) - F1(control) lies wholly above 0; else THRESHOLD_ALONE: moving A's
    threshold to B's yes-rate gives B's gain, or cannot be told from it (B's F1 at or below the
    control's, or the interval reaching 0)."""
    if f1_b <= f1_a:
        return NO_GAIN
    above = f1_b > f1_control and beyond_f1_ci is not None and beyond_f1_ci[0] > 0
    return BEYOND_THRESHOLD if above else THRESHOLD_ALONE
