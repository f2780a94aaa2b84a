import json
import math
import random
from math import comb

import numpy as np
import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import (Question, compare_runs, format_compare, make_record, read_records,
                               score_records)
from pope_fast.store import RecordWriter, write_meta

YES_IDS = {"legacy_2tok": (3582, 1217), "template_aware": (3869, 1939)}


def _meta(**changes) -> dict:
    meta = {"model": {"family": "llava", "files": {"model.safetensors": "a" * 64}},
            "template": "llava_plain", "readouts": ["legacy_2tok", "template_aware"],
            "token_sets": {n: {"yes_ids": [y], "no_ids": [n_]} for n, (y, n_) in YES_IDS.items()},
            "tokenizer": {"class": "LlamaTokenizerFast", "vocab_size": 32000,
                          "library_versions": {"transformers": "5.24.0", "tokenizers": "0.23.3",
                                               "torch": "2.13.0"}},
            "settings": {"device": "cpu", "dtype": None, "quant": "none", "quantize_lm_head": False,
                         "batch_size": 16, "image_aspect": "processor",
                         "resolved_dtype": "float32"}}
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = meta
        for p in parents:
            node = node[p]
        node[leaf] = value
    return meta


def _questions(labels: str, split: str = "adversarial",
               text: str = "Is there a dog in the image?") -> list[Question]:
    return [Question(i + 1, f"COCO_{i // 6}.jpg", text, {"y": "yes", "n": "no"}[c], split, "coco")
            for i, c in enumerate(labels)]


def _logits(decisions: dict[str, str]) -> dict[int, float]:
    """Candidate logits under which each readout decides as given ('y', 'n', or 'u': unknown, a NaN
    logit)."""
    logits = {}
    for name, (yes_id, no_id) in YES_IDS.items():
        logits[yes_id], logits[no_id] = {"y": (1.0, 0.0), "n": (0.0, 1.0),
                                         "u": (math.nan, math.nan)}[decisions[name]]
    return logits


def _run(folder, questions, decisions: dict[str, str], meta=None, order=None, errors=()):
    """A run folder: meta.json and one record per question (in `order`), each readout deciding as
    the string of 'y'/'n' in `decisions` says for the question at that index; `errors`: indices
    recorded as error records."""
    folder.mkdir(parents=True, exist_ok=True)
    write_meta(folder, meta or _meta())
    records = []
    for i in order or range(len(questions)):
        q = questions[i]
        if i in errors:
            records.append(make_record(q, "llava_plain", error="image missing",
                                       image_sha256="0" * 64))
            continue
        lg = _logits({n: d[i] for n, d in decisions.items()})
        records.append(make_record(q, "llava_plain", first_token_id=max(lg, key=lg.get),
                                   candidate_logits=lg, image_sha256="0" * 64))
    with RecordWriter(folder) as w:
        w.write(records)
    return folder


LABELS = "yyyynnnn"
A = {"template_aware": "yyynynnn", "legacy_2tok": "yyyyyyyy"}
B = {"template_aware": "yyyynnnn", "legacy_2tok": "ynnnnnnn"}


