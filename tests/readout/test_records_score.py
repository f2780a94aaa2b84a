import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, TokenSets, make_record, read_records, score_records
from pope_fast.store import RecordWriter, write_meta

FIXTURE = "fixtures/ugaa_pope_adversarial_2tok_vs_8tok_first600.json"


def test_published_fixture_counts_from_its_records(shared):
    path = shared / FIXTURE
    records = read_records(path)
    raw = json.loads(path.read_text())
    assert records.meta["schema"] == "pairwise" and len(records.entries) == 600
    [run] = score_records(records, ["legacy_2tok", "legacy_8tok", "first_token"])
    assert run["split"] == "adversarial" and run["n"] == 600
    assert "first_token" in run["unavailable"]           # no token sets in a published file
    for ours, theirs in (("legacy_2tok", "eval_2token"), ("legacy_8tok", "eval_8token")):
        m, s = run["readouts"][ours], raw["summary"][theirs]
        # counted independently from the records: the joined labels and stored predictions
        tp = sum(r["label"] == "yes" and r[f"pred_{ours[7:]}"] == "yes" for r in raw["results"])
        assert m["tp"] == tp
        assert m["tp"] + m["fp"] == s["yes_predictions"]
        # the published summary rounds to 4 decimals; ours keeps full precision
        assert tuple(round(m[k], 4) for k in ("f1", "precision", "recall")) == (
            s["f1"], s["precision"], s["recall"])
    assert run["first_token_counts"] == raw["summary"]["top_tokens_generated"]
    # the paper's observation: 8-token yes exactly when the first token is ▁Yes
    assert all((r["pred_8tok"] == "yes") == (r["top_token_id"] == 3869) for r in raw["results"])
    assert run["mcnemar"]["legacy_2tok vs legacy_8tok"] < 1e-4


def test_cross_model_schema_with_decoded_text(tmp_path):
    results = [
        {"question_id": "1", "label": "yes", "top_token_id": 5592, "top_token_str": "Yes",
         "pred_legacy_2tok": "no", "pred_legacy_8tok": "no", "pred_dynamic_single": "yes",
         "pred_string_parse": "yes", "decoded_response": "Yes "},
        {"question_id": "2", "label": "no", "top_token_id": 1770, "top_token_str": "No",
         "pred_legacy_2tok": "no", "pred_legacy_8tok": "no", "pred_dynamic_single": "no",
         "pred_string_parse": "no",
         "decoded_response": "No, there is not"},
    ]
    path = tmp_path / "llava16_mistral_popular_token_audit.json"
    path.write_text(json.dumps({"summary": {"model": "x"}, "results": results}))
    records = read_records(path)
    assert records.meta["schema"] == "cross_model"
    [run] = score_records(records, ["legacy_2tok", "dynamic_single", "string_parse",
                                    "pope_official", "exact_match"])
    # from the file name when the summary has none
    assert run["split"] == "popular"
    assert (run["readouts"]["legacy_2tok"]["fn"] == 1
            and run["readouts"]["dynamic_single"]["f1"] == 1.0)
    assert run["readouts"]["pope_official"]["tn"] == 1   # recomputed from decoded_response
    assert run["readouts"]["exact_match"]["unknown"] == 1  # "No, there is not" is not exactly "no"


def _audit_file(tmp_path):
    """A run_multi_model_audit.py file with two failed questions and one unknown answer; its summary
    block typed in as that script computes it (errors dropped, yes_rate over the 4 valid
    records)."""
    def rec(qid, label, pred, decoded):
        return {"question_id": qid, "label": label, "top_token_id": 3869, "pred_legacy_2tok": pred,
                "pred_legacy_8tok": pred, "pred_dynamic_single": pred, "pred_string_parse": pred,
                "decoded_response": decoded}
    results = [rec("1", "yes", "yes", "Yes"), rec("2", "no", "no", "No"),
               rec("3", "yes", "unknown", "I cannot"),
               {"question_id": "4", "label": "yes", "error": "CUDA out of memory"},
               rec("5", "no", "yes", "Yes"),
               {"question_id": "6", "label": None, "error": "cannot identify image"}]
    block = {"tp": 1, "tn": 1, "fp": 1, "fn": 0, "unknown": 1, "f1": 0.6667, "precision": 0.5,
             "recall": 1.0, "yes_predictions": 2, "yes_rate": 0.5}
    summary = {"split": "adversarial", "n_total": 6, "n_valid": 4, "n_errors": 2,
               "eval_string_parse": block}
    path = tmp_path / "llava15_pope_adversarial_6q_paper_template_token_audit.json"
    path.write_text(json.dumps({"summary": summary, "results": results}))
    return path, block


