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


def test_bootstrap_is_seeded_and_brackets_f1():
    labels = ["yes", "no"] * 150
    preds = ["yes" if i % 7 else "no" for i in range(300)]
    a = bootstrap_f1_ci(labels, preds, seed=3)
    assert a == bootstrap_f1_ci(labels, preds, seed=3)
    assert a != bootstrap_f1_ci(labels, preds, seed=4)
    f1 = summarize(labels, preds)["f1"]
    assert a[0] < f1 < a[1] and a[1] - a[0] < 0.2


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
