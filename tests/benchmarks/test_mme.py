"""MME (readout/benchmarks/mme/): the lmms-lab parquet, the three tools' rules and aggregations as
../shared/benchmarks/mme_synthetic/README.md states them, the official result folder and lmms-eval's
samples log. Most inputs are built here in tmp_path; the synthetic shared file is read where
../shared is present."""
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout.benchmarks.base import Answer
from pope_fast.readout.benchmarks.mme.benchmark import MME, read_questions, write_result_folder
from pope_fast.readout.benchmarks.mme.rules import (COGNITION, PERCEPTION, SUBTASKS,
                                                    lmms_eval_prompt, lmms_eval_read, official_read)
from pope_fast.readout.data import DataError, Question
from pope_fast.readout.readouts import yorn

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SYNTHETIC = "benchmarks/mme_synthetic/data/test-00000-of-00001.parquet"
SUFFIX = " Please answer yes or no."


def _row(category, n, answer, question=None, data=None):
    image = f"{n:04d}.png"
    return {"question_id": f"{category}/{image}",
            "image": {"bytes": data or f"png-{category}-{n}".encode(), "path": image},
            "question": question or f"Is it {category} {n} {answer}?{SUFFIX}", "answer": answer,
            "category": category}


def _rows(*categories, images=2):
    return [_row(c, n, a) for c in categories for n in range(1, images + 1) for a in ("Yes", "No")]


def _parquet(path: Path, rows, drop=()):
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in drop}
    pq.write_table(pa.table(columns), path)
    return path


# ---- questions
# -------------------------------------------------------------------------------------------

def test_the_synthetic_file_reads_as_84_questions_on_42_images(shared):
    path = shared / SYNTHETIC
    questions = MME.questions(path)
    assert len(questions) == 84 and len({q.key for q in questions}) == 84
    assert len({q.image for q in questions}) == 42
    first, second = questions[:2]
    assert (first.key, first.image, first.label, first.split) \
        == ("existence/0001.png#0", "existence/0001.png", "yes", "existence")
    assert (second.key, second.label) == ("existence/0001.png#1", "no")
    assert first.text == "Is there a circle in this image? Please answer yes or no."
    assert first.image_data.startswith(b"\x89PNG") and first.image_data is second.image_data
    assert {q.split for q in questions} == set(SUBTASKS) \
        and {q.dataset for q in questions} == {"mme"}
    assert MME.detect(path) and MME.detect(path.parent)


def test_keys_follow_file_order_within_an_image_and_shards_read_in_name_order(tmp_path):
    # image 1's No row comes first and image 2's rows sit between image 1's: k is the order in the
    # file
    a_yes, a_no = _row("count", 1, "Yes"), _row("count", 1, "No")
    b_yes, b_no = _row("OCR", 2, "Yes"), _row("OCR", 2, "No")
    folder = tmp_path / "data"
    folder.mkdir()
    _parquet(folder / "test-00001-of-00002.parquet", [b_no, a_yes])
    _parquet(folder / "test-00000-of-00002.parquet", [a_no, b_yes])
    questions = read_questions(folder)
    assert [(q.key, q.label, q.split) for q in questions] == [
        ("count/0001.png#0", "no", "count"), ("OCR/0002.png#0", "yes", "OCR"),
        ("OCR/0002.png#1", "no", "OCR"), ("count/0001.png#1", "yes", "count")]
    assert questions[0].text == a_no["question"] and questions[0].image_data == b"png-count-1"


def _three_questions(rows):
    rows[2].update(question_id="existence/0001.png", image=dict(rows[0]["image"]))


