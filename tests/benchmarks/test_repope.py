"""RePOPE-style relabelling: a run rescored under corrected labels without the model
(readout/benchmarks/pope/relabel.py). RePOPE's own files ship without a licence, so these tests
write labels files of their own in its format."""
import json
import random

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, TokenSets, make_record, read_records, score_records
from pope_fast.readout.benchmarks.pope.relabel import read_labels, relabel
from pope_fast.readout.data import DataError
from pope_fast.store import RecordWriter, write_meta

SETS = {"legacy_2tok": TokenSets((5,), (6,)).to_json(),
        "first_token": TokenSets((5,), (6,)).to_json()}
SPLITS = ("random", "popular", "adversarial")


def _questions(split):
    return [Question(i, f"COCO_{i % 7}.jpg", f"Is there a thing{i % 5} in the image?",
                     "yes" if i % 2 else "no", split, "coco") for i in range(1, 31)]


def _run(folder, questions, seed=0):
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    write_meta(folder, {"token_sets": SETS})
    with RecordWriter(folder) as w:
        w.write([make_record(q, "llava_plain", first_token_id=first,
                             candidate_logits={5: rng.gauss(0, 1), 6: rng.gauss(0, 1)},
                             decoded={5: "Yes", 6: "No"}[first])
                 for q in questions for first in [5 if rng.random() < 0.5 else 6]])
    return folder


def _labels(path, questions, removed=(), flipped=()):
    """A labels file in POPE's JSON-lines format: `removed` ids left out, `flipped` ids with the
    other label."""
    flip = {"yes": "no", "no": "yes"}
    lines = [json.dumps({"question_id": q.question_id, "image": q.image, "text": q.text,
                         "label": flip[q.label] if q.question_id in flipped else q.label})
             for q in questions if q.question_id not in removed]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_relabelled_run_scores_as_the_run_asked_with_the_new_labels(tmp_path):
    """Oracle: the same records written with the corrected labels and without the removed questions,
    scored as a run of their own, give the relabelled numbers exactly (every readout, every split
    and Overall)."""
    questions = [q for s in SPLITS for q in _questions(s)]
    run = _run(tmp_path / "run", questions)
    removed, flipped = {3, 4, 17}, {1, 2, 9, 10, 25}
    files = [_labels(tmp_path / f"coco_repope_{s}.json", _questions(s), removed, flipped)
             for s in SPLITS]
    flip = {"yes": "no", "no": "yes"}
    oracle_questions = [Question(q.question_id, q.image, q.text,
                                 flip[q.label] if q.question_id in flipped else q.label,
                                 q.split, "repope")
                        for q in questions if q.question_id not in removed]
    # the oracle's records hold the same logits: rewrite the run's lines with the new labels
    lines = (run / "records.jsonl").read_text().splitlines()
    by_key = {(r["split"], r["question_id"]): r for r in map(json.loads, lines)}
    (tmp_path / "oracle").mkdir()
    write_meta(tmp_path / "oracle", {"token_sets": SETS})
    with RecordWriter(tmp_path / "oracle") as w:
        w.write([{**by_key[(q.split, q.question_id)], "label": q.label, "dataset": "repope"}
                 for q in oracle_questions])
    relabelled, changes = relabel(read_records(run), read_labels(files))
    assert changes["random"] == {"labels": "coco_repope_random.json", "from": "coco",
                                 "questions": 30, "kept": 27, "removed": 3, "yes_to_no": 3,
                                 "no_to_yes": 2, "labels_not_in_run": 0}
    strip = lambda runs: [{k: v for k, v in r.items() if k != "source"} for r in runs]
    ours = score_records(relabelled, ["legacy_2tok", "first_token"], resamples=100)
    assert strip(ours) == strip(score_records(read_records(tmp_path / "oracle"),
                                              ["legacy_2tok", "first_token"], resamples=100))
    assert [r["split"] for r in ours] == [*SPLITS, "Overall"] and ours[-1]["n"] == 81
    before = score_records(read_records(run), ["legacy_2tok"], resamples=100)
    assert before[0]["readouts"]["legacy_2tok"]["f1"] != ours[0]["readouts"]["legacy_2tok"]["f1"]


