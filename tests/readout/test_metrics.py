import random

import numpy as np
import pytest

from pope_fast.readout import bootstrap_f1_ci, confusion, mcnemar_exact, summarize


def test_hand_computed_case():
    labels = ["yes", "yes", "yes", "no", "no", "no", "yes", "no"]
    preds = ["yes", "yes", "no", "yes", "no", "no", "unknown", "unknown"]
    m = summarize(labels, preds)
    assert (m["tp"], m["tn"], m["fp"], m["fn"], m["unknown"]) == (2, 2, 1, 1, 2)
    assert m["precision"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["recall"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["f1"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["accuracy"] == pytest.approx(4 / 8)     # an unknown is never correct
    assert m["yes_rate"] == pytest.approx(3 / 6, abs=1e-4)   # of the answered predictions


def test_all_yes_floor_and_all_no():
    labels = ["yes", "no"] * 50
    assert summarize(labels, ["yes"] * 100)["f1"] == pytest.approx(0.6667, abs=1e-4)
    assert summarize(labels, ["no"] * 100)["f1"] == 0.0


def test_confusion_rejects_bad_values():
    with pytest.raises(ValueError, match="not a decision"):
        confusion(["yes"], ["maybe"])
    with pytest.raises(ValueError, match="labels but"):
        confusion(["yes", "no"], ["yes"])


def _bootstrap_drawn_one_by_one(labels, predictions, seed, resamples):
    """The interval as the resampling defines it: the generator's [resamples, n] index matrix, each
    resample's TP, FP and FN summed over the questions it drew, the 2.5th and 97.5th percentiles of
    F1."""
    table = {"yes": 1, "no": 0, "unknown": -1}
    y, p = np.array([table[v] for v in labels]), np.array([table[v] for v in predictions])
    draws = np.random.default_rng(seed).integers(0, len(y), size=(resamples, len(y)))
    tp, fp, fn = (cell[draws].sum(axis=1)
                  for cell in ((p == 1) & (y == 1), (p == 1) & (y == 0), (p == 0) & (y == 1)))
    denom = 2 * tp + fp + fn
    f1 = np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)
    return [float(q) for q in np.quantile(f1, [0.025, 0.975])]


@pytest.mark.parametrize("n, seed, resamples", [(1, 0, 50), (7, 3, 1000), (301, 5, 999),
                                                (3000, 0, 1000)])
def test_bootstrap_is_the_resampling_drawn_one_by_one_to_the_bit(n, seed, resamples):
    """The counted form (one count matrix per group, shared by its readouts) against the sums of the
    drawn questions: equal floats, for readouts that answer, fail and leave unknowns, in any order
    of calls."""
    rng = np.random.default_rng(n)
    labels = list(rng.choice(["yes", "no"], size=n))
    readouts = [list(rng.choice(["yes", "no", "unknown"], size=n, p=[0.45, 0.45, 0.1])),
                ["yes"] * n, ["unknown"] * n, list(rng.choice(["yes", "no"], size=n))]
    for preds in readouts + readouts[::-1]:
        assert bootstrap_f1_ci(labels, preds, seed=seed, resamples=resamples) == \
            _bootstrap_drawn_one_by_one(labels, preds, seed, resamples)
    # another group of as many questions: same draws, its own labels
    other = labels[1:] + labels[:1]
    assert bootstrap_f1_ci(other, readouts[0], seed=seed, resamples=resamples) == \
        _bootstrap_drawn_one_by_one(other, readouts[0], seed, resamples)


def test_bootstrap_is_seeded_and_brackets_f1():
    labels = ["yes", "no"] * 150
    preds = ["yes" if i % 7 else "no" for i in range(300)]
    a = bootstrap_f1_ci(labels, preds, seed=3)
    assert a == bootstrap_f1_ci(labels, preds, seed=3)
    assert a != bootstrap_f1_ci(labels, preds, seed=4)
    f1 = summarize(labels, preds)["f1"]
    assert a[0] < f1 < a[1] and a[1] - a[0] < 0.2


def test_bootstrap_interval_is_the_95_percent_percentile_interval_by_definition():
    """bootstrap_f1_ci (and summarize's f1_ci95) from its definition, one resample at a time:
    resample r asks the questions of row r of numpy's [resamples, n] draw from the seed, unknown
    answers with their questions (out of the confusion matrix); the interval is F1's 2.5th and
    97.5th percentiles over the resamples, not a 90% one."""
    rng = random.Random(2)
    labels = [rng.choice(["yes", "no"]) for _ in range(60)]
    preds = [rng.choice(["yes", "yes", "no", "unknown"]) for _ in range(60)]
    f1s = []
    for row in np.random.default_rng(4).integers(0, 60, size=(500, 60)):
        count = lambda label, answer: sum(labels[i] == label and preds[i] == answer for i in row)
        tp, fp, fn = count("yes", "yes"), count("no", "yes"), count("yes", "no")
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    tail = (1 - 0.95) / 2
    expected = [float(q) for q in np.quantile(f1s, [tail, 1 - tail])]
    assert bootstrap_f1_ci(labels, preds, seed=4, resamples=500) == expected
    assert summarize(labels, preds, seed=4, resamples=500)["f1_ci95"] == expected
    ninety = np.quantile(f1s, [0.05, 0.95])
    # these data tell a 95% interval from a 90% one
    assert expected[0] < ninety[0] and ninety[1] < expected[1]


def test_mcnemar_counts_an_unknown_answer_as_wrong():
    # 9 questions labelled no: A unknown on 5 that B gets right (c = 5), A right on 1 that B gets
    # wrong (b = 1), both right on 3: p = 2 (C(6, 0) + C(6, 1)) / 2^6
    labels = ["no"] * 9
    a = ["unknown"] * 5 + ["no"] * 4
    b = ["no"] * 5 + ["yes"] + ["no"] * 3
    assert mcnemar_exact(labels, a, b) == mcnemar_exact(labels, b, a) == 14 / 64


def test_mcnemar_exact_values():
    labels = ["yes"] * 12
    a = ["yes"] * 10 + ["no"] * 2
    b = ["no"] * 10 + ["no"] * 2          # a right / b wrong on 10, no reverse discordance
    assert mcnemar_exact(labels, a, b) == pytest.approx(2 / 2**10)
    assert mcnemar_exact(labels, a, a) == 1.0
    # b=3, c=1: p = 2 * (C(4,0) + C(4,1)) / 16 = 0.625
    c = ["yes"] * 8 + ["no"] * 3 + ["yes"]
    d = ["yes"] * 8 + ["yes"] * 3 + ["no"]
    assert mcnemar_exact(labels, d, c) == pytest.approx(0.625)


def test_mcnemar_past_its_exact_size_is_the_same_tail_in_log_space(monkeypatch):
    """20,000 discordant questions (9,900 one way): the exact rational tail, summed here term by
    term from C(n, k + 1) = C(n, k) (n - k) / (k + 1); the summary's exact path gives it to the bit,
    its log-space path (used past EXACT_UP_TO, so 100,000 questions summarise in seconds) to 1e-9
    relative, and a lopsided split's p-value stays a tiny positive number there."""
    import pope_fast.readout.metrics as metrics

    b, c = 9_900, 10_100
    n = b + c
    term = total = 1
    for k in range(min(b, c)):
        term = term * (n - k) // (k + 1)
        total += term
    expected = float(2 * total / 2**n) if 2 * total < 2**n else 1.0
    labels, right_first, right_second = (["yes"] * n, ["yes"] * b + ["no"] * c,
                                         ["no"] * b + ["yes"] * c)
    assert mcnemar_exact(labels, right_first, right_second) == expected
    monkeypatch.setattr(metrics, "EXACT_UP_TO", 1_000)
    assert mcnemar_exact(labels, right_first, right_second) == pytest.approx(expected, rel=1e-9)
    lopsided = mcnemar_exact(["yes"] * 3_000, ["yes"] * 1_000 + ["no"] * 2_000,
                             ["no"] * 1_000 + ["yes"] * 2_000)
    assert 0 < lopsided < 1e-70


def test_bootstrap_draws_once_for_every_readout_of_a_group(monkeypatch):
    """score's summaries bootstrap each of a group's readouts: the [resamples, n] draws are made
    once, not per readout (a full POPE run: 4 groups of 3,000-9,000 questions, 11 readouts)."""
    from pope_fast.readout import metrics

    made = []
    real = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", lambda seed: (made.append(seed), real(seed))[1])
    metrics._resample_counts.cache_clear()
    labels = ["yes", "no"] * 40
    intervals = [bootstrap_f1_ci(labels, preds, seed=11)
                 for preds in (["yes"] * 80, ["no", "yes"] * 40, labels)]
    assert made == [11] and intervals[2] == [1.0, 1.0] and intervals[1] == [0.0, 0.0]
    bootstrap_f1_ci(labels[:79], labels[:79], seed=11)  # another group: its own draws
    assert made == [11, 11]