def test_hand_computed_deltas_flips_and_p(tmp_path):
    qs = _questions(LABELS)
    a, b = (_run(tmp_path / "none", qs, A),
            _run(tmp_path / "vcd", qs, B, _meta(method={"name": "vcd"})))
    [pair] = compare_runs([a, b])["pairs"]
    assert (pair["a"], pair["b"]) == (str(a), str(b))
    assert (pair["method_a"], pair["method_b"]) == ({"name": "none"}, {"name": "vcd"})
    aware, legacy = (pair["splits"]["adversarial"]["template_aware"],
                     pair["splits"]["adversarial"]["legacy_2tok"])
    # template_aware: A tp 3 fp 1 fn 1 → F1 0.75; B all right → 1.0; A→B flips q4 no→yes, q5 yes→no;
    # McNemar: B right where A was wrong on 2, never the reverse → 2 · 0.5² = 0.5
    assert (aware["f1_a"], aware["f1_b"], aware["delta_f1"]) == (0.75, 1.0, 0.25)
    assert aware["flips"] == {"yes_to_no": 1, "no_to_yes": 1} and aware["mcnemar_p"] == 0.5
    # legacy_2tok: A all yes → F1 8/12; B yes once → F1 2/5; 7 yes→no; discordant 3 vs 4 → p = 1
    # full precision
    assert (legacy["f1_a"], legacy["f1_b"], legacy["delta_f1"]) == (2 / 3, 0.4, 0.4 - 2 / 3)
    assert legacy["flips"] == {"yes_to_no": 7, "no_to_yes": 0} and legacy["mcnemar_p"] == 1.0
    delta = legacy["delta"]
    assert (delta["yes_rate"], delta["recall"], delta["accuracy"], delta["precision"]) == (
        -0.875, -0.75, 0.125, 0.5)
    # each run's F1 is what `pope-fast score` reports for it
    for path, side in ((a, "f1_a"), (b, "f1_b")):
        [run] = score_records(read_records(path), ["legacy_2tok", "template_aware"])
        assert all(run["readouts"][n]["f1"] == pair["splits"]["adversarial"][n][side]
                   for n in YES_IDS)
    # ΔF1 positive under one readout, negative under the other: the ranking changes
    ranking = pair["ranking"]["adversarial"]
    assert (ranking["changes"] and ranking["positive"] == ["template_aware"]
            and ranking["negative"] == ["legacy_2tok"])
    text = format_compare(compare_runs([a, b]), "markdown")
    assert "changes with the readout" in text and "| template_aware | +0.2500 [" in text


def test_record_sets_compare_as_their_paths_do_and_one_run_is_refused(tmp_path):
    """compare_records (readout's core) compares record sets read elsewhere under the names given
    them, as compare_runs compares the paths it reads; fewer than two runs is one line, before any
    path is read."""
    from pope_fast.readout.compare import compare_records

    qs = _questions(LABELS)
    a, b = (_run(tmp_path / "none", qs, A),
            _run(tmp_path / "vcd", qs, B, _meta(method={"name": "vcd"})))
    named = compare_records([("A", read_records(a)), ("B", read_records(b))], resamples=10)
    by_path = compare_runs([a, b], resamples=10)
    assert (named["pairs"][0]["a"], named["pairs"][0]["b"]) == ("A", "B")
    assert json.dumps({**named["pairs"][0], "a": str(a), "b": str(b)}, sort_keys=True) == \
        json.dumps(by_path["pairs"][0], sort_keys=True)
    for call in (lambda: compare_records([("A", read_records(a))]),
                 lambda: compare_runs([tmp_path / "missing"])):
        with pytest.raises(ValueError, match="needs a baseline run and at least one run"):
            call()


def test_ranking_that_holds_under_every_readout(tmp_path):
    qs = _questions(LABELS * 4)
    worse = {n: "n" * 32 for n in YES_IDS}
    right = {n: LABELS * 4 for n in YES_IDS}
    a, b = _run(tmp_path / "a", qs, worse), _run(tmp_path / "b", qs, right)
    [pair] = compare_runs([a, b])["pairs"]
    ranking = pair["ranking"]["adversarial"]
    assert not ranking["changes"] and ranking["excludes_zero"] == ["legacy_2tok", "template_aware"]
    assert "is the same under every readout" in format_compare(compare_runs([a, b]), "markdown")


def test_mcnemar_exact_p_on_known_discordant_counts(tmp_path):
    # 12 questions: A right and B wrong on 1, A wrong and B right on 7, both right on 4
    labels = "ynynynynynyn"
    qs = _questions(labels)
    flip = {"y": "n", "n": "y"}
    a_dec = labels[0] + "".join(flip[c] for c in labels[1:8]) + labels[8:]
    b_dec = flip[labels[0]] + labels[1:]
    a = _run(tmp_path / "a", qs, {n: a_dec for n in YES_IDS})
    b = _run(tmp_path / "b", qs, {n: b_dec for n in YES_IDS})
    r = compare_runs([a, b])["pairs"][0]["splits"]["adversarial"]["template_aware"]
    direct = 2 * sum(comb(8, k) for k in range(2)) / 2**8
    assert r["mcnemar_p"] == direct == 0.0703125
    # flips count decisions (q1, q2, q4, q6, q8 yes→no; q3, q5, q7 no→yes), not correctness (1 and
    # 7)
    assert r["flips"] == {"yes_to_no": 5, "no_to_yes": 3}