def test_score_labels_side_by_side_and_in_json(tmp_path):
    questions = [q for s in SPLITS for q in _questions(s)]
    run = _run(tmp_path / "run", questions)
    files = [str(_labels(tmp_path / f"coco_repope_{s}.json", _questions(s), {3}, {1}))
             for s in SPLITS]
    labels = [a for f in files for a in ("--labels", f)]
    out = CliRunner().invoke(main, ["score", str(run), *labels, "--format", "json"])
    assert out.exit_code == 0, out.output
    runs = json.loads(out.output)["runs"]
    assert [(r.get("dataset"), r["split"]) for r in runs] \
        == [("coco", s) for s in (*SPLITS, "Overall")] \
        + [("repope", s) for s in (*SPLITS, "Overall")]
    pooled = runs[-1]["relabelled"]
    assert pooled["labels"] == [f"coco_repope_{s}.json" for s in SPLITS]
    assert (pooled["questions"], pooled["kept"], pooled["removed"], pooled["yes_to_no"]) \
        == (90, 87, 3, 3)
    table = CliRunner().invoke(main, ["score", str(run), *labels]).output
    side = table.split("F1 under its labels and")[1]
    f1 = {r["dataset"]: r["readouts"]["legacy_2tok"]["f1"] for r in runs if r["split"] == "random"}
    assert f"| legacy_2tok | {f1['coco']:.4f} | {f1['repope']:.4f} |" in side
    under = json.loads(CliRunner().invoke(main, ["score", str(run), *labels, "--protocol",
                                                 "lmms-eval", "--format", "json"]).output)["runs"]
    assert [r.get("dataset") for r in under] == ["coco", "repope"] \
        and under[1]["relabelled"]["kept"] == 87


def test_bad_labels_files_name_the_file_and_question(tmp_path):
    run = _run(tmp_path / "run", _questions("random"))
    unnamed = _labels(tmp_path / "repope_labels.json", _questions("random"))
    with pytest.raises(DataError,
                       match="repope_labels.json: labels file whose name names no POPE split"):
        read_labels([unnamed])
    other = [Question(q.question_id, q.image, "Is there a cat?" if q.question_id == 7 else q.text,
                      q.label, q.split)
             for q in _questions("random")]
    wrong = _labels(tmp_path / "coco_repope_random.json", other)
    with pytest.raises(DataError,
                       match="random question 7 has text 'Is there a thing2 in the image\\?'; "
                             "the labels file has 'Is there a cat\\?'"):
        relabel(read_records(run), read_labels([wrong]))
    again = tmp_path / "x" / "coco_repope_random.json"
    again.parent.mkdir()
    again.write_text(wrong.read_text())
    with pytest.raises(DataError, match="a second labels file for coco random"):
        read_labels([wrong, again])
    aokvqa = _labels(tmp_path / "aokvqa_repope_random.json", _questions("random"))
    with pytest.raises(DataError,
                       match=r"aokvqa_repope_random.json: labels for aokvqa random beside "
                             r"coco random \(\S+coco_repope_random.json\): the relabelled run "
                             r"would mix both datasets' questions in one split random"):
        read_labels([wrong, aokvqa])
    popular = _labels(tmp_path / "coco_repope_popular.json", _questions("popular"))
    out = CliRunner().invoke(main, ["score", str(run), "--labels", str(popular)])
    assert out.exit_code != 0 and "no record of the relabelled splits (coco popular)" in out.output
    assert "Traceback" not in out.output


@pytest.mark.parametrize("text, decision", [
    # "yes" anywhere wins (l.7)
    ("Yes, there is.", "yes"), ("yesterday", "yes"), ("Yes, no doubt.", "yes"),
    # "no" anywhere (l.9)
    ("No", "no"), ("Not sure", "no"), ("I don't know.", "no"), ("None", "no"),
    ("Maybe.", "unknown"), ("It is a cat", "unknown"), ("", "unknown")])  # its None (l.6, 13)
def test_repope_reads_as_compute_answer(text, decision):
    """RePOPE src/eval_utils.py compute_answer l.5-13: substring tests on the lowercased response.
    """
    from pope_fast.readout.readouts import READOUTS

    assert READOUTS["repope"].decide(text) == decision


