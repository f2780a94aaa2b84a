"""A run folder's records without a model: the writer's key (dataset, split, question id), its
duplicate check, which questions a resume retries (error records, never a complete one), and what
check_done proves of each recorded question. Each test fails on a wrong index or key in
pope_fast/store.py or pope_fast/resume.py."""
import hashlib
import json

import pytest

from pope_fast.readout import Question
from pope_fast.readout.data import DataError
from pope_fast.readout.records import make_record
from pope_fast.resume import check_done
from pope_fast.store import RecordWriter, order_records, repair_records


def _q(qid, split="random", dataset="coco", image=None, text="Is there a dog?", label="yes"):
    return Question(qid, image or f"img{qid}.png", text, label, split, dataset)


def _answer(q, first=1, **kwargs):
    return make_record(q, "t", first_token_id=first, candidate_logits={first: 0.5}, **kwargs)


def _lines(folder):
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


def test_one_question_id_in_other_splits_or_datasets_is_another_question(tmp_path):
    """POPE reuses question ids in every split and dataset: the key holds all three, in record_key's
    order."""
    asked = [_q(1), _q(1, split="popular"), _q(1, dataset="aokvqa"), _q(2)]
    with RecordWriter(tmp_path) as w:
        w.write([_answer(q) for q in asked])
    done = RecordWriter(tmp_path).open()
    assert set(done) == {("coco", "random", "1"), ("coco", "popular", "1"),
                         ("aokvqa", "random", "1"), ("coco", "random", "2")}
    assert done[("aokvqa", "random", "1")]["dataset"] == "aokvqa"
    assert done[("coco", "popular", "1")]["split"] == "popular"


def test_two_complete_records_of_one_question_are_refused_naming_the_second_line(tmp_path):
    q = _q(7, split="adversarial")
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                    (_answer(_q(6)), _answer(q, 1), _answer(_q(8)),
                                                     _answer(q, 2))))
    with pytest.raises(DataError,
                       match=r"records\.jsonl:4: duplicate record for question 7 of split "
                             r"adversarial \(two runs wrote to this folder\); `pope-fast repair "):
        RecordWriter(tmp_path).open()


def test_a_complete_record_in_a_rank_part_and_in_the_records_is_a_duplicate(tmp_path):
    q = _q(3)
    (tmp_path / "records.rank1.jsonl").write_text(json.dumps(_answer(q, 1)) + "\n")
    (tmp_path / "records.jsonl").write_text(json.dumps(_answer(q, 2)) + "\n")
    with pytest.raises(DataError,
                       match=r"records\.jsonl:1: duplicate record for question 3 of split random"):
        RecordWriter(tmp_path, also=("records.rank1.jsonl",)).open()


def test_error_records_are_retried_and_never_undo_an_answer(tmp_path):
    """What a resume retries: a question whose records are errors only. Errors repeated, an error
    superseded by an answer, or an error after an answer (a fold of a part) are no duplicates."""
    failing, recovered, answered, fresh = _q(1), _q(2), _q(3), _q(4)
    with RecordWriter(tmp_path) as w:
        w.write([_answer(fresh, 5), make_record(failing, "t", error="image missing"),
                 make_record(recovered, "t", error="image missing"),
                 make_record(failing, "t", error="undecodable")])
        w.write([_answer(recovered, 9), _answer(answered, 4)])
        w.write([make_record(answered, "t", error="image missing")])
        live = (set(w.done), dict(w.errors), set(w.recorded))
    w = RecordWriter(tmp_path)
    done = w.open()
    key = {q: ("coco", "random", str(q.question_id)) for q in (failing, recovered, answered, fresh)}
    assert set(done) == {key[recovered], key[answered], key[fresh]}  # so the retry set is {failing}
    assert (done[key[recovered]]["first_token_id"] == 9
            and done[key[answered]]["first_token_id"] == 4)
    assert w.errors == {key[failing]: "undecodable", key[recovered]: "image missing",
                        key[answered]: "image missing"}
    assert w.recorded == set(key.values())
    # the writer's own view while writing is what a reopen reads
    assert live == (set(done), w.errors, w.recorded)