def _direct_interval(labels, dec_a, dec_b, seed, resamples, metric):
    """The paired percentile bootstrap written out: one index matrix drawn as bootstrap_f1_ci does,
    both runs' confusion counts summed over the same drawn questions."""
    y = np.array([c == "y" for c in labels])
    draws = np.random.default_rng(seed).integers(0, len(labels), size=(resamples, len(labels)))

    def value(dec):
        p = np.array([c == "y" for c in dec])
        tp, fp = (p & y)[draws].sum(1), (p & ~y)[draws].sum(1)
        fn, tn = (~p & y)[draws].sum(1), (~p & ~y)[draws].sum(1)
        if metric == "f1":
            return 2 * tp / np.maximum(2 * tp + fp + fn, 1)
        return (tp + tn) / len(labels)

    # the 95% level's tails as the code writes them (0.025 plus one ulp: full precision)
    tail = (1 - 0.95) / 2
    low, high = np.quantile(value(dec_b) - value(dec_a), [tail, 1 - tail])
    return [float(low), float(high)]


def test_bootstrap_interval_equals_a_direct_numpy_computation(tmp_path):
    rng = random.Random(3)
    n = 40
    labels = "".join(rng.choice("yn") for _ in range(n))
    dec = {side: {name: "".join(rng.choice("yn") for _ in range(n)) for name in YES_IDS}
           for side in "ab"}
    qs = _questions(labels)
    shuffled = list(range(n))
    rng.shuffle(shuffled)  # written out of question order: the resamples draw in question order
    a = _run(tmp_path / "a", qs, dec["a"], order=shuffled)
    b = _run(tmp_path / "b", qs, dec["b"])
    [pair] = compare_runs([a, b], seed=7, resamples=300)["pairs"]
    for name in YES_IDS:  # every readout sees the same resamples
        r = pair["splits"]["adversarial"][name]
        assert r["delta_f1_ci95"] == _direct_interval(labels, dec["a"][name], dec["b"][name],
                                                      7, 300, "f1")
        assert r["delta_ci95"]["accuracy"] == _direct_interval(labels, dec["a"][name],
                                                               dec["b"][name], 7, 300, "accuracy")
        assert r["delta_f1_ci95"][0] <= r["delta_f1"] <= r["delta_f1_ci95"][1]
    other = compare_runs([a, b], seed=8, resamples=300)["pairs"][0]["splits"]["adversarial"]
    assert other["template_aware"]["delta_f1_ci95"] \
        != pair["splits"]["adversarial"]["template_aware"]["delta_f1_ci95"]


def _interval_by_definition(labels: str, dec_a: str, dec_b: str, seed: int,
                            resamples: int) -> dict[str, list]:
    """Each metric's paired 95% percentile interval written from its definition, one resample at a
    time: resample r asks the questions of row r of numpy's [resamples, n] draw from the seed (with
    replacement), both runs are scored on them (an unknown 'u' answer out of the confusion matrix,
    wrong for accuracy), and the interval is the 2.5th and 97.5th percentiles of B - A."""
    draws = np.random.default_rng(seed).integers(0, len(labels), size=(resamples, len(labels)))
    ratio = lambda num, den: num / den if den else 0.0

    def scored(dec: str, row) -> dict[str, float]:
        count = lambda label, answer: sum(labels[i] == label and dec[i] == answer for i in row)
        tp, fp, fn, tn = count("y", "y"), count("n", "y"), count("y", "n"), count("n", "n")
        return {"f1": ratio(2 * tp, 2 * tp + fp + fn), "precision": ratio(tp, tp + fp),
                "recall": ratio(tp, tp + fn), "accuracy": (tp + tn) / len(row),
                 "yes_rate": ratio(tp + fp, tp + fp + fn + tn)}

    deltas = [{m: b - scored(dec_a, row)[m] for m, b in scored(dec_b, row).items()}
              for row in draws]
    tail = (1 - 0.95) / 2
    return {m: [float(q) for q in np.quantile([d[m] for d in deltas], [tail, 1 - tail])]
            for m in deltas[0]}