def test_imported_failed_questions_are_error_records_left_out_of_every_metric(tmp_path):
    path, block = _audit_file(tmp_path)
    records = read_records(path)
    assert [e.error for e in records.entries if e.error] == [
        "CUDA out of memory", "cannot identify image"]
    [run] = score_records(records, ["legacy_2tok", "string_parse", "pope_official"], strict=True)
    assert (run["n"], run["errors"]) == (6, 2)
    m = run["readouts"]["string_parse"]
    # the file's summary block rounds to 4 decimals
    assert {k: round(m[k], 4)
            for k in ("tp", "tn", "fp", "fn", "unknown", "f1", "precision", "recall")} == \
           {k: block[k] for k in ("tp", "tn", "fp", "fn", "unknown", "f1", "precision", "recall")}
    # 2 right of the 4 answered or unknown, errors apart
    assert m["accuracy"] == 0.5
    assert run["readouts"]["pope_official"]["tp"] + run["readouts"]["pope_official"]["fn"] == 2
    result = CliRunner().invoke(main, ["score", str(path), "--readouts",
                                       "string_parse,legacy_2tok"])
    assert result.exit_code == 0, result.output
    assert "n=6, 2 error records (left out of every metric)" in result.output


def test_our_error_records_are_left_out_too(tmp_path):
    qs = _questions()
    with RecordWriter(tmp_path) as w:
        w.write([make_record(qs[0], "t", error="image missing"),
                 make_record(qs[1], "t", first_token_id=1, decoded="Yes"),
                 make_record(qs[2], "t", first_token_id=1, decoded="No")])
    [run] = score_records(read_records(tmp_path), ["string_parse"])
    m = run["readouts"]["string_parse"]
    assert (run["n"], run["errors"], m["unknown"], m["accuracy"], m["yes_rate_all"]) == (
        3, 1, 0, 1.0, 0.5)


def test_both_yes_rates_and_the_one_the_paper_reports(tmp_path):
    """yes_rate: yes over answered questions; yes_rate_all: yes over every scored question, unknowns
    included, which is what the imported file's own summary reports."""
    path, block = _audit_file(tmp_path)
    [run] = score_records(read_records(path), ["string_parse"])
    m = run["readouts"]["string_parse"]
    assert m["yes_rate_all"] == block["yes_rate"] == 0.5
    assert m["yes_rate"] == pytest.approx(2 / 3, abs=1e-4)
    table = CliRunner().invoke(main, ["score", str(path), "--readouts", "string_parse"]).output
    header, _, row = table.splitlines()[1:4]
    assert (header.split()[-2:] == ["yes-rate", "yes/all"]
            and row.split()[-2:] == ["0.6667", "0.5000"])


def _questions():
    return [Question(i, f"img{i // 2}.jpg", "Is there a dog?", "yes" if i % 2 else "no", "random")
            for i in range(6)]


