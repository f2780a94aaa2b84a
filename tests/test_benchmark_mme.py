"""MME (readout/benchmarks/mme*.py): the lmms-lab parquet, the three tools' rules and aggregations as
../shared/benchmarks/mme_synthetic/README.md states them, the official result folder and lmms-eval's samples log.
Most inputs are built here in tmp_path; the synthetic shared file is read where ../shared is present."""
import json
import re
from pathlib import Path

import pytest

from pope_fast.readout.benchmarks.base import Answer
from pope_fast.readout.benchmarks.mme import MME, read_questions, write_result_folder
from pope_fast.readout.benchmarks.mme_rules import (COGNITION, PERCEPTION, SUBTASKS, lmms_eval_prompt,
                                                    lmms_eval_read, official_read)
from pope_fast.readout.data import DataError, Question
from pope_fast.readout.protocols import yorn

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SYNTHETIC = "benchmarks/mme_synthetic/data/test-00000-of-00001.parquet"
SUFFIX = " Please answer yes or no."


def _row(category, n, answer, question=None, data=None):
    image = f"{n:04d}.png"
    return {"question_id": f"{category}/{image}", "image": {"bytes": data or f"png-{category}-{n}".encode(),
                                                             "path": image},
            "question": question or f"Is it {category} {n} {answer}?{SUFFIX}", "answer": answer, "category": category}


def _rows(*categories, images=2):
    return [_row(c, n, a) for c in categories for n in range(1, images + 1) for a in ("Yes", "No")]


def _parquet(path: Path, rows, drop=()):
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in drop}
    pq.write_table(pa.table(columns), path)
    return path


# ---- questions -------------------------------------------------------------------------------------------

def test_the_synthetic_file_reads_as_84_questions_on_42_images(shared):
    path = shared / SYNTHETIC
    questions = MME.questions(path)
    assert len(questions) == 84 and len({q.key for q in questions}) == 84
    assert len({q.image for q in questions}) == 42
    first, second = questions[:2]
    assert (first.key, first.image, first.label, first.split) == ("existence/0001.png#0", "existence/0001.png",
                                                                  "yes", "existence")
    assert (second.key, second.label) == ("existence/0001.png#1", "no")
    assert first.text == "Is there a circle in this image? Please answer yes or no."
    assert first.image_data.startswith(b"\x89PNG") and first.image_data is second.image_data
    assert {q.split for q in questions} == set(SUBTASKS) and {q.dataset for q in questions} == {"mme"}
    assert MME.detect(path) and MME.detect(path.parent)


def test_keys_follow_file_order_within_an_image_and_shards_read_in_name_order(tmp_path):
    # image 1's No row comes first and image 2's rows sit between image 1's: k is the order in the file
    a_yes, a_no, b_yes, b_no = _row("count", 1, "Yes"), _row("count", 1, "No"), _row("OCR", 2, "Yes"), _row("OCR", 2, "No")
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
    (lambda rows: rows[1].update(category="Existence"), r"row 2: category 'Existence' is not one of MME's 14"),
    (_three_questions, r"row 1: image 'existence/0001.png' has 3 question\(s\); MME has 2 per image$"),
    (lambda rows: rows.pop(), r"row 3: image 'existence/0002.png' has 1 question\(s\); MME has 2 per image$"),
    (lambda rows: rows[0]["image"].update(bytes=None), r"row 1: image has no embedded bytes$"),
    (lambda rows: rows[1]["image"].update(bytes=b"other"),
     r"row 2: image differs from the earlier image of question_id 'existence/0001.png'$"),
    (lambda rows: rows[0].update(question=" "), r"row 1: question ' ' is not a non-empty string$"),
], ids=["lower-yes", "maybe", "category-case", "three-questions", "one-question", "no-bytes", "two-images",
        "blank-question"])
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
    assert not MME.detect(path)


# ---- reading the answer ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, decision", [
    ("Yes", "yes"), ("No", "no"), ("Not sure", "no"), ("None", "no"), ("Yes, no doubt", "yes"),
    ("  yes", "unknown"), ("y", "unknown"), ("The answer is yes", "unknown"), ("", "unknown"),
    ("yes\n", "yes"), ("no\n", "no"), ("y\n", "unknown"), ("nope", "no"), (" no", "no"), ("Yes.", "yes"),
])
def test_official_reading(text, decision):
    assert official_read(text) == decision


def test_a_lines_trailing_newline_never_changes_the_official_reading():
    """calculation.py keeps "\\n" on every line but a file's last (README); the reading is the same either way."""
    texts = ["yes", "no", "y", "n", "ye", "noo", "No.", "  yes", " no", "nay", "yes!", "Not sure", "", " ", "x"]
    assert all(official_read(t) == official_read(t + "\n") for t in texts)