def test_every_paired_interval_is_its_definition_with_unknowns_and_pooled_splits(tmp_path):
    """Every metric's B - A interval (not F1's and accuracy's alone), with unknown answers in both
    runs, and the pooled Overall's: its questions in `score`'s pooled order (split name, then
    question id), resampled anew."""
    rng = random.Random(5)
    # A's records hold random first: Overall still pools adversarial first
    sizes = {"random": 30, "adversarial": 26}
    labels = {s: "".join(rng.choice("yn") for _ in range(n)) for s, n in sizes.items()}
    dec = {side: {s: {name: "".join(rng.choice("yyynnnu" if side == "a" else "yynnnu")
                                    for _ in range(n))
                      for name in YES_IDS}
                  for s, n in sizes.items()}
           for side in "ab"}
    folders = {}
    for side in "ab":
        records = [(q, {n: d[i] for n, d in dec[side][s].items()}) for s in sizes
                   for i, q in enumerate(_questions(labels[s], s))]
        order = sorted(range(len(records)), key=lambda i: rng.random()) if side == "b" else None
        qs, decisions = ([q for q, _ in records],
                         {n: "".join(d[n] for _, d in records) for n in YES_IDS})
        folders[side] = _run(tmp_path / side, qs, decisions, order=order)
    [pair] = compare_runs([folders["a"], folders["b"]], seed=11, resamples=200)["pairs"]
    assert list(pair["splits"]) == ["random", "adversarial", "Overall"]
    pooled = ("adversarial", "random")
    for split, members in (("random", ("random",)), ("adversarial", ("adversarial",)),
                           ("Overall", pooled)):
        for name in YES_IDS:
            joined = lambda side: "".join(dec[side][s][name] for s in members)
            expected = _interval_by_definition("".join(labels[s] for s in members), joined("a"),
                                               joined("b"), 11, 200)
            got = pair["splits"][split][name]
            assert got["delta_ci95"] == expected, (split, name)
            assert got["delta_f1_ci95"] == expected["f1"]


def test_questions_join_by_id_not_position(tmp_path):
    qs = _questions(LABELS * 2, "popular") + _questions(LABELS, "random")
    dec_a = {n: d * 3 for n, d in A.items()}
    dec_b = {n: d * 3 for n, d in B.items()}
    n = len(qs)
    reference = compare_runs([_run(tmp_path / "a", qs, dec_a), _run(tmp_path / "b", qs, dec_b)],
                             resamples=50)
    reversed_b = _run(tmp_path / "b2", qs, dec_b, order=list(reversed(range(n))))
    interleaved_a = _run(tmp_path / "a2", qs, dec_a,
                         order=[i for pair in zip(range(16), range(16, n)) for i in pair]
                         + list(range(8, 16)))
    permuted = compare_runs([interleaved_a, reversed_b], resamples=50)
    strip = lambda result: [{k: v for k, v in p.items() if k not in ("a", "b")}
                            for p in result["pairs"]]
    assert strip(permuted) == strip(reference)
    assert list(reference["pairs"][0]["splits"]) == ["popular", "random", "Overall"]
    assert reference["pairs"][0]["splits"]["random"]["legacy_2tok"]["flips"] == {
        "yes_to_no": 7, "no_to_yes": 0}


def test_error_records_leave_both_sides_and_are_counted(tmp_path):
    qs = _questions(LABELS)
    a = _run(tmp_path / "a", qs, A, errors={3})   # A's only wrong "no" (q4) is an error
    b = _run(tmp_path / "b", qs, B, errors={4})   # and B cannot answer q5, A's wrong "yes"
    [pair] = compare_runs([a, b])["pairs"]
    assert pair["questions"]["adversarial"] == {"joined": 8, "compared": 6,
                                                "errors_a": 1, "errors_b": 1}
    aware = pair["splits"]["adversarial"]["template_aware"]
    assert (aware["f1_a"], aware["f1_b"], aware["flips"]) == (
        1.0, 1.0, {"yes_to_no": 0, "no_to_yes": 0})
    assert ("2 questions left out of both runs (error records: A 1, B 1)"
            in format_compare(compare_runs([a, b])))
    failed = _run(tmp_path / "failed", qs, B, errors=set(range(8)))
    [pair] = compare_runs([a, failed])["pairs"]
    assert (pair["splits"] == {"adversarial": {}}
            and pair["questions"]["adversarial"]["errors_b"] == 8)
    assert ("adversarial: no question answered by both runs"
            in format_compare(compare_runs([a, failed])))


