"""The bias-aware comparison (readout/bias.py): every number against a computation written here from
its definition (the Mann-Whitney count, average precision over distinct thresholds, ECE's bins,
resamples of images expanded into their questions), and through `compare` and its markdown (the
report's section: tests/readout/test_report.py)."""
import json
import math
from itertools import product

import numpy as np
import pytest

from pope_fast.readout import (Entry, Question, TokenSets, compare_runs, format_compare,
                               make_record, read_records)
from pope_fast.readout.bias import (BEYOND_THRESHOLD, NO_GAIN, NO_LOGITS, THRESHOLD_ALONE,
                                    bias_statistics, calibration, cluster_weights, image_clusters,
                                    matched_control, ranking, scores)
from pope_fast.readout.readouts import ALL_CUT, NON_FINITE
from pope_fast.store import RecordWriter, write_meta

SETS = TokenSets((1, 2), (3, 4))
INF = math.inf


def _mann_whitney(score, y) -> float:
    pos = [s for s, t in zip(score, y) if t]
    neg = [s for s, t in zip(score, y) if not t]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in product(pos, neg))
    return wins / (len(pos) * len(neg))


def _average_precision(score, y) -> float:
    """Sum over distinct thresholds t, highest first, of (recall(>= t) - recall before) ·
    precision(>= t)."""
    total, ap, recall_before = sum(y), 0.0, 0.0
    for t in sorted(set(score), reverse=True):
        picked = [yy for s, yy in zip(score, y) if s >= t]
        recall = sum(picked) / total
        ap += (recall - recall_before) * sum(picked) / len(picked)
        recall_before = recall
    return ap


def _f1(yes, y) -> float:
    tp = sum(a and b for a, b in zip(yes, y))
    fp = sum(a and not b for a, b in zip(yes, y))
    fn = sum(not a and b for a, b in zip(yes, y))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def test_margin_is_max_yes_minus_max_no_and_the_yes_probability_a_softmax_over_both_sets():
    logits = {1: 2.0, 2: 0.5, 3: 1.0, 4: -INF}
    margin, p = scores(logits, SETS)
    assert margin == 1.0
    assert p == pytest.approx(
        (math.exp(2) + math.exp(0.5)) / (math.exp(2) + math.exp(0.5) + math.exp(1)), abs=1e-15)
    # the cut left no yes: no wins
    assert scores({1: -INF, 2: -INF, 3: 0.3, 4: -1.0}, SETS) == (-INF, 0.0)
    assert scores({1: -INF, 2: -INF, 3: -INF, 4: -INF}, SETS) == ALL_CUT
    assert scores({1: math.nan, 2: 0.0, 3: 0.0, 4: 0.0}, SETS) == NON_FINITE
    assert scores({1: 0.0, 2: 0.0, 3: 0.0}, SETS) == NO_LOGITS and scores(None, SETS) == NO_LOGITS


def test_auroc_is_the_mann_whitney_count_with_ties_half_and_auprc_the_average_precision():
    score = np.array([2.0, 0.5, 0.5, -1.0, 0.5, INF, -INF, 3.0, -1.0, 0.0])
    y = np.array([1, 0, 1, 0, 1, 1, 0, 0, 1, 0], dtype=bool)
    got = ranking(np.ones((1, len(y))), score, y)
    assert got["auroc"][0] == pytest.approx(_mann_whitney(score, y), abs=1e-15)
    assert got["auprc"][0] == pytest.approx(_average_precision(list(score), list(y)), abs=1e-15)
    # by hand: 4 + 3.5 + 3.5 + 5 + 1.5 (ties at 0.5 and -1 a half each)
    assert _mann_whitney(score, y) == 17.5 / 25
    # a constant added to every score ranks the questions the same: AUROC and AUPRC stay exactly as
    # they were
    shifted = ranking(np.ones((1, len(y))), score + 7.25, y)
    assert (shifted["auroc"][0], shifted["auprc"][0]) == (got["auroc"][0], got["auprc"][0])
    # no negative
    assert np.isnan(ranking(np.ones((1, 3)), score[:3], np.ones(3, dtype=bool))["auroc"][0])


