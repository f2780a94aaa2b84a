"""lmms-eval's samples logs (readout/formats/lmms_eval.py, the one reader; POPE's and MME's rooms
each read their metric entry), on rows built here as lmms-eval writes them: evaluator.py's example
(cb45ac4d l.1180-1197) after evaluation_tracker.py's clean-up (l.265-286: `input` added, `target`
str()ed, `arguments` and `doc` dropped, a one-item `filtered_resps` unwrapped since v0.7)."""
import json
import re

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout.benchmarks.pope.relabel import read_labels, relabel
from pope_fast.readout.compare import join_questions
from pope_fast.readout.data import DataError
from pope_fast.readout.formats.lmms_eval import first_row, is_sample, read_samples
from pope_fast.readout.benchmarks.reading import read_records
from pope_fast.readout.records import Entry, RecordSet


def _row(doc_id, text, flat=True, **metrics):
    return {"doc_id": doc_id, "target": "yes", "resps": [text],
            "filtered_resps": text if flat else [text],
            "token_counts": [None], "doc_hash": "ab12", "input": "Is there a dog?", **metrics}


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def test_a_row_is_its_doc_id_target_text_and_metric_entries(tmp_path):
    """Every field lmms-eval did not add itself is a metric's entry, a dict or a number alike; the
    answer text is unwrapped from the list of one logs before v0.7 wrote; a blank line is skipped
    but counted."""
    path = _write(tmp_path / "samples_x.jsonl",
                  [_row(4, "Yes", m={"question_id": 9}, exact_match=1.0), "",
                                                 _row(0, "No", flat=False, m={"question_id": 3})])
    first, second = read_samples(path)
    assert (first.where, first.doc_id, first.target, first.text) == (f"{path}:1", 4, "yes", "Yes")
    assert first.metrics == {"m": {"question_id": 9}, "exact_match": 1.0}
    assert (second.where, second.doc_id, second.text) == (f"{path}:3", 0, "No")
    assert second.metrics == {"m": {"question_id": 3}}
    # the text given is read
    assert read_samples(path, path.read_text().replace("Yes", "Maybe"))[0].text == "Maybe"
    assert is_sample(first_row(path), ("m",)) and not is_sample(first_row(path), ("other",))
    assert first_row(tmp_path / "absent.jsonl") is None


@pytest.mark.parametrize("line, message", [
    ('{"doc_id": 1, "filtered_resps": "no"', "malformed JSON: Expecting ',' delimiter"),
    ('["not", "a", "row"]', "expected a JSON object, got list"),
    ('{"filtered_resps": "no", "m": {}}', "no doc_id (not an lmms-eval samples log?)"),
    ('{"doc_id": "1", "filtered_resps": "no"}', "doc_id '1' is not an int"),
    ('{"doc_id": true, "filtered_resps": "no"}', "doc_id True is not an int"),
    ('{"doc_id": 1, "filtered_resps": ["a", "b"]}',
     "filtered_resps ['a', 'b'] holds no one answer text"),
    ('{"doc_id": 1}', "filtered_resps None holds no one answer text"),
    ('{"doc_id": 0, "filtered_resps": "no"}', "doc_id 0 repeats (first at {path}:1)"),
])
def test_a_bad_row_is_refused_in_one_line_naming_file_and_line(tmp_path, line, message):
    path = _write(tmp_path / "samples_x.jsonl", [_row(0, "Yes"), line])
    with pytest.raises(DataError, match="^" + re.escape(f"{path}:2: {message.format(path=path)}")):
        read_samples(path)


def test_an_empty_or_absent_log_is_refused(tmp_path):
    empty = _write(tmp_path / "samples_x.jsonl", ["", " "])
    with pytest.raises(DataError, match=re.escape(f"{empty}: no samples")):
        read_samples(empty)
    with pytest.raises(DataError,
                       match=re.escape(f"{tmp_path / 'no.jsonl'}: no such samples file")):
        read_samples(tmp_path / "no.jsonl")
    latin = tmp_path / "samples_y.jsonl"
    latin.write_bytes(b'{"doc_id": 0, "filtered_resps": "caf\xe9"}\n')
    with pytest.raises(DataError, match=re.escape(f"{latin}: not UTF-8 text")):
        read_samples(latin)


# ---- POPE's logs: per split, and the pooled `--tasks pope`
# ----------------------------------------------------

POPE_METRICS = ("pope_accuracy", "pope_precision", "pope_recall", "pope_f1_score", "pope_yes_ratio")


def _pope_row(doc_id, question_id, text, label):
    """A POPE row as lmms-eval v0.7 logs it: each metric's entry from tasks/pope/utils.py l.17-28
    (question_id as lmms-lab/POPE stores it, an int), `resps` dropped where it equals
    `filtered_resps`."""
    pred = text.lower().strip()
    entry = {"question_id": question_id, "score": 1.0 if pred == label else 0.0, "prediction": pred,
             "ground_truth": label}
    return {"doc_id": doc_id, "target": label, "filtered_resps": text, "token_counts": [None],
            "doc_hash": "0f",
            "input": "Is there a dog in the image?\n"
                     "Answer the question using a single word or phrase.",
            **{m: entry for m in POPE_METRICS}}


# The pooled task's docs: lmms-lab/POPE's test split, three splits of three questions each numbered
# 1..3 (so each question id three times), doc_ids 0..8; logged out of doc order, as rows gathered
# from two ranks may be.
POOLED = [(0, 1, "Yes", "yes"), (1, 2, "No", "no"), (2, 3, "yes.", "yes"),
          (3, 1, "No, there is no dog.", "no"), (4, 2, " no ", "yes"), (5, 3, "Not sure", "no"),
          (6, 1, "YES", "no"), (7, 2, "no", "yes"), (8, 3, "Yes", "no")]