def test_rescoring_our_records_from_candidate_logits(tmp_path):
    sets = {"legacy_2tok": TokenSets((5,), (6,)), "template_aware": TokenSets((5, 7), (6, 8)),
            "first_token": TokenSets((5, 7), (6, 8))}
    write_meta(tmp_path, {"token_sets": {n: s.to_json() for n, s in sets.items()}})
    logits = [{5: 0.0, 6: 1.0, 7: 2.0, 8: 0.5}, {5: 3.0, 6: 1.0, 7: 0.0, 8: 0.0},
              {5: 0.0, 6: 0.0, 7: 0.0, 8: 0.0}]
    with RecordWriter(tmp_path) as w:
        for q, lg in zip(_questions(), logits * 2):
            w.write([make_record(q, "llava_plain", first_token_id=max(lg, key=lg.get),
                                 candidate_logits=lg, decoded="yes" if lg[7] > 1 else "nope",
                                 predictions={"legacy_2tok": "yes"})])
    [run] = score_records(read_records(tmp_path), ["legacy_2tok", "template_aware", "first_token",
                                                   "string_parse"])
    # legacy_2tok is recomputed (no, yes, no-by-tie per triple), not taken from the stale stored
    # "yes"
    assert run["readouts"]["legacy_2tok"]["yes_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert run["readouts"]["template_aware"]["yes_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert run["readouts"]["string_parse"]["unknown"] == 4
    assert run["first_token_counts"] == {"5": 4, "7": 2}


def test_writer_resumes_after_a_torn_line(tmp_path):
    qs = _questions()
    with RecordWriter(tmp_path) as w:
        w.write([make_record(q, "t", first_token_id=1, candidate_logits={1: 0.5}) for q in qs[:3]])
    path = tmp_path / "records.jsonl"
    path.write_text(path.read_text() + '{"question_id": 3, "spl')    # a crash mid-line
    w = RecordWriter(tmp_path)
    assert set(w.open()) == {("", "random", "0"), ("", "random", "1"), ("", "random", "2")}
    w.write([make_record(qs[3], "t", error="image missing")])
    w.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line) for line in lines)
    [run] = score_records(read_records(tmp_path), ["first_token"], strict=False)
    assert run["errors"] == 1


def test_duplicate_records_are_rejected(tmp_path):
    q = _questions()[0]
    (tmp_path / "records.jsonl").write_text(
        json.dumps(make_record(q, "t", first_token_id=1)) + "\n" +
        json.dumps(make_record(q, "t", first_token_id=2)) + "\n")
    with pytest.raises(ValueError, match=r"records\.jsonl:2: duplicate record for question 0"):
        read_records(tmp_path)


def test_score_cli_json_shape(shared):
    result = CliRunner().invoke(main, ["score", str(shared / FIXTURE), "--readouts",
                                       "legacy_2tok,legacy_8tok", "--format", "json"])
    assert result.exit_code == 0, result.output
    [run] = json.loads(result.output)["runs"]
    assert set(run["readouts"]["legacy_8tok"]) == {"tp", "tn", "fp", "fn", "unknown", "accuracy",
                                                   "precision", "recall", "f1", "f1_ci95",
                                                   "yes_rate", "yes_rate_all", "unknown_reasons"}
    assert list(run["mcnemar"]) == ["legacy_2tok vs legacy_8tok"]
    bad = CliRunner().invoke(main, ["score", str(shared / FIXTURE), "--readouts", "template_aware"])
    assert bad.exit_code != 0 and "no token sets" in bad.output


@pytest.mark.slow
def test_audit_tokens_cli(shared):
    result = CliRunner().invoke(main, ["audit-tokens", "--tokenizer",
                                       str(shared / "tokenizers/qwen2/qwen2-vl-7b-instruct"),
                                       "--template", "qwen2_vl_chat", "--format", "json"])
    assert result.exit_code == 0, result.output
    audit = json.loads(result.output)
    assert 9454 in audit["readouts"]["template_aware"]["yes_ids"]
    assert any("3582 is 'Ġtyp'" in w for w in audit["warnings"])