def test_ece_over_ten_equal_bins_and_brier_from_their_definitions():
    p = np.array([0.0, 0.05, 0.1, 0.35, 0.5, 0.55, 0.95, 1.0, 0.99, 0.12])
    y = np.array([0, 0, 1, 0, 1, 1, 1, 1, 0, 0], dtype=bool)
    got = calibration(np.ones((1, len(p))), p, y)
    assert got["ece"][0] == pytest.approx(_ece(p, y), abs=1e-15)
    assert got["brier"][0] == pytest.approx(sum((pi - yi) ** 2 for pi, yi in zip(p, y)) / len(p),
                                            abs=1e-15)


def test_control_takes_the_largest_margins_with_ties_in_question_order():
    margins = np.array([0.5, 2.0, 0.5, -1.0, 0.5])
    yes, threshold, ties = matched_control(margins, 3)
    assert yes.tolist() == [True, True, True, False, False] and threshold == 0.5 and ties == 1
    yes, threshold, ties = matched_control(margins, 0)
    assert not yes.any() and threshold is None and ties == 0
    assert matched_control(margins, 5)[0].all()


def _entries(margins, labels, images=None, cut=()):
    """Entries whose template sets (yes 1, 2; no 3, 4) give these margins; indices in `cut`: every
    candidate -inf."""
    out = []
    for i, (m, label) in enumerate(zip(margins, labels)):
        logits = ({1: -INF, 2: -INF, 3: -INF, 4: -INF} if i in cut
                  else {1: float(m), 2: -5.0, 3: 0.0, 4: -6.0})
        out.append(Entry(str(i), "random", label, dataset="coco", candidate_logits=logits,
                         image=None if images is None else images[i]))
    return out


def _images_resampled(statistic, images, seed, resamples):
    """The statistic on each resample built by hand: images drawn with replacement as
    cluster_weights draws them, each drawn image bringing all of its questions; the 95% percentile
    interval."""
    names = list(dict.fromkeys(images))
    draws = np.random.default_rng(seed).integers(0, len(names), size=(resamples, len(names)))
    values = [statistic([i for k in row for i in range(len(images)) if images[i] == names[k]])
              for row in draws]
    return list(np.quantile(values, [0.025, 0.975]))


def _ece(p, y) -> float:
    total = 0.0
    for b in range(10):
        inside = [i for i in range(len(p))
                  if b / 10 <= p[i] < (b + 1) / 10 or (b == 9 and p[i] == 1.0)]
        if inside:
            total += len(inside) / len(p) * abs(np.mean([y[i] for i in inside])
                                                - np.mean([p[i] for i in inside]))
    return total


def _by_hand(margins, y, yes=None) -> dict:
    """Every statistic of one side from its definition; `yes`: decisions other than margin > 0 (the
    control)."""
    yes = [m > 0 for m in margins] if yes is None else yes
    p = [(math.exp(m) + math.exp(-5)) / (math.exp(m) + math.exp(-5) + 1 + math.exp(-6))
         for m in margins]
    return {"yes_rate": sum(yes) / len(y), "f1": _f1(yes, y),
            "accuracy": sum(a == t for a, t in zip(yes, y)) / len(y),
            "auroc": _mann_whitney(margins, y), "auprc": _average_precision(list(margins), y),
            "ece": _ece(p, y),
            "brier": sum((pi - t) ** 2 for pi, t in zip(p, y)) / len(y), "outside": None}