@pytest.mark.parametrize("text, decision", [
    ("y", "yes"), ("n", "no"), ("Yes.", "yes"), ("  yes", "yes"), ("YES\n", "yes"), (" N. ", "no"),
    ("x", "unknown"), ("Not sure", "no"), ("The answer is yes", "unknown"), ("", "unknown"), ("yes.no", "yes"),
])
def test_lmms_eval_reading(text, decision):
    assert lmms_eval_read(text) == decision


@pytest.mark.parametrize("text, decision", [
    ("Not sure", "unknown"), ("Yes, no doubt.", "unknown"), ("Yes.", "yes"), ("  yes", "yes"), ("y", "unknown"),
    ("No, there is none.", "no"),
])
def test_vlmevalkit_reading(text, decision):
    assert MME.rules["vlmevalkit"].read(text) == decision and yorn(text) == decision


def test_rules_their_order_headlines_and_prompts():
    assert list(MME.rules) == ["official", "lmms-eval", "vlmevalkit"]
    assert [r.headline for r in MME.rules.values()] == [("Perception", "Cognition"),
                                                        ("mme_perception_score", "mme_cognition_score"),
                                                        ("perception", "reasoning")]
    assert MME.rules["official"].prompt is None and MME.rules["vlmevalkit"].prompt is None
    assert MME.rules["lmms-eval"].prompt is lmms_eval_prompt
    assert lmms_eval_prompt("  Is a python code shown in the picture? Please answer yes or no. ") == \
        "Is a python code shown in the picture?\nAnswer the question using a single word or phrase."
    assert lmms_eval_prompt("Is it red?") == "Is it red?\nAnswer the question using a single word or phrase."
    assert all(r.sources for r in MME.rules.values())
    assert len(PERCEPTION) == 10 and len(COGNITION) == 4


# ---- aggregation -----------------------------------------------------------------------------------------

def _answers(split, *images):
    """images: per image, a list of (label, decision)."""
    return [Answer(f"{split}/{i}#{k}", split, f"{split}/{i}", label, decision)
            for i, pairs in enumerate(images) for k, (label, decision) in enumerate(pairs)]


RIGHT, WRONG = [("yes", "yes"), ("no", "no")], [("yes", "yes"), ("no", "yes")]
UNKNOWN_ONE = [("yes", "unknown"), ("no", "no")]


def test_aggregations_against_hand_derived_numbers():
    # existence: 3 images (both right, one right, one right): acc = 4/6, acc+ = 1/3.
    #   official and VLMEvalKit: 4/6*100 + 1/3*100 = 66.666…67 + 33.333…33 = 99.99999999999999 in floats;
    #   lmms-eval: mean over images of acc+acc_plus = (200 + 50 + 50) / 3 = 100.0.
    # count: 2 images both right: 100 + 100 = 200 everywhere.
    # code_reasoning: 1 image, its yes question read as unknown (wrong), its no right: 50 + 0 = 50.
    answers = _answers("existence", RIGHT, WRONG, WRONG) + _answers("count", RIGHT, RIGHT) + \
        _answers("code_reasoning", UNKNOWN_ONE)
    official = MME.rules["official"].aggregate(answers)
    assert official["existence/acc"] == 4 / 6 * 100 and official["existence/acc_plus"] == 1 / 3 * 100
    assert official["existence/score"] == 99.99999999999999
    assert official["count/score"] == 200.0 and official["code_reasoning/score"] == 50.0
    assert official["code_reasoning/acc"] == 50.0 and official["code_reasoning/acc_plus"] == 0.0
    # Perception = existence + count = 99.99999999999999 + 200 (which rounds to 300.0); Cognition = 50
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
    # One image: "Yes" to its yes question, "Not sure" to its no question. calculation.py and lmms-eval read
    # "Not sure" as no (its first 4 characters "not " hold "no"): both right, 100 + 100 = 200. VLMEvalKit
    # reads it as Unknown, which exact_matching scores wrong: acc 1/2, acc+ 0 → 50.
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
            (("official", "scene/score"), ("lmms-eval", "scene"), ("vlmevalkit", "scene"))] == [50.0] * 3


def test_vlmevalkits_product_agrees_with_both_right_for_two_answers_and_takes_the_first_two_of_three():
    # With 2 answers of 0/1, val[0]*val[1] is 1 exactly when both are right, so it agrees with calculation.py;
    # it differs only on an image with 3 answers (none in MME): it multiplies the first two (right, right → 1)
    # and averages all three for acc (2/3), where calculation.py and lmms-eval refuse anything but 2.
    two = _answers("color", RIGHT, WRONG)
    assert MME.rules["vlmevalkit"].aggregate(two)["color"] == MME.rules["official"].aggregate(two)["color/score"]
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