@pytest.mark.parametrize("change, message", [
    (lambda rows: rows[3].update(answer="yes"), r"row 4: answer 'yes' is not Yes or No$"),
    (lambda rows: rows[2].update(answer="Maybe"), r"row 3: answer 'Maybe' is not Yes or No$"),
    (lambda rows: rows[1].update(category="Existence"),
     r"row 2: category 'Existence' is not one of MME's 14"),
    (_three_questions,
     r"row 1: image 'existence/0001.png' has 3 question\(s\); MME has 2 per image$"),
    (lambda rows: rows.pop(),
     r"row 3: image 'existence/0002.png' has 1 question\(s\); MME has 2 per image$"),
    (lambda rows: rows[0]["image"].update(bytes=None), r"row 1: image has no embedded bytes$"),
    (lambda rows: rows[1]["image"].update(bytes=b"other"),
     r"row 2: image differs from the earlier image of question_id 'existence/0001.png'$"),
    (lambda rows: rows[0].update(question=" "), r"row 1: question ' ' is not a non-empty string$"),
], ids=["lower-yes", "maybe", "category-case", "three-questions", "one-question", "no-bytes",
        "two-images", "blank-question"])
def test_bad_parquet_is_refused_naming_file_and_row(tmp_path, change, message):
    rows = _rows("existence")
    change(rows)
    path = _parquet(tmp_path / "mme.parquet", rows)
    with pytest.raises(DataError) as err:
        read_questions(path)
    assert str(err.value).startswith(f"{path} ") and re.search(message, str(err.value)), err.value
    assert "\n" not in str(err.value)


def test_a_missing_column_is_named(tmp_path):
    path = _parquet(tmp_path / "mme.parquet", _rows("existence"), drop=("category",))
    with pytest.raises(DataError, match=r"mme\.parquet: missing column\(s\) category$"):
        read_questions(path)
    # its question_ids name MME's subtasks: told as MME's, so that eval names the column (read as
    # POPE's parquet, its images clashed by name)
    assert MME.detect(path)
    misspelt = _parquet(tmp_path / "misspelt.parquet",
                        [{**r, "category": "colour"} for r in _rows("color")])
    assert MME.detect(misspelt)
    for data, message in ((path, r"mme\.parquet: missing column\(s\) category$"),
                          (misspelt, r"misspelt\.parquet row 1: category 'colour' is not one of "
                                     r"MME's 14 subtasks")):
        result = CliRunner().invoke(main, ["eval", "--questions", str(data), "--out",
                                           str(tmp_path / "run"), "--device", "cpu"])
        assert result.exit_code != 0 \
            and re.search(message, result.output.strip().splitlines()[-1]), result.output


# ---- reading the answer
# ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, decision", [
    ("Yes", "yes"), ("No", "no"), ("Not sure", "no"), ("None", "no"), ("Yes, no doubt", "yes"),
    ("  yes", "unknown"), ("y", "unknown"), ("The answer is yes", "unknown"), ("", "unknown"),
    ("yes\n", "yes"), ("no\n", "no"), ("y\n", "unknown"), ("nope", "no"), (" no", "no"),
    ("Yes.", "yes"),
])
def test_official_reading(text, decision):
    assert official_read(text) == decision


def test_a_lines_trailing_newline_never_changes_the_official_reading():
    """calculation.py keeps "\\n" on every line but a file's last (README); the reading is the same
    either way."""
    texts = ["yes", "no", "y", "n", "ye", "noo", "No.", "  yes", " no", "nay", "yes!", "Not sure",
             "", " ", "x"]
    assert all(official_read(t) == official_read(t + "\n") for t in texts)


@pytest.mark.parametrize("text, decision", [
    ("y", "yes"), ("n", "no"), ("Yes.", "yes"), ("  yes", "yes"), ("YES\n", "yes"), (" N. ", "no"),
    ("x", "unknown"), ("Not sure", "no"), ("The answer is yes", "unknown"), ("", "unknown"),
    ("yes.no", "yes"),
    # the evaluator's reasoning-tag strip first (readouts.lmms_eval_scored_text)
    ("<think>No.</think> Yes", "yes"),
])
def test_lmms_eval_reading(text, decision):
    assert lmms_eval_read(text) == decision