def test_order_records_keeps_one_line_per_question(tmp_path):
    """An error then an answer keeps the answer; errors only keep the last one; lines of questions
    the order lacks go first as they were; the rest follow the order (not the file's)."""
    a, b, c, other = _q(1), _q(2), _q(3), _q(1, split="popular")
    with RecordWriter(tmp_path) as w:
        w.write([_answer(c, 3), make_record(a, "t", error="e1"), _answer(other, 8),
                 make_record(b, "t", error="e1"), _answer(a, 1), make_record(b, "t", error="e2")])
    order = {("coco", "random", "1"): 0, ("coco", "random", "2"): 1, ("coco", "random", "3"): 2}
    assert order_records(tmp_path, order)
    kept = [(r["split"], r["question_id"], r.get("error"), r.get("first_token_id"))
            for r in _lines(tmp_path)]
    assert kept == [("popular", 1, None, 8), ("random", 1, None, 1), ("random", 2, "e2", None),
                    ("random", 3, None, 3)]
    assert not order_records(tmp_path, order)


def test_repair_keeps_the_last_complete_record_of_each_question(tmp_path):
    a, b, c = _q(1), _q(2), _q(2, dataset="gqa")
    lines = [_answer(a, 1), _answer(b, 2), _answer(a, 3), make_record(a, "t", error="late"),
             _answer(c, 4), make_record(b, "t", error="x")]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines)
                                            + "not json\n")

    (tmp_path / "records.rank0.jsonl").write_text(json.dumps(_answer(_q(5), 5)) + "\n")
    # kept: a, b, c, 5; dropped: a's first and its error, b's error, junk
    assert repair_records(tmp_path) == (4, 4)
    got = {(r.get("dataset"), r["question_id"]): r["first_token_id"] for r in _lines(tmp_path)}
    assert got == {("coco", 1): 3, ("coco", 2): 2, ("gqa", 2): 4, ("coco", 5): 5}
    assert not (tmp_path / "records.rank0.jsonl").exists()


@pytest.fixture
def recorded(tmp_path):
    """A folder with two answered questions of one image, and the images folder."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "img.png").write_bytes(b"the image's bytes")
    digest = hashlib.sha256(b"the image's bytes").hexdigest()
    asked = [_q(1, image="img.png"), _q(2, image="img.png", label="no", text="Is there a cat?")]
    with RecordWriter(tmp_path / "run") as w:
        w.write([_answer(q, image_sha256=digest) for q in asked])
    return tmp_path / "run", images, asked


def _check(folder, asked, images):
    with RecordWriter(folder) as writer:
        check_done(writer, asked, images, {}, workers=1)


def test_check_done_proves_each_recorded_question_is_this_one(recorded):
    folder, images, asked = recorded
    # unrecorded questions are simply to do
    _check(folder, asked + [_q(3, image="img.png")], images)
    # another split's question 1
    _check(folder, [_q(1, split="popular", image="img.png", label="no")], images)
    for field, change in (("label", {"label": "yes"}), ("text", {"text": "Is there a cow?"}),
                          ("image", {"image": "other.png"})):
        edited = [_q(**{"qid": 2, "image": "img.png", "label": "no", "text": "Is there a cat?",
                        **change})]
        with pytest.raises(ValueError,
                           match=rf"question 2 of split random was recorded with {field} "):
            _check(folder, asked[:1] + edited, images)
    (images / "img.png").write_bytes(b"other bytes")
    with pytest.raises(ValueError,
                       match=r"img\.png: question 1 of split random was answered from other bytes"):
        _check(folder, asked, images)


def test_check_done_refuses_a_recorded_question_of_this_split_that_is_not_asked(recorded):
    folder, images, asked = recorded
    with pytest.raises(ValueError,
                       match=r"question 2 of split random is recorded here but not in this run's "
                             r"question file \(1 such\)"):

        _check(folder, asked[:1], images)
    # another split: its records are not counted
    _check(folder, [_q(1, split="popular", image="img.png")], images)