def test_readout_imports_without_torch():
    code = ("import sys, pope_fast.readout, pope_fast.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_paper_counts_round_to_the_published_f1(tmp_path):
    """A 3,000-record ugaa-research file with the paper's adversarial counts scores to its published
    F1 values and first-token histogram (the full file is not in ../shared; its first 600 are)."""
    # label → that label's predictions, in any order: yes-labels 1,500, no-labels 1,500
    two = {"yes": ["yes"] * 1438 + ["no"] * 62, "no": ["no"] * 658 + ["yes"] * 842}
    eight = {"yes": ["yes"] * 1174 + ["no"] * 326, "no": ["no"] * 1318 + ["yes"] * 182}
    results = []
    for label in ("yes", "no"):
        for pred2, pred8 in zip(two[label], eight[label]):
            results.append({"question_id": str(len(results) + 1), "label": label,
                            "pred_2tok": pred2, "pred_8tok": pred8,
                             "top_token_id": 3869 if pred8 == "yes" else 1939})
    path = tmp_path / "pope_adversarial_2tok_vs_8tok.json"
    path.write_text(json.dumps({"summary": {"split": "adversarial", "n": 3000},
                                "results": results}))
    [run] = score_records(read_records(path), ["legacy_2tok", "legacy_8tok"])
    two, eight = run["readouts"]["legacy_2tok"], run["readouts"]["legacy_8tok"]
    # the paper prints F1 to 4 decimals
    assert (two["tp"], two["tn"], two["fp"], two["fn"], round(two["f1"], 4)) == (
        1438, 658, 842, 62, 0.7608)
    assert (eight["tp"], eight["tn"], eight["fp"], eight["fn"], round(eight["f1"], 4)) == (
        1174, 1318, 182, 326, 0.8221)
    assert two["f1"] == 2 * 1438 / (2 * 1438 + 842 + 62)
    assert run["first_token_counts"] == {"1939": 1644, "3869": 1356}


def test_error_records_are_retried_and_superseded(tmp_path):
    qs = _questions()
    with RecordWriter(tmp_path) as w:
        w.write([make_record(qs[0], "t", error="image missing"),
                 make_record(qs[1], "t", first_token_id=1)])
    w = RecordWriter(tmp_path)
    # the error record is not done: a rerun retries it
    assert set(w.open()) == {("", "random", "1")}
    w.write([make_record(qs[0], "t", first_token_id=7, candidate_logits={7: 1.0})])
    w.close()
    records = read_records(tmp_path)
    assert [(e.key, e.error, e.first_token_id) for e in records.entries] == [
        ("0", None, 7), ("1", None, 1)]


def test_line_separators_inside_strings_keep_records_readable(tmp_path):
    """json.dumps(ensure_ascii=False) writes U+2028 raw; str.splitlines() would cut the line
    there."""
    qs = _questions()
    with RecordWriter(tmp_path) as w:
        w.write([make_record(q, "t", first_token_id=1, decoded=f"Yes\u2028there is\u0085{i}")
                 for i, q in enumerate(qs[:2])])
    assert "\u2028" in (tmp_path / "records.jsonl").read_text()
    assert [e.decoded for e in read_records(tmp_path).entries] == [
        "Yes\u2028there is\u00850", "Yes\u2028there is\u00851"]
    assert len(RecordWriter(tmp_path).open()) == 2


def test_bootstrap_interval_does_not_depend_on_record_order(tmp_path):
    """The same records in another order (a resumed or merged run writes them so) give the same
    interval: resampling draws question indices, so the entries are put in question order first."""
    import random

    sets = {"legacy_2tok": TokenSets((5,), (6,))}
    rng = random.Random(3)
    records = []
    for i in range(1, 41):
        logits = {5: rng.gauss(0, 1), 6: rng.gauss(0, 1)}
        q = Question(i, f"img{i // 6}.jpg", "Is there a dog?", "yes" if i % 2 else "no", "random")
        records.append(make_record(q, "llava_plain", first_token_id=5, candidate_logits=logits))
    intervals = []
    for name, order in (("sorted", records), ("shuffled", rng.sample(records, len(records)))):
        folder = tmp_path / name
        folder.mkdir()
        write_meta(folder, {"token_sets": {n: s.to_json() for n, s in sets.items()}})
        with RecordWriter(folder) as w:
            w.write(order)
        [run] = score_records(read_records(folder), ["legacy_2tok"], seed=7, resamples=200)
        intervals.append(run["readouts"]["legacy_2tok"]["f1_ci95"])
    assert intervals[0] == intervals[1]
    # a real interval, not a degenerate one that any order gives
    assert intervals[0][0] < intervals[0][1]


def test_datasets_score_apart_and_old_records_score_as_before(tmp_path):
    """Two datasets reuse the same split and question ids: two runs, never one mixed. Records
    written before datasets were named (no `dataset` key) read back and score exactly as they
    did."""
    (tmp_path / "new").mkdir(), (tmp_path / "old").mkdir()
    write_meta(tmp_path / "new", {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    write_meta(tmp_path / "old", {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    coco = [Question(q.question_id, q.image, q.text, q.label, q.split, "coco")
            for q in _questions()]
    gqa = [Question(q.question_id, q.image, q.text, "no", q.split, "gqa") for q in _questions()]
    logits = {5: 1.0, 6: 0.0}
    with RecordWriter(tmp_path / "new") as w:
        w.write([make_record(q, "t", first_token_id=5, candidate_logits=logits)
                 for q in coco + gqa])
    with RecordWriter(tmp_path / "new") as w:
        assert len(w.done) == 12                     # resumes with both datasets' questions done
    with RecordWriter(tmp_path / "old") as w:
        records = [make_record(q, "t", first_token_id=5, candidate_logits=logits)
                   for q in _questions()]
        assert all("dataset" not in r for r in records)
        w.write(records)
    new = score_records(read_records(tmp_path / "new"), ["legacy_2tok"])
    assert [(r["dataset"], r["split"], r["n"]) for r in new] == [
        ("coco", "random", 6), ("gqa", "random", 6)]
    assert (new[0]["readouts"]["legacy_2tok"]["tp"] == 3
            and new[1]["readouts"]["legacy_2tok"]["fp"] == 6)
    [old] = score_records(read_records(tmp_path / "old"), ["legacy_2tok"])
    assert "dataset" not in old and old["readouts"] == new[0]["readouts"]
    assert {k: v for k, v in new[0].items() if k not in ("source", "dataset")} == \
        {k: v for k, v in old.items() if k != "source"}
    table = CliRunner().invoke(main, ["score", str(tmp_path / "old"), str(tmp_path / "new")]).output
    assert f"{tmp_path / 'old' / 'records.jsonl'} — split random, n=6" in table
    assert f"{tmp_path / 'new' / 'records.jsonl'} — gqa split random, n=6" in table


def _three_splits(folder, order=None, seed=5):
    """POPE's shape in small: three splits over the same question ids 1..20, random logits."""
    import random

    rng = random.Random(seed)
    write_meta(folder, {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    records = [make_record(Question(i, f"img{i}.jpg", "Is there a dog?", "yes" if i % 3 else "no",
                                    split, "coco"),
                           "t", first_token_id=5,
                           candidate_logits={5: rng.gauss(0, 1), 6: rng.gauss(0, 1)})
               for split in ("random", "popular", "adversarial") for i in range(1, 21)]
    with RecordWriter(folder) as w:
        w.write(records if order is None else [records[i] for i in order])
    return records


def test_splits_pooled_into_overall_as_one_more_run(tmp_path):
    """A dataset of several splits gets an `Overall` run over all its questions: counted over the
    60, not the mean of the splits; a split alone (or a dataset of one split) gets none."""
    import random

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _three_splits(tmp_path / "a")
    runs = score_records(read_records(tmp_path / "a"), ["legacy_2tok"], resamples=200)
    assert [r["split"] for r in runs] == ["random", "popular", "adversarial", "Overall"]
    pooled, splits = runs[-1], runs[:-1]
    assert pooled["pooled"] == ["random", "popular", "adversarial"] and pooled["n"] == 60
    m = pooled["readouts"]["legacy_2tok"]
    for k in ("tp", "tn", "fp", "fn"):
        assert m[k] == sum(r["readouts"]["legacy_2tok"][k] for r in splits)
    assert m["f1"] == 2 * m["tp"] / (2 * m["tp"] + m["fp"] + m["fn"])
    assert m["f1"] != pytest.approx(sum(r["readouts"]["legacy_2tok"]["f1"] for r in splits) / 3)
    # question ids repeat in every split: the pooled bootstrap must not depend on the file's order
    # either
    _three_splits(tmp_path / "b", order=random.Random(1).sample(range(60), 60))
    shuffled = score_records(read_records(tmp_path / "b"), ["legacy_2tok"], resamples=200)
    assert [{k: v for k, v in r.items() if k != "source"} for r in shuffled] == \
        [{k: v for k, v in r.items() if k != "source"} for r in runs]
    assert m["f1_ci95"][0] < m["f1_ci95"][1]
    # one split: nothing to pool
    (tmp_path / "c").mkdir()
    write_meta(tmp_path / "c", {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    with RecordWriter(tmp_path / "c") as w:
        w.write([make_record(q, "t", first_token_id=5, candidate_logits={5: 1.0, 6: 0.0})
                 for q in _questions()])
    assert [r["split"] for r in score_records(read_records(tmp_path / "c"), ["legacy_2tok"])] \
        == ["random"]


def test_score_csv_in_vlmevalkit_shape_and_percent(tmp_path):
    import csv
    import io

    _three_splits(tmp_path)
    [*_, pooled] = score_records(read_records(tmp_path), ["legacy_2tok"])
    out = CliRunner().invoke(main, ["score", str(tmp_path), "--readouts", "legacy_2tok",
                                    "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.output)))
    # VLMEvalKit's order
    assert [r["split"] for r in rows] == ["Overall", "random", "popular", "adversarial"]
    assert list(rows[0])[-5:] == ["F1", "acc", "precision", "recall", "yes_rate"]
    # full precision, round-trips
    assert float(rows[0]["F1"]) == pooled["readouts"]["legacy_2tok"]["f1"]
    percent = list(csv.DictReader(io.StringIO(CliRunner().invoke(
        main, ["score", str(tmp_path), "--readouts", "legacy_2tok", "--format", "csv",
               "--percent"]).output)))
    assert float(percent[0]["F1"]) == pooled["readouts"]["legacy_2tok"]["f1"] * 100
    table = CliRunner().invoke(main, ["score", str(tmp_path), "--readouts", "legacy_2tok",
                                      "--percent"]).output
    assert "split Overall (splits pooled: random, popular, adversarial), n=60" in table
    assert f"{pooled['readouts']['legacy_2tok']['f1'] * 100:.2f}" in table.split("split Overall")[1]
    models = CliRunner().invoke(main, ["score", str(tmp_path), "--format", "models",
                                       "--percent"]).output
    assert "### F1 (%) by readout, coco Overall" in models
    for bad in (["--format", "json", "--percent"], ["--protocol", "lmms-eval", "--percent"]):
        result = CliRunner().invoke(main, ["score", str(tmp_path), *bad])
        assert (result.exit_code != 0 and "--percent" in result.output
                and "Traceback" not in result.output)


def test_score_csv_of_one_split_has_its_overall_row_too(tmp_path):
    """VLMEvalKit's score file has an Overall row even for one split (yorn.py l.162), the split's
    own numbers: so does --format csv, first, as for several splits."""
    import csv
    import io

    from pope_fast.readout.report.tables import format_csv

    _three_splits(tmp_path)
    [random, *_] = score_records(read_records(tmp_path), ["legacy_2tok"])
    rows = list(csv.DictReader(io.StringIO(format_csv([random]))))
    assert [r["split"] for r in rows] == ["Overall", "random"]
    assert {k: v for k, v in rows[0].items() if k != "split"} == {
        k: v for k, v in rows[1].items() if k != "split"}


@pytest.mark.parametrize("method, hint", [
    ("vcd", "the run of method vcd is scored under the answer position's "
            "readouts only (logit and first-token readouts)"),
    ("none", "run with a string readout")])
def test_a_method_runs_missing_text_readouts_say_why_not_how_to_record_them(tmp_path, method, hint):
    """A contrastive method's run records no text (a text readout would need the method inside a
    decode loop): its hint was "run with a string readout to generate it", which eval refuses for
    such a method."""
    sets = {"legacy_2tok": TokenSets((5,), (6,)), "first_token": TokenSets((5,), (6,))}
    write_meta(tmp_path, {"token_sets": {n: s.to_json() for n, s in sets.items()},
                          "readouts": list(sets), "method": {"name": method, "settings": {}}})
    with RecordWriter(tmp_path) as w:
        w.write([make_record(q, "llava_plain", first_token_id=5, candidate_logits={5: 1.0, 6: 0.0})
                 for q in _questions()])
    [run] = score_records(read_records(tmp_path), ["legacy_2tok", "first_token", "string_parse",
                                                   "exact_match"])
    assert set(run["readouts"]) == {"legacy_2tok", "first_token"}
    assert hint in run["unavailable"]["string_parse"] and hint in run["unavailable"]["exact_match"]