@pytest.mark.parametrize("text, decision", [
    ("Not sure", "unknown"), ("Yes, no doubt.", "unknown"), ("Yes.", "yes"), ("  yes", "yes"),
                                            ("y", "unknown"),
    ("No, there is none.", "no"),
])
def test_vlmevalkit_reading(text, decision):
    assert MME.rules["vlmevalkit"].read(text) == decision and yorn(text) == decision


def test_rules_their_order_headlines_and_prompts():
    assert list(MME.rules) == ["official", "lmms-eval", "vlmevalkit"]
    assert [r.headline for r in MME.rules.values()] == [("Perception", "Cognition"),
                                                        ("mme_perception_score",
                                                         "mme_cognition_score"),
                                                        ("perception", "reasoning")]
    assert MME.rules["official"].prompt is None and MME.rules["vlmevalkit"].prompt is None
    assert MME.rules["lmms-eval"].prompt is lmms_eval_prompt
    assert lmms_eval_prompt("  Is a python code shown in the picture? Please answer yes or no. ") \
        == "Is a python code shown in the picture?\n" \
           "Answer the question using a single word or phrase."
    assert lmms_eval_prompt("Is it red?") \
        == "Is it red?\nAnswer the question using a single word or phrase."
    assert all(r.sources for r in MME.rules.values())
    assert len(PERCEPTION) == 10 and len(COGNITION) == 4


# ---- aggregation
# -----------------------------------------------------------------------------------------

def _answers(split, *images):
    """images: per image, a list of (label, decision)."""
    return [Answer(f"{split}/{i}#{k}", split, f"{split}/{i}", label, decision)
            for i, pairs in enumerate(images) for k, (label, decision) in enumerate(pairs)]


RIGHT, WRONG = [("yes", "yes"), ("no", "no")], [("yes", "yes"), ("no", "yes")]
UNKNOWN_ONE = [("yes", "unknown"), ("no", "no")]


def test_aggregations_against_hand_derived_numbers():
    # existence: 3 images (both right, one right, one right): acc = 4/6, acc+ = 1/3.
    #   official and VLMEvalKit: 4/6*100 + 1/3*100 = 66.666…67 + 33.333…33 = 99.99999999999999
    #   in floats;
    #   lmms-eval: mean over images of acc+acc_plus = (200 + 50 + 50) / 3 = 100.0.
    # count: 2 images both right: 100 + 100 = 200 everywhere.
    # code_reasoning: 1 image, its yes question read as unknown (wrong), its no right: 50 + 0 = 50.
    answers = _answers("existence", RIGHT, WRONG, WRONG) + _answers("count", RIGHT, RIGHT) + \
        _answers("code_reasoning", UNKNOWN_ONE)
    official = MME.rules["official"].aggregate(answers)
    assert official["existence/acc"] == 4 / 6 * 100 \
        and official["existence/acc_plus"] == 1 / 3 * 100
    assert official["existence/score"] == 99.99999999999999
    assert official["count/score"] == 200.0 and official["code_reasoning/score"] == 50.0
    assert official["code_reasoning/acc"] == 50.0 and official["code_reasoning/acc_plus"] == 0.0
    # Perception = existence + count = 99.99999999999999 + 200 (which rounds to 300.0); Cognition =
    # 50
    assert official["Perception"] == 300.0 and official["Cognition"] == 50.0
    assert list(official)[:2] == ["Perception", "Cognition"]
    lmms = MME.rules["lmms-eval"].aggregate(answers)
    assert lmms["existence"] == 100.0 and lmms["count"] == 200.0 and lmms["code_reasoning"] == 50.0
    assert lmms["mme_perception_score"] == 300.0 and lmms["mme_cognition_score"] == 50.0
    vlm = MME.rules["vlmevalkit"].aggregate(answers)
    assert vlm["existence"] == 99.99999999999999 and vlm["perception"] == 300.0
    assert vlm["reasoning"] == 50.0 and "Cognition" not in vlm and "mme_cognition_score" not in vlm


