"""The probe's statistics against direct computations on known inputs."""
import math

import numpy as np
import pytest

from pope_fast.readout.attention_stats import (attention_by_outcome, bootstrap_difference, cohens_d,
                                               default_layers,
                                               layer_mean, mann_whitney_p)

A = np.array([0.1, 0.2, 0.2, 0.35, 0.5, 0.5, 0.7])
B = np.array([0.3, 0.45, 0.5, 0.6, 0.65, 0.8, 0.9, 0.95])


def test_cohens_d_uses_the_pooled_sd():
    assert cohens_d(np.array([1.0, 2.0, 3.0]), np.array([2.0, 3.0, 4.0])) == pytest.approx(-1.0)
    pooled = math.sqrt((6 * A.var(ddof=1) + 7 * B.var(ddof=1)) / 13)
    assert cohens_d(A, B) == pytest.approx((A.mean() - B.mean()) / pooled)
    assert cohens_d(A[:1], B) is None  # no sd from one value


def test_mann_whitney_normal_approximation_with_ties():
    # [1, 2] vs [3, 4]: U = 0, mean 2, variance 2 * 2 / 12 * 5, |U - 2| - 0.5 = 1.5
    assert mann_whitney_p(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == pytest.approx(
        math.erfc(1.5 / math.sqrt(20 / 12) / math.sqrt(2)))
    # with ties across the groups (0.5 three times): scipy.stats.mannwhitneyu(A, B,
    # method="asymptotic", use_continuity=True) gives 0.05510010236812434
    assert mann_whitney_p(A, B) == pytest.approx(0.05510010236812434, rel=1e-12)
    assert mann_whitney_p(A, B) == pytest.approx(mann_whitney_p(B, A), rel=1e-12)  # two-sided


def test_bootstrap_interval_is_seeded_and_brackets_the_difference():
    first = bootstrap_difference(A, B, seed=42, resamples=2000)
    assert first == bootstrap_difference(A, B, seed=42, resamples=2000)
    assert first != bootstrap_difference(A, B, seed=43, resamples=2000)
    assert first[0] < A.mean() - B.mean() < first[1]


def test_groups_by_outcome_leave_unknowns_out():
    attention = [0.9, 0.8, 0.1, 0.2, 0.5, 0.3]
    labels = ["yes", "no", "yes", "no", "yes", "no"]
    predictions = ["yes", "yes", "no", "no", "unknown", "no"]
    out = attention_by_outcome(attention, labels, predictions, seed=0, resamples=100)
    # the unknown is out
    assert out["correct_vs_wrong"]["a"]["n"] == 3 and out["correct_vs_wrong"]["b"]["n"] == 2
    assert out["tp_vs_fp"]["a"]["mean"] == 0.9 and out["tp_vs_fp"]["b"]["mean"] == 0.8
    assert (out["tn_vs_fn"]["a"]["mean"] == pytest.approx(0.25)
            and out["tn_vs_fn"]["b"]["mean"] == 0.1)
    assert out["correct_vs_wrong"]["mean_difference"] == pytest.approx(
        (0.9 + 0.2 + 0.3) / 3 - (0.8 + 0.1) / 2, abs=1e-6)


def test_layer_ranges():
    assert default_layers(32) == (14, 19)  # the paper's
    assert default_layers(40) == (16, 23) and default_layers(2) == (0, 0)
    assert layer_mean([0.0, 1.0, 2.0, 3.0], (1, 2)) == 1.5
    with pytest.raises(ValueError, match="outside"):
        layer_mean([0.1, 0.2], (1, 2))


def test_score_reports_the_probe_by_outcome(tmp_path):
    """Records with image_attention: score's image_attention section equals the direct computation
    on the per-question layer means, per readout; the CLI prints the right-vs-wrong table and takes
    --layers."""
    import json

    from click.testing import CliRunner

    from pope_fast.cli import main
    from pope_fast.readout import Question, TokenSets, make_record, read_records, score_records
    from pope_fast.store import RecordWriter, write_meta

    rng = np.random.default_rng(5)
    sets = {"legacy_2tok": TokenSets((5,), (6,))}
    folder = tmp_path / "run"
    folder.mkdir()
    write_meta(folder, {"token_sets": {n: s.to_json() for n, s in sets.items()}})
    records, layers = [], []
    for i in range(1, 41):
        q = Question(i, f"img{i // 6}.jpg", "Is there a dog?", "yes" if i % 2 else "no",
                     "adversarial")
        attention = rng.uniform(0, 0.5, size=6).tolist()
        logits = {5: float(rng.normal()), 6: float(rng.normal())}
        records.append(make_record(q, "llava_plain", first_token_id=5, candidate_logits=logits,
                                   probe={"image_attention": attention}))
        layers.append(attention)
    with RecordWriter(folder) as w:
        w.write(records)
    [run] = score_records(read_records(folder), ["legacy_2tok"], seed=3, resamples=300,
                          layers=(2, 4))
    table = run["image_attention"]
    assert table["layers"] == [2, 4] and table["num_layers"] == 6
    labels = [r["label"] for r in records]
    predictions = ["yes" if r["candidate_logits"]["5"] > r["candidate_logits"]["6"] else "no"
                   for r in records]
    expected = attention_by_outcome([float(np.mean(a[2:5])) for a in layers], labels, predictions,
                                    seed=3, resamples=300)
    assert table["readouts"]["legacy_2tok"] == expected
    assert expected["correct_vs_wrong"]["a"]["n"] + expected["correct_vs_wrong"]["b"]["n"] == 40
    [default] = score_records(read_records(folder), ["legacy_2tok"])
    assert default["image_attention"]["layers"] == [2, 2]  # the middle fifth of 6 layers: one layer
    out = CliRunner().invoke(main, ["score", str(folder), "--layers", "2-4", "--readouts",
                                    "legacy_2tok"])
    assert out.exit_code == 0, out.output
    assert "image attention, layers 2-4 of 6" in out.output and "legacy_2tok" in out.output
    bad = CliRunner().invoke(main, ["score", str(folder), "--layers", "4-2"])
    assert bad.exit_code != 0 and "--layers takes FIRST-LAST" in bad.output
    as_json = json.loads(CliRunner().invoke(main, ["score", str(folder), "--format", "json",
                                                   "--layers", "2-4", "--readouts", "legacy_2tok",
                                                   "--seed", "3", "--resamples", "300"]).output)
    assert as_json["runs"][0]["image_attention"]["readouts"]["legacy_2tok"] == expected