def test_statistics_and_image_intervals_against_resamples_built_by_hand():
    rng = np.random.default_rng(5)
    n = 36
    images = [f"img{i // 6}.jpg" for i in range(n)]
    labels = ["yes" if rng.random() < 0.5 else "no" for _ in range(n)]
    y = [label == "yes" for label in labels]
    ma, mb = rng.normal(0, 1, n).round(2), rng.normal(0.5, 1, n).round(2)
    a, b = _entries(ma, labels, images), _entries(mb, labels, images)
    s = bias_statistics(labels, a, SETS, b, SETS,
                        cluster_weights(image_clusters(a), seed=3, resamples=60))
    assert (s["n"], s["images"], s["excluded"]) == (n, 6, {"a": {}, "b": {}, "either": 0})
    k = int(sum(mb > 0))
    top = sorted(range(n), key=lambda i: (-ma[i], i))[:k]
    control = [i in top for i in range(n)]
    for side, margins in (("a", ma), ("b", mb)):
        assert s[side] == pytest.approx(_by_hand(margins, y), abs=1e-14)
    hand = _by_hand(ma, y, control)
    assert s["control"] == pytest.approx({**{m: hand[m] for m in ("yes_rate", "f1", "accuracy")},
                                          "threshold": ma[top[-1]], "ties_left_no": 0}, abs=1e-14)
    assert s["control"]["yes_rate"] == s["b"]["yes_rate"]

    def shift(metric, rows, control_side=False):
        ys = [y[i] for i in rows]
        other = _by_hand(ma[rows], ys, [control[i] for i in rows] if control_side else None)
        return _by_hand(mb[rows], ys)[metric] - other[metric]

    for m in ("yes_rate", "auroc", "auprc", "ece", "brier"):
        assert s["delta"][m] == pytest.approx(shift(m, list(range(n))), abs=1e-14)
        assert s["delta_ci95"][m] == pytest.approx(
            _images_resampled(lambda rows: shift(m, rows), images, 3, 60), abs=1e-12)
    for m in ("f1", "accuracy"):
        assert s["beyond_control"][m] == pytest.approx(shift(m, list(range(n)), True), abs=1e-14)
        assert s["beyond_control_ci95"][m] == pytest.approx(
            _images_resampled(lambda rows: shift(m, rows, True), images, 3, 60), abs=1e-12)


def test_a_shift_of_every_margin_is_labelled_threshold_alone_and_leaves_auroc_equal():
    rng = np.random.default_rng(11)
    n = 60
    labels = ["yes" if i % 2 else "no" for i in range(n)]
    ma = (rng.normal(0, 1, n) + np.array([0.8 if i % 2 else 0.0 for i in range(n)]) - 1.2).round(3)
    images = [f"i{i // 3}" for i in range(n)]
    # B: A moved toward yes by 1
    a, b = _entries(ma, labels, images), _entries(ma + 1.0, labels, images)
    s = bias_statistics(labels, a, SETS, b, SETS, cluster_weights(image_clusters(a), 0, 200))
    assert s["b"]["f1"] > s["a"]["f1"] and s["b"]["yes_rate"] > s["a"]["yes_rate"]
    assert (s["delta"]["auroc"] == 0 and s["delta_ci95"]["auroc"] == [0.0, 0.0]
            and s["delta"]["auprc"] == 0)
    assert s["b"]["f1"] == s["control"]["f1"] and s["gain"] == THRESHOLD_ALONE
    # a B that ranks the questions better, at A's own yes-rate, gains beyond what the threshold
    # gives
    better = _entries(np.where([label == "yes" for label in labels], 1.0, -1.0)
                      * (np.abs(ma) + 0.1), labels, images)
    s = bias_statistics(labels, a, SETS, better, SETS, cluster_weights(image_clusters(a), 0, 200))
    assert (s["b"]["f1"] == 1.0 and s["gain"] == BEYOND_THRESHOLD
            and s["beyond_control_ci95"]["f1"][0] > 0)
    worse = bias_statistics(labels, better, SETS, a, SETS,
                            cluster_weights(image_clusters(a), 0, 200))
    assert worse["gain"] == NO_GAIN


def test_image_resampling_is_wider_when_an_images_questions_move_together():
    rng = np.random.default_rng(2)
    # every question of an image: the same label and the same margins
    per_image = rng.normal(0, 1, (40, 2))
    ma, mb = np.repeat(per_image[:, 0], 6), np.repeat(per_image[:, 0] + per_image[:, 1], 6)
    labels = list(np.repeat(["yes", "no"] * 20, 6))
    images = [f"img{i // 6}" for i in range(240)]
    a, b = _entries(ma, labels, images), _entries(mb, labels, images)
    by_image = bias_statistics(labels, a, SETS, b, SETS, cluster_weights(image_clusters(a), 0, 500))
    by_question = bias_statistics(labels, a, SETS, b, SETS, cluster_weights(np.arange(240), 0, 500))
    for m in ("yes_rate", "auroc", "brier"):
        wide, narrow = by_image["delta_ci95"][m], by_question["delta_ci95"][m]
        # sqrt(6) ≈ 2.4 for perfectly correlated
        assert wide[1] - wide[0] > 1.8 * (narrow[1] - narrow[0])
    assert by_image["delta"] == by_question["delta"]