def test_a_group_without_answers_has_no_total():
    answers = _answers("OCR", RIGHT)
    assert MME.rules["official"].aggregate(answers) == {"Perception": 200.0, "OCR/acc": 100.0,
                                                        "OCR/acc_plus": 100.0, "OCR/score": 200.0}


def test_how_an_unknown_counts_in_each_rule():
    # One image: "Yes" to its yes question, "Not sure" to its no question. calculation.py and
    # lmms-eval read "Not sure" as no (its first 4 characters "not " hold "no"): both right, 100 +
    # 100 = 200. VLMEvalKit reads it as Unknown, which exact_matching scores wrong: acc 1/2, acc+ 0
    # → 50.
    texts = [("yes", "Yes"), ("no", "Not sure")]
    scores = {}
    for name, rule in MME.rules.items():
        answers = [Answer(f"k{i}", "scene", "scene/1.png", label, rule.read(text))
                   for i, (label, text) in enumerate(texts)]
        scores[name] = rule.aggregate(answers)
    assert scores["official"]["scene/score"] == 200.0 and scores["lmms-eval"]["scene"] == 200.0
    assert scores["vlmevalkit"]["scene"] == 50.0 and scores["vlmevalkit"]["scene/acc_plus"] == 0.0
    # and a decision of unknown for a no label is wrong, never taken as no
    unknown = _answers("scene", [("yes", "yes"), ("no", "unknown")])
    assert [MME.rules[n].aggregate(unknown)[k] for n, k in
            (("official", "scene/score"), ("lmms-eval", "scene"), ("vlmevalkit", "scene"))] \
        == [50.0] * 3


def test_vlmevalkits_product_agrees_with_both_right_on_two_answers_and_takes_two_of_three():
    # With 2 answers of 0/1, val[0]*val[1] is 1 exactly when both are right, so it agrees with
    # calculation.py; it differs only on an image with 3 answers (none in MME): it multiplies the
    # first two (right, right → 1) and averages all three for acc (2/3), where calculation.py and
    # lmms-eval refuse anything but 2.
    two = _answers("color", RIGHT, WRONG)
    assert MME.rules["vlmevalkit"].aggregate(two)["color"] \
        == MME.rules["official"].aggregate(two)["color/score"]
    three = _answers("color", RIGHT + [("no", "yes")])
    vlm = MME.rules["vlmevalkit"].aggregate(three)
    assert vlm["color/acc"] == 2 / 3 * 100 and vlm["color/acc_plus"] == 100.0
    for name in ("official", "lmms-eval"):
        with pytest.raises(ValueError, match="has 3 answers"):
            MME.rules[name].aggregate(three)
    with pytest.raises(ValueError, match="has 1 answer"):
        MME.rules["vlmevalkit"].aggregate(_answers("color", RIGHT[:1]))
    with pytest.raises(ValueError, match="not an MME subtask"):
        MME.rules["official"].aggregate(_answers("adversarial", RIGHT))


# ---- the official result folder
# ----------------------------------------------------------------------------

def _questions(*categories):
    """Two images per category, the Yes question first, keyed as MME.questions keys the parquet."""
    return [Question(f"{c}/{n:04d}.png#{k}", f"{c}/{n:04d}.png", f"Is it {c} {n} {a}?{SUFFIX}",
                     a.lower(), c, "mme")
            for c in categories for n in (1, 2) for k, a in enumerate(("Yes", "No"))]