MISMATCHES = [
    ("dtype", {"settings__resolved_dtype": "float16"},
     "settings.resolved_dtype: 'float32' in A, 'float16' in B"),
    ("quant", {"settings__quant": "nf4"}, "settings.quant: 'none' in A, 'nf4' in B"),
    ("template", {"template": "llava_yesno"}, "template: 'llava_plain' in A, 'llava_yesno' in B"),
    ("token sets", {"token_sets__template_aware": {"yes_ids": [3869, 3582], "no_ids": [1939]}},
     "token_sets.template_aware.yes_ids: [3869] in A, [3869, 3582] in B"),
    ("library", {"tokenizer__library_versions": {"transformers": "4.57.1",
                                                 "tokenizers": "0.23.3", "torch": "2.13.0"}},
     "tokenizer.library_versions.transformers: '5.24.0' in A, '4.57.1' in B"),
]


@pytest.mark.parametrize("what, change, named", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_mismatched_runs_are_refused_naming_the_difference(tmp_path, what, change, named):
    qs = _questions(LABELS)
    a, b = _run(tmp_path / "a", qs, A), _run(tmp_path / "b", qs, B, _meta(**change))
    with pytest.raises(ValueError) as err:
        compare_runs([a, b])
    assert str(a) in str(err.value) and str(b) in str(err.value) and named in str(err.value)
    [pair] = compare_runs([a, b], allow_mismatch=True)["pairs"]
    assert pair["mismatches"] == [named]


def test_question_text_and_set_differences_are_refused(tmp_path):
    qs = _questions(LABELS)
    a = _run(tmp_path / "a", qs, A)
    cat = _questions(LABELS[:4], text="Is there a cat in the image?") + qs[4:]
    b = _run(tmp_path / "b", cat, B)
    with pytest.raises(ValueError, match=r"4 questions with another text "
                                         r"\(coco adversarial #1: 'Is there a dog in the "
                                         r"image\?' in A, 'Is there a cat in the image\?' in B"):
        compare_runs([a, b])
    fewer = _run(tmp_path / "c", qs[:6], {n: d[:6] for n, d in B.items()})
    with pytest.raises(ValueError,
                       match=r"2 questions only in A \(coco adversarial #7, coco adversarial #8\)"):
        compare_runs([a, fewer])
    [pair] = compare_runs([a, fewer], allow_mismatch=True)["pairs"]
    assert pair["questions"]["adversarial"]["compared"] == 6
    relabelled = _run(tmp_path / "d", _questions("n" + LABELS[1:]), B)
    with pytest.raises(ValueError, match=r"1 question with another label "
                                         r"\(coco adversarial #1: 'yes' in A, 'no' in B"):
        compare_runs([a, relabelled])
    # another label: never paired
    [pair] = compare_runs([a, relabelled], allow_mismatch=True)["pairs"]
    assert pair["questions"]["adversarial"]["joined"] == 7
    assert pair["splits"]["adversarial"]["template_aware"]["flips"] == {
        "yes_to_no": 1, "no_to_yes": 1}


def test_methods_and_models_differing_is_no_mismatch(tmp_path):
    qs = _questions(LABELS)
    a = _run(tmp_path / "a", qs, A)
    meta = _meta(method={"name": "pai", "settings": {"alpha": 0.2}, "reference": "Liu et al. 2024"})
    meta["model"]["files"] = {"model.safetensors": "b" * 64}
    meta["settings"]["batch_size"] = 4  # how work is batched decides no answer
    [pair] = compare_runs([a, _run(tmp_path / "b", qs, B, meta)])["pairs"]
    assert (pair["mismatches"] == [] and pair["same_model"] is False
            and pair["method_b"]["name"] == "pai")
    assert "(pai: alpha=0.2)" in format_compare({"seed": 0, "resamples": 1000, "level": 0.95,
                                                 "pairs": [pair]})


def test_allow_mismatch_flags_every_table(tmp_path):
    qs = _questions(LABELS * 2, "popular") + _questions(LABELS, "random")
    dec_a, dec_b = {n: d * 3 for n, d in A.items()}, {n: d * 3 for n, d in B.items()}
    a = _run(tmp_path / "a", qs, dec_a)
    b = _run(tmp_path / "b", qs, dec_b, _meta(settings__resolved_dtype="bfloat16"))
    c = _run(tmp_path / "c", qs, dec_b)
    result = compare_runs([a, b, c], allow_mismatch=True, resamples=50)
    assert [p["mismatches"] for p in result["pairs"]] == [
        ["settings.resolved_dtype: 'float32' in A, 'bfloat16' in B"], []]
    blocks = format_compare(result, "markdown").split("\n\n")
    tables = [i for i, block in enumerate(blocks) if block.startswith("| readout |")]
    # per pair: the ΔF1 table and one per split and the splits pooled
    assert len(tables) == 2 * (1 + 3)
    # the tables in order: A-B's ΔF1, A-C's ΔF1, then A-B's and A-C's two splits and Overall each
    flagged = [i for i in tables if blocks[i - 1].startswith("> **MISMATCHED RUNS**")]
    assert flagged == [tables[0], tables[2], tables[3], tables[4]]  # every A-B table, no A-C table
    assert "bfloat16" in blocks[flagged[0] - 1]


def test_imported_record_file_needs_allow_mismatch(tmp_path):
    qs = _questions(LABELS)
    ours = _run(tmp_path / "ours", qs, A)
    results = [{"question_id": str(q.question_id), "label": q.label, "top_token_id": 3869,
                "pred_2tok": {"y": "yes", "n": "no"}[B["legacy_2tok"][i]], "pred_8tok": "yes"}
               for i, q in enumerate(qs)]
    published = tmp_path / "pope_adversarial_2tok_vs_8tok.json"
    published.write_text(json.dumps({"summary": {"split": "adversarial"}, "results": results}))
    with pytest.raises(ValueError, match="imported ugaa-research record file: it has no meta.json"):
        compare_runs([ours, published])
    [pair] = compare_runs([ours, published], allow_mismatch=True)["pairs"]
    assert pair["readouts"] == ["legacy_2tok", "template_aware"]
    # the file stores no template_aware answers
    assert list(pair["splits"]["adversarial"]) == ["legacy_2tok"]
    # full precision kept
    assert round(pair["splits"]["adversarial"]["legacy_2tok"]["delta_f1"], 4) == -0.2667
    assert "template_aware" in pair["unavailable"]["adversarial"]


def test_cli_json_shape_and_one_line_errors(tmp_path):
    qs = _questions(LABELS)
    a, b = _run(tmp_path / "none", qs, A), _run(tmp_path / "vcd", qs, B)
    runner = CliRunner()
    out = runner.invoke(main, ["compare", str(a), str(b), "--format", "json", "--resamples", "100"])
    assert out.exit_code == 0, out.output
    [pair] = json.loads(out.output)["pairs"]
    assert (pair["a"], pair["b"]) == (str(a), str(b))
    cell = pair["splits"]["adversarial"]["template_aware"]
    assert {"f1_a", "f1_b", "delta_f1", "delta_f1_ci95", "mcnemar_p", "flips"} <= set(cell)
    assert cell["flips"] == {"yes_to_no": 1, "no_to_yes": 1} and len(cell["delta_f1_ci95"]) == 2
    assert set(pair["splits"]["adversarial"]) == {"legacy_2tok", "template_aware"}
    md = runner.invoke(main, ["compare", str(a), str(b)])
    assert (md.exit_code == 0
            and md.output.startswith("## Does the method's gain survive the readout?"))
    bad = _run(tmp_path / "fp16", qs, B, _meta(settings__resolved_dtype="float16"))
    for args in (["compare", str(a), str(bad)], ["compare", str(a)]):
        out = runner.invoke(main, args)
        assert (out.exit_code == 1 and out.output.count("\n") == 1
                and out.output.startswith("Error: "))
    assert "settings.resolved_dtype" in runner.invoke(main, ["compare", str(a), str(bad)]).output


def test_two_long_texts_that_differ_are_shown_where_they_part():
    """A refused resume or compare names a differing prompt: cut to its first 40 characters, two
    prompts of one template showed the same opening and hid the difference; shown from a little
    before where they part, both differences are there."""
    from pope_fast.readout.compare import leaf_differences

    ours = ("USER: <image>\nIs there a dog in the image? "
            "Answer the question using a single word or phrase. ASSISTANT:")
    theirs = "USER: <image>\nIs there a dog in the image? Answer yes or no only. ASSISTANT:"
    [line] = leaf_differences({"prompt_example": ours}, {"prompt_example": theirs},
                              "recorded", "now")
    assert line == "prompt_example: ...'e? Answer the question using a singl... recorded, " \
                   "...'e? Answer yes or no only. ASSISTANT:' now"
    assert leaf_differences({"a": "short"}, {"a": "shirt"}, "x", "y") == ["a: 'short' x, 'shirt' y"]
