"""The one definition of what a record keeps of an answer (AnswerFields): every field written by
make_record, read back by the reader and checked by checked_record, whichever fields it holds."""
import json
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest

from pope_fast.readout import DataError, Question, make_record
from pope_fast.readout.records import AnswerFields, checked_record, read_ours

QUESTION = Question(3, "img0.jpg", "Is there a dog?", "yes", "random", "coco")
# a value unlike its default for each field whose JSON is not read back by its type alone
SAMPLES = {"candidate_logits": {3869: 1.5, 1939: -math.inf}, "logsumexp": 2.25,
           "decoded": "Yes, there is",
           "texts": {"string_parse": "Yes"}, "capped": ("pope_official",)}
# a value of another JSON type than each field's
WRONG = {str: 5, int: "5", dict: [1], list: {"a": 1}}


def _sample() -> AnswerFields:
    """An answer whose every field holds something other than its default: a str its name, an int
    its position."""
    values = {}
    for k, f in enumerate(fields(AnswerFields)):
        json_type = f.metadata["json"]
        values[f.name] = SAMPLES.get(f.name, f.name if json_type is str else 100 + k
                                     if json_type is int else None)
        assert values[f.name] is not None, \
            f"test_answer_fields: give {f.name} a sample value in SAMPLES"
    return AnswerFields(**values)


def _read(record: dict):
    path = Path("run") / "records.jsonl"
    [entry] = read_ours(path, [(path, json.dumps(record, allow_nan=False) + "\n")]).entries
    return entry


def test_every_field_is_written_and_read_back():
    answer = _sample()
    kept = dict(predictions={"legacy_2tok": "yes"}, image_sha256="0" * 64)
    record = make_record(QUESTION, "t", answer, **kept)
    assert [k for k in record if k in {f.name for f in fields(AnswerFields)}] == [
        f.name for f in fields(AnswerFields)]
    # the answer's fields in the definition's order, before the decisions
    assert list(record)[-1] == "predictions"
    entry = _read(record)
    assert entry.as_answer() == answer and entry.stored == {"legacy_2tok": "yes"}
    # its fields as keywords: the same record
    assert make_record(QUESTION, "t", **vars(answer), **kept) == record


def test_every_field_with_a_json_type_is_checked():
    record = make_record(QUESTION, "t", _sample())
    checked = [f for f in fields(AnswerFields) if f.metadata["json"] is not None]
    assert len(checked) >= 8
    for f in checked:
        wrong = WRONG[f.metadata["json"]]
        message = (f"x:1: {f.name} {wrong!r} is not {'an' if wrong == '5' else 'a'} "
                   f"{f.metadata['json'].__name__}")
        with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
            checked_record({**record, f.name: wrong}, "x:1")
    with pytest.raises(DataError, match="first_token_id True is not an int"):
        checked_record({**record, "first_token_id": True}, "x:1")


def test_an_answer_and_its_fields_as_keywords_are_refused_together():
    with pytest.raises(TypeError, match=r"an answer or its fields \(decoded\), not both"):
        make_record(QUESTION, "t", AnswerFields(first_token_id=1), decoded="Yes")