def test_questions_without_a_margin_are_left_out_and_counted_by_side_and_reason():
    labels = ["yes", "no"] * 5
    a = _entries(np.linspace(-1, 1, 10), labels, cut=(0,))
    b = _entries(np.linspace(1, -1, 10), labels, cut=(0, 3, 4))
    b[7].candidate_logits[1] = math.nan
    s = bias_statistics(labels, a, SETS, b, SETS, cluster_weights(image_clusters(a), 0, 20))
    assert s["excluded"] == {"a": {ALL_CUT: 1}, "b": {ALL_CUT: 3, NON_FINITE: 1}, "either": 4}
    assert s["n"] == 6 and s["images"] == 6  # no image named: each question its own
    kept = [1, 2, 5, 6, 8, 9]
    assert s["a"]["auroc"] == _mann_whitney(np.linspace(-1, 1, 10)[kept],
                                            [labels[i] == "yes" for i in kept])
    none = bias_statistics(labels, a, None, b, SETS, cluster_weights(image_clusters(a), 0, 20))
    assert none == {"n": 0, "excluded": {"a": {NO_LOGITS: 10}, "b": {ALL_CUT: 3, NON_FINITE: 1},
                                         "either": 10}, "images": 0}


def _run(folder, margins, method, logsumexp=None):
    folder.mkdir(parents=True)
    write_meta(folder, {"model": {"family": "llava"}, "template": "t",
                        "readouts": ["template_aware", "pope_official"],
                        "token_sets": {"template_aware": SETS.to_json()},
                        "method": {"name": method}, "settings": {"resolved_dtype": "float32"}})
    records = [make_record(Question(i + 1, f"img{i // 4}.jpg", "Is there a cat?",
                                    "yes" if i % 2 else "no", "random", "coco"),
                           "t", first_token_id=1, decoded="Yes.",
                           candidate_logits={1: float(m), 2: -9.0, 3: 0.0, 4: -9.0},
                           logsumexp=None if logsumexp is None else logsumexp[i])
               for i, m in enumerate(margins)]
    with RecordWriter(folder) as w:
        w.write(records)
    return folder


def test_compare_json_and_markdown_carry_the_bias_statistics(tmp_path):
    rng = np.random.default_rng(4)
    ma = rng.normal(-0.5, 1, 24).round(3)
    a, b = _run(tmp_path / "p" / "none", ma, "none"), _run(tmp_path / "p" / "vcd", ma + 0.8, "vcd")
    result = compare_runs([a, b], resamples=200)
    table = result["pairs"][0]["splits"]["random"]
    assert "bias" not in table["pope_official"]  # a text readout has no margin
    s = table["template_aware"]["bias"]
    assert s["images"] == 6 and s["delta"]["auroc"] == 0 and s["b"]["f1"] == s["control"]["f1"]
    # every question has a margin
    assert s["delta"]["yes_rate"] == table["template_aware"]["delta"]["yes_rate"]
    assert json.loads(format_compare(result, "json"))["pairs"][0]["splits"]["random"][
        "template_aware"]["bias"] == s
    text = format_compare(result, "markdown")
    assert "resampling IMAGES" in text
    assert f"| random | template_aware | 24 (6 images) | {s['a']['yes_rate']:.4f} →" in text
    assert f"| {s['b']['f1']:.4f} | {s['control']['f1']:.4f} |" in text and s["gain"] in text
    section = text.split("Does the gain survive a yes-bias?")[1].split("## Metrics of each run")[0]
    assert "MISMATCHED" not in section
    result["pairs"][0]["mismatches"] = ["settings.resolved_dtype: 'float32' in A, 'bfloat16' in B"]
    section = format_compare(result, "markdown").split("Does the gain survive a yes-bias?")[1]
    assert ("> **MISMATCHED RUNS** (compared with --allow-mismatch): settings.resolved_dtype"
            in section)