LOGGED = [0, 2, 4, 6, 8, 1, 3, 5, 7]


def _score(*args):
    result = CliRunner().invoke(main, ["score", *map(str, args), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_pooled_pope_log_scores_to_lmms_evals_pooled_numbers(tmp_path):
    """lmms-eval's `pope` task aggregates its 9,000 docs at once (utils.py l.31-84), so its log's
    question ids repeat: it is keyed by doc_id, split `all`. Worked by hand from the logged
    predictions (exact match): right docs 0, 1 (accuracy 2/9); TP doc 0, FP docs 6, 8 ("yes" to a no
    question), FN docs 4, 7 (only "no" to a yes question; "yes." and the other off-format answers
    are in neither count): precision 1/3, recall 1/3, F1 1/3; the yes-ratio counts the labels, yes
    at docs 0, 2, 4, 7: 4/9."""
    path = _write(tmp_path / "20260101_101010_samples_pope.jsonl",
                  [_pope_row(*POOLED[i]) for i in LOGGED])
    [run] = _score(path, "--protocol", "lmms-eval")["runs"]
    pooled = {"n": 9, "pope_accuracy": 2 / 9, "pope_f1_score": 1 / 3, "pope_precision": 1 / 3,
              "pope_recall": 1 / 3, "pope_yes_ratio": 4 / 9}
    assert run["rows"] == [{"split": "all", **pooled}, {"split": "Overall", **pooled}]
    [scored] = _score(path)["runs"]  # without --protocol: every text readout, as any other records
    assert (scored["split"], scored["n"]) == ("all", 9)
    assert {k: scored["readouts"]["exact_match"][k] for k in ("tp", "tn", "fp", "fn", "unknown")} \
        == {"tp": 1, "tn": 1, "fp": 2, "fn": 2, "unknown": 3}
    records = read_records(path)
    assert [e.key for e in records.entries] == [str(i) for i in LOGGED] \
        and records.meta["key"] == "doc_id"
    groups, diffs = join_questions(records, read_records(path))  # two pooled logs pair doc by doc
    assert len(groups[("", "all")]) == 9 and diffs == []


def test_a_repeated_doc_id_is_refused_in_one_line(tmp_path):
    rows = [_pope_row(*row) for row in POOLED[:4]] + [_pope_row(2, 1, "No", "no")]
    path = _write(tmp_path / "20260101_samples_pope.jsonl", rows)
    result = CliRunner().invoke(main, ["score", str(path), "--protocol", "lmms-eval"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].endswith(f"{path}:5: doc_id 2 repeats "
                                                           f"(first at {path}:3)")


def test_a_per_split_log_keeps_question_ids_to_pair_and_relabel(tmp_path):
    """pope_pop's docs are one split, whose question ids are unique: keyed by them, the log pairs
    with a pope-fast run of the split (records keyed by question_id) and RePOPE relabels it by
    question_id."""
    rows = [_pope_row(doc_id, 500 + doc_id, text, label) for doc_id, _, text, label in POOLED[:4]]
    path = _write(tmp_path / "20260101_samples_pope_pop.jsonl", rows)
    records = read_records(path)
    assert [(e.key, e.split) for e in records.entries] \
        == [(str(500 + i), "popular") for i in range(4)]
    assert records.meta["key"] == "question_id"
    ours = RecordSet("run", [Entry(str(500 + i), "popular", label, dataset="coco", decoded="Yes")
                             for i, (_, _, _, label) in enumerate(POOLED[:4])], {}, {},
                     prefer_stored=False)
    groups, diffs = join_questions(records, ours)
    assert [a.key for a, _ in groups[("coco", "popular")]] == ["500", "501", "502", "503"] \
        and diffs == []
    labels = tmp_path / "coco_repope_popular.json"
    labels.write_text("".join(json.dumps({"question_id": 500 + i, "image": f"{i}.jpg",
                                          "text": "Is there a dog?", "label": "no"}) + "\n"
                              for i in (0, 2)))
    relabelled, changes = relabel(records, read_labels([labels]))
    assert [(e.key, e.label) for e in relabelled.entries] == [("500", "no"), ("502", "no")]
    assert changes["popular"]["removed"] == 2 and changes["popular"]["yes_to_no"] == 2
    repeated = _write(tmp_path / "20260102_samples_pope_pop.jsonl",
                      rows + [_pope_row(4, 501, "No", "no")])
    with pytest.raises(DataError,
                       match=re.escape(f"{repeated}:5: question_id 501 repeats "
                                       f"(first at {repeated}:2)")):
        read_records(repeated)


def test_a_log_named_for_one_split_is_never_scored_as_all(tmp_path):
    """`samples_pope_adversarial.jsonl` reads as the pooled task `pope` followed by a split's name;
    scored as split `all` it would pair with nothing and mislabel its numbers: refused, saying what
    lmms-eval names that task's log. lmms-eval's own names read as their tasks."""
    rows = [_pope_row(*POOLED[i]) for i in LOGGED]
    renamed = _write(tmp_path / "20260101_101010_samples_pope_adversarial.jsonl", rows)
    result = CliRunner().invoke(main, ["score", str(renamed)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "followed by 'adversarial', a split: rename it as lmms-eval names its per-split " \
           "task's log (samples_pope_adv.jsonl)" in result.output
    pooled = _write(tmp_path / "x_samples_pope.jsonl", rows)
    assert [run["split"] for run in _score(pooled)["runs"]] == ["all"]