def test_repope_metrics_leave_unknown_answers_out_of_every_count():
    """compute_results l.45-66: an answer compute_answer left None is none of TP/FP/TN/FN, so
    accuracy and the yes-ratio divide by the answered only: TP 2, FN 1, FP 1, TN 1 and one unknown
    -> ACC 3/5, not 3/6."""
    from pope_fast.readout.protocols.repope import repope_metrics

    m = repope_metrics(["yes", "yes", "yes", "no", "no", "no"],
                       ["yes", "yes", "no", "yes", "no", "unknown"])
    assert (m["TP"], m["FP"], m["TN"], m["FN"], m["unknown"]) == (2, 1, 1, 1, 1)
    assert m["Precision"] == 2 / 3 and m["Recall"] == 2 / 3 and m["F1"] == pytest.approx(2 / 3)
    assert m["ACC"] == 3 / 5 and m["Yes Ratio"] == 3 / 5
    stopped = repope_metrics(["yes", "no"], ["no", "no"])  # no yes answer: l.62 divides by zero
    assert stopped["F1"] is None and "ZeroDivisionError" in stopped["error"]


def test_score_labels_protocol_repope_gives_its_numbers_for_both_label_sets(tmp_path):
    """One run's answers under POPE's labels and RePOPE's (src/evaluate.py l.63-67), each per split
    as compute_results prints it. Questions 1-6 (odd yes): 1 "Yes, there is." yes, 2 "I don't know."
    no, 3 "Maybe." left out, 4 "Yesterday's photo" yes, 5 "No" no, 6 "There is not" no. POPE's
    labels: TP 1 (1), TN 2 (2, 6), FP 1 (4), FN 1 (5) -> P 1/2, R 1/2, F1 1/2, ACC 3/5, Yes Ratio
    2/5. RePOPE's (6 removed, 5 flipped to no): TP 1, TN 2 (2, 5), FP 1, FN 0 -> P 1/2, R 1, F1 2/3,
    ACC 3/4, Yes 2/4."""
    said = {1: "Yes, there is.", 2: "I don't know.", 3: "Maybe.", 4: "Yesterday's photo", 5: "No",
            6: "There is not"}
    questions = [q for q in _questions("random") if q.question_id in said]
    (tmp_path / "run").mkdir()
    write_meta(tmp_path / "run", {"token_sets": SETS})
    with RecordWriter(tmp_path / "run") as w:
        w.write([make_record(q, "llava_plain", first_token_id=5, candidate_logits={5: 0.0, 6: 1.0},
                             decoded=said[q.question_id]) for q in questions])
    labels = _labels(tmp_path / "coco_repope_random.json", questions, removed={6}, flipped={5})
    out = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--labels", str(labels),
                                    "--protocol", "repope", "--format", "json"])
    assert out.exit_code == 0, out.output
    pope, repope = json.loads(out.output)["runs"]
    assert (pope["dataset"], repope["dataset"]) == ("coco", "repope") \
        and pope["readout"] == "repope"
    (row,) = pope["rows"]
    assert (row["n"], row["TP"], row["TN"], row["FP"], row["FN"], row["unknown"]) \
        == (6, 1, 2, 1, 1, 1)
    assert (row["Precision"], row["Recall"], row["F1"], row["ACC"], row["Yes Ratio"]) \
        == (0.5, 0.5, 0.5, 0.6, 0.4)
    (row,) = repope["rows"]
    assert (row["n"], row["TP"], row["TN"], row["FP"], row["FN"], row["unknown"]) \
        == (5, 1, 2, 1, 0, 1)
    assert (row["Precision"], row["Recall"], row["ACC"], row["Yes Ratio"]) == (0.5, 1.0, 0.75, 0.5)
    assert row["F1"] == pytest.approx(2 / 3)
    # RePOPE runs each model's own code: nothing to compare the run's prompt with, and no Coverage
    # asked for
    assert pope["checks"] == repope["checks"] \
        and pope["checks"][0].startswith("RePOPE prescribes no prompt or length")
    table = CliRunner().invoke(main,
                               ["score", str(tmp_path / "run"), "--protocol", "repope"]).output
    assert "| split | n | TP | FP | TN | FN | Precision | Recall | F1 | ACC | Yes Ratio " \
        "| unknown |" in table
    assert "| random | 6 | 1 | 1 | 2 | 1 | 0.5 | 0.5 | 0.5 | 0.6 | 0.4 | 1 |" in table