def test_written_result_folder_is_the_official_layout_and_reads_back(tmp_path):
    questions = _questions("OCR", "code_reasoning")
    texts = {q.key: f"Yes {i}" for i, q in enumerate(questions)}
    texts[questions[1].key] = "No\tbecause\r\nit is not"
    written = write_result_folder(tmp_path / "results", questions, texts)
    assert [p.name for p in written] == ["OCR.txt", "code_reasoning.txt"]
    lines = written[0].read_text().split("\n")
    assert lines[:2] == [f"0001.png\tIs it OCR 1 Yes?{SUFFIX}\tYes\tYes 0",
                         f"0001.png\tIs it OCR 1 No?{SUFFIX}\tNo\tNo because  it is not"]
    assert len(lines) == 5 and lines[-1] == ""  # 4 lines, each ending in "\n"
    expected = {k: v.replace("\t", " ").replace("\r", " ").replace("\n", " ")
                for k, v in texts.items()}
    for given in (None, questions):
        responses = MME.responses(tmp_path / "results", given)
        assert {r.key: r.text for r in responses} == expected
        assert {r.key: (r.split, r.label, r.image) for r in responses} == \
            {q.key: (q.split, q.label, q.image) for q in questions}
    assert responses[1].line == f"{written[0]}:2"
    assert MME.detect(tmp_path / "results") and MME.detect(written[0])


def test_reading_matches_questions_by_subtask_image_and_text_not_by_position(tmp_path):
    # the data's k order (Yes first) differs from the file's (No first): with questions the keys
    # follow the text
    questions = _questions("color")
    (tmp_path / "color.txt").write_text(
        f"0001.png\tIs it color 1 No?{SUFFIX}\tNo\tno\n"
        f"0001.png\tIs it color 1 Yes?{SUFFIX}\tYes\tyes\n"
        f"0002.png\tIs it color 2 Yes?{SUFFIX}\tYes\tyes\n"
        f"0002.png\tIs it color 2 No?{SUFFIX}\tNo\tno")
    matched = MME.responses(tmp_path, questions)
    assert [r.key for r in matched] == ["color/0001.png#1", "color/0001.png#0", "color/0002.png#0",
                                        "color/0002.png#1"]
    assert [r.key for r in MME.responses(tmp_path)][:2] == ["color/0001.png#0", "color/0001.png#1"]
    assert matched[-1].text == "no"  # the last line has no "\n"; no other line keeps its own


def test_a_crlf_result_file_reads_as_readlines_splits_it(tmp_path):
    (tmp_path / "scene.txt").write_bytes(b"a.jpg\tq1\tYes\tYes\r\na.jpg\tq2\tNo\tNo\r\n")
    assert [(r.key, r.text) for r in MME.responses(tmp_path / "scene.txt")] \
        == [("scene/a.jpg#0", "Yes"), ("scene/a.jpg#1", "No")]


GOOD = "a.jpg\tq1\tYes\tyes\na.jpg\tq2\tNo\tno\n"


@pytest.mark.parametrize("name, text, message", [
    ("OCR.txt", "a.jpg\tq1\tYes\na.jpg\tq2\tNo\tno\n",
     r"OCR\.txt:1: 3 tab-separated fields, not 4"),
    ("OCR.txt", "a.jpg\tq1\tYes\tyes\ta\na.jpg\tq2\tNo\tno\n",
     r"OCR\.txt:1: 5 tab-separated fields, not 4"),
    ("OCR.txt", GOOD + "\n", r"OCR\.txt:3: 1 tab-separated fields, not 4"),
    ("OCR.txt", "a.jpg\tq1\tyes\tyes\na.jpg\tq2\tNo\tno\n",
     r"OCR\.txt:1: gt 'yes' is not Yes or No$"),
    ("OCR.txt", GOOD + "b.jpg\tq1\tYes\tyes\n", r"OCR\.txt:3: odd line count \(3\)"),
    ("OCR.txt", "a.jpg\tq1\tYes\tyes\nb.jpg\tq2\tNo\tno\n",
     r"OCR\.txt:2: image 'b\.jpg' after 'a\.jpg'"),
    ("OCR.txt", GOOD + GOOD,
     r"OCR\.txt:3: image 'a\.jpg' has more than 2 lines \(first at line 1\)$"),
    ("Existence.txt", GOOD, r"Existence\.txt: 'Existence' is not an MME subtask"),
    ("OCR.txt", "", r"OCR\.txt: no lines$"),
])
def test_malformed_result_lines_are_refused_naming_file_and_line(tmp_path, name, text, message):
    (tmp_path / name).write_text(text, newline="")
    with pytest.raises(DataError) as err:
        MME.responses(tmp_path / name)
    assert str(err.value).startswith(str(tmp_path / name)) \
        and re.search(message, str(err.value)), err.value
    assert "\n" not in str(err.value)
    if name != "Existence.txt":  # the same from its folder
        with pytest.raises(DataError, match=re.escape(str(err.value))):
            MME.responses(tmp_path)


