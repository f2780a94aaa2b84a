"""lmms-eval's samples logs (readout/formats/lmms_eval.py, the one reader; POPE's and MME's rooms each read their
metric entry), on rows built here as lmms-eval writes them: evaluator.py's example (cb45ac4d l.1180-1197) after
evaluation_tracker.py's clean-up (l.265-286: `input` added, `target` str()ed, `arguments` and `doc` dropped, a
one-item `filtered_resps` unwrapped since v0.7)."""
import json
import re

import pytest

from pope_fast.readout.data import DataError
from pope_fast.readout.formats.lmms_eval import first_row, is_sample, read_samples


def _row(doc_id, text, flat=True, **metrics):
    return {"doc_id": doc_id, "target": "yes", "resps": [text], "filtered_resps": text if flat else [text],
            "token_counts": [None], "doc_hash": "ab12", "input": "Is there a dog?", **metrics}


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_row_is_its_doc_id_target_text_and_metric_entries(tmp_path):
    """Every field lmms-eval did not add itself is a metric's entry, a dict or a number alike; the answer text is
    unwrapped from the list of one logs before v0.7 wrote; a blank line is skipped but counted."""
    path = _write(tmp_path / "samples_x.jsonl", [_row(4, "Yes", m={"question_id": 9}, exact_match=1.0), "",
                                                 _row(0, "No", flat=False, m={"question_id": 3})])
    first, second = read_samples(path)
    assert (first.where, first.doc_id, first.target, first.text) == (f"{path}:1", 4, "yes", "Yes")
    assert first.metrics == {"m": {"question_id": 9}, "exact_match": 1.0}
    assert (second.where, second.doc_id, second.text) == (f"{path}:3", 0, "No")
    assert second.metrics == {"m": {"question_id": 3}}
    assert read_samples(path, path.read_text().replace("Yes", "Maybe"))[0].text == "Maybe"  # the text given is read
    assert is_sample(first_row(path), ("m",)) and not is_sample(first_row(path), ("other",))
    assert first_row(tmp_path / "absent.jsonl") is None


@pytest.mark.parametrize("line, message", [
    ('{"doc_id": 1, "filtered_resps": "no"', "malformed JSON: Expecting ',' delimiter"),
    ('["not", "a", "row"]', "expected a JSON object, got list"),
    ('{"filtered_resps": "no", "m": {}}', "no doc_id (not an lmms-eval samples log?)"),
    ('{"doc_id": "1", "filtered_resps": "no"}', "doc_id '1' is not an int"),
    ('{"doc_id": true, "filtered_resps": "no"}', "doc_id True is not an int"),
    ('{"doc_id": 1, "filtered_resps": ["a", "b"]}', "filtered_resps ['a', 'b'] holds no one answer text"),
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
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'no.jsonl'}: no such samples file")):
        read_samples(tmp_path / "no.jsonl")
    latin = tmp_path / "samples_y.jsonl"
    latin.write_bytes(b'{"doc_id": 0, "filtered_resps": "caf\xe9"}\n')
    with pytest.raises(DataError, match=re.escape(f"{latin}: not UTF-8 text")):
        read_samples(latin)