def test_the_mass_outside_the_candidates_from_the_recorded_logsumexp_with_image_intervals():
    """logsumexp = log(e^l summed over the candidates + extra): the mass outside is extra / (that
    sum + extra). A run recorded without --record-mass has none (null), and so has B - A."""
    rng = np.random.default_rng(8)
    n, images = 24, [f"img{i // 4}.jpg" for i in range(24)]
    labels = ["yes" if i % 3 else "no" for i in range(n)]
    margins, extra = rng.normal(0, 1, n).round(2), rng.uniform(0.01, 3.0, (2, n))
    a, b, bare = (_entries(margins, labels, images) for _ in range(3))
    inside = [math.exp(m) + math.exp(-5) + 1 + math.exp(-6) for m in margins]
    for side, more in ((a, extra[0]), (b, extra[1])):
        for e, total, x in zip(side, inside, more):
            e.logsumexp = math.log(total + x)
    by_hand = ([x / (total + x) for x, total in zip(extra[0], inside)],
               [x / (t + x) for x, t in zip(extra[1], inside)])
    s = bias_statistics(labels, a, SETS, b, SETS,
                        cluster_weights(image_clusters(a), seed=2, resamples=50))
    assert s["a"]["outside"] == pytest.approx(np.mean(by_hand[0]), abs=1e-12)
    assert s["b"]["outside"] == pytest.approx(np.mean(by_hand[1]), abs=1e-12)
    shift = lambda rows: (np.mean([by_hand[1][i] for i in rows])  # noqa: E731
                          - np.mean([by_hand[0][i] for i in rows]))
    assert s["delta"]["outside"] == pytest.approx(shift(range(n)), abs=1e-12)
    assert s["delta_ci95"]["outside"] == pytest.approx(_images_resampled(shift, images, 2, 50),
                                                       abs=1e-12)
    unrecorded = bias_statistics(labels, bare, SETS, b, SETS,
                                 cluster_weights(image_clusters(a), 2, 50))
    assert unrecorded["a"]["outside"] is None and unrecorded["delta"]["outside"] is None
    assert (unrecorded["delta_ci95"]["outside"] is None
            and unrecorded["b"]["outside"] == s["b"]["outside"])


def test_a_record_holds_logsumexp_only_where_given_and_reads_it_back(tmp_path):
    """Without --record-mass a record is the same bytes as before the field existed; with it,
    `logsumexp` (a NaN as null named in non_finite, read back as NaN)."""
    q = Question(7, "img0.jpg", "Is there a cat?", "yes", "random", "coco")
    fields = dict(first_token_id=1, candidate_logits={1: 0.5, 3: -1.0},
                  predictions={"template_aware": "yes"})
    plain = make_record(q, "t", **fields)
    assert "logsumexp" not in plain and plain == make_record(q, "t", **fields, logsumexp=None)
    assert json.dumps(plain) == ('{"question_id": 7, "split": "random", "image": "img0.jpg", '
                                 '"label": "yes", "text": "Is there a cat?", "template": "t", '
                                 '"dataset": "coco", "first_token_id": 1, '
                                 '"candidate_logits": {"1": 0.5, "3": -1.0}, '
                                 '"predictions": {"template_aware": "yes"}}')
    assert make_record(q, "t", **fields, logsumexp=2.25)["logsumexp"] == 2.25
    faulty = make_record(q, "t", **fields, logsumexp=math.nan)
    assert faulty["logsumexp"] is None and faulty["non_finite"] == {"logsumexp": "nan"}
    _run(tmp_path / "r", [0.5, -0.5], "none", logsumexp=[2.25, math.nan])
    entries = read_records(tmp_path / "r").entries
    assert entries[0].logsumexp == 2.25 and math.isnan(entries[1].logsumexp)


def test_compare_shows_the_mass_outside_beside_calibration(tmp_path):
    margins = [0.5, -0.5, 1.0, -1.0]
    inside = [math.exp(m) + 2 * math.exp(-9) + 1 for m in margins]
    a = _run(tmp_path / "p" / "none", margins, "none",
             logsumexp=[math.log(t / 0.75) for t in inside])  # 1/4 outside
    b = _run(tmp_path / "p" / "vcd", margins, "vcd")
    s = compare_runs([a, b], resamples=20)["pairs"][0]["splits"]["random"]["template_aware"]["bias"]
    assert s["a"]["outside"] == pytest.approx(0.25, abs=1e-12) and s["b"]["outside"] is None
    text = format_compare(compare_runs([a, b], resamples=20), "markdown")
    assert "| Brier A | Brier B | ΔBrier [CI] | outside A | outside B | Δoutside [CI] |" in text
    assert "| 0.2500 | – | – |" in text