def test_a_result_folder_reads_its_subtasks_files_and_no_other(tmp_path):
    """calculation.py opens each subtask's file by name: a notes.txt beside them was "no such
    records file" (the folder was not told as MME's); a folder with no subtask's file names the
    files it holds."""
    (tmp_path / "OCR.txt").write_text(GOOD)
    (tmp_path / "notes.txt").write_text("run on the 3rd\n")
    assert MME.detect(tmp_path) \
        and [r.key for r in MME.responses(tmp_path)] == ["OCR/a.jpg#0", "OCR/a.jpg#1"]
    result = CliRunner().invoke(main, ["score", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0 \
        and json.loads(result.output)["runs"][0]["benchmark"] == "mme", result.output
    (tmp_path / "OCR.txt").rename(tmp_path / "Existence.txt")
    with pytest.raises(DataError,
                       match=re.escape(f"{tmp_path}: no <subtask>.txt result files in this folder "
                                       "(Existence.txt, notes.txt name no subtask); "
                                       "MME's subtasks: ")):
        MME.responses(tmp_path)


@pytest.mark.parametrize("line, message", [
    (f"0003.png\tIs it OCR 1 Yes?{SUFFIX}\tYes\tyes",
     "no question of the data is OCR image '0003.png' asking"),
    (f"0001.png\tIs it OCR 1 Yes?{SUFFIX}\tNo\tyes",
     "gt No but the data's label of question OCR/0001.png#0 is yes"),
])
def test_a_line_the_questions_lack_is_refused(tmp_path, line, message):
    (tmp_path / "OCR.txt").write_text(f"{line}\n{line}\n")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'OCR.txt'}:1: {message}")):
        MME.responses(tmp_path, _questions("OCR"))


def test_the_writer_refuses_what_calculation_py_would_mispair(tmp_path):
    questions = _questions("OCR")
    with pytest.raises(DataError, match=r"question OCR/0002\.png#1: no answer text to write"):
        write_result_folder(tmp_path, questions, {q.key: "yes" for q in questions[:3]})
    with pytest.raises(DataError,
                       match=r"OCR image 'OCR/0002\.png' has 1 questions; calculation\.py needs 2"):
        write_result_folder(tmp_path, questions[:3], {q.key: "yes" for q in questions})


def test_the_synthetic_file_through_the_official_folder(shared, tmp_path):
    # every answer "Yes": each subtask has acc 1/2 and acc+ 0 (no image has both right): 50 + 0 =
    # 50; Perception 10 × 50 = 500, Cognition 4 × 50 = 200, the same under every rule.
    questions = MME.questions(shared / SYNTHETIC)
    write_result_folder(tmp_path, questions, {q.key: "Yes" for q in questions})
    responses = MME.responses(tmp_path, questions)
    assert sorted(r.key for r in responses) == sorted(q.key for q in questions)
    totals = []
    for name, rule in MME.rules.items():
        answers = [Answer(r.key, r.split, r.image, r.label, rule.read(r.text)) for r in responses]
        totals.append([rule.aggregate(answers)[h] for h in rule.headline])
    assert totals == [[500.0, 200.0]] * 3


# ---- lmms-eval's samples log
# --------------------------------------------------------------------------------

def _sample(doc_id, question, text, flat=True):
    metric = "mme_perception_score" if question.split in PERCEPTION else "mme_cognition_score"
    row = {"doc_id": doc_id, "target": question.label.capitalize(),
           "filtered_resps": text if flat else [text],
           metric: {"question_id": question.image, "category": question.split, "score": 1.0}}
    # before v0.7 the log kept the doc (images left out) and wrapped the response in a list
    if not flat:
        row["doc"] = {"question_id": question.image, "question": question.text,
                      "answer": row["target"]}
        row["resps"] = [[text]]
    return json.dumps(row)


@pytest.mark.parametrize("flat", [True, False], ids=["v0.7", "before-v0.7"])
def test_lmms_eval_samples_are_keyed_by_question_id_in_doc_id_order(tmp_path, flat):
    questions = _questions("count", "text_translation")
    order = [5, 4, 0, 1, 7, 6, 2, 3]  # logged out of doc_id order
    path = tmp_path / "20260806_samples_mme.jsonl"
    path.write_text("\n".join(_sample(i, questions[i], f"text {i}", flat) for i in order) + "\n")
    for given in (None, questions):
        responses = MME.responses(path, given)
        assert [(r.key, r.text, r.label, r.split) for r in responses] == \
            [(q.key, f"text {i}", q.label, q.split) for i, q in enumerate(questions)]
    assert responses[0].line == f"{path}:3" and MME.detect(path)


@pytest.mark.parametrize("row, message", [
    ({"doc_id": 0, "target": "Yes", "filtered_resps": "yes"},
     "no mme_perception_score or mme_cognition_score"),
    ({"doc_id": 0, "target": "yes", "filtered_resps": "yes",
      "mme_perception_score": {"question_id": "count/0001.png", "category": "count"}},
     "target 'yes' is not Yes or No"),
    ({"doc_id": 0, "target": "Yes", "filtered_resps": ["a", "b"],
      "mme_perception_score": {"question_id": "count/0001.png", "category": "count"}},
     "filtered_resps ['a', 'b'] holds no one answer text"),
    ({"doc_id": 0, "target": "Yes", "filtered_resps": "yes",
      "mme_perception_score": {"question_id": "x/1.png", "category": "x"}},
     "category 'x' is not an MME subtask"),
])
def test_a_bad_samples_row_is_refused_naming_its_line(tmp_path, row, message):
    path = tmp_path / "samples_mme.jsonl"
    path.write_text(_sample(1, _questions("count")[1], "no") + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:2: {message}")):
        MME.responses(path)
    assert not MME.detect(tmp_path / "nothing.jsonl")


def test_a_sample_the_questions_lack_is_refused(tmp_path):
    path = tmp_path / "samples_mme.jsonl"
    # the No question, but as k = 0 here
    path.write_text(_sample(0, _questions("count")[1], "no") + "\n")
    with pytest.raises(DataError,
                       match=re.escape(f"{path}:1: count/0001.png#0 (no) "
                                       "is no question of the data")):
        MME.responses(path, _questions("count"))


# ---- detect
# ------------------------------------------------------------------------------------------------

def test_detect_refuses_what_is_not_mme(tmp_path):
    pope = {"question_id": [1, 2], "question": ["Is there a dog?"] * 2, "answer": ["yes", "no"],
            "image": [{"bytes": b"x", "path": "a.jpg"}] * 2, "category": ["adversarial"] * 2}
    pq.write_table(pa.table(pope), tmp_path / "pope.parquet")
    (tmp_path / "notes.jsonl").write_text('{"question_id": 1}\n')
    others = tmp_path / "others"
    others.mkdir()
    (others / "OCR.txt").write_text(GOOD)
    (others / "notes.txt").write_text("x")
    mme = _parquet(tmp_path / "mme.parquet", _rows("OCR"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("x")
    # a result folder with a notes.txt beside its subtasks' files is MME's
    # (test_a_result_folder_reads_its_subtasks_files_and_no_other); a folder of .txt files none of
    # which names a subtask is not
    assert [MME.detect(p) for p in (tmp_path / "pope.parquet", tmp_path / "notes.jsonl", others,
                                    mme, others / "OCR.txt", notes)] \
        == [False, False, True, True, True, False]
