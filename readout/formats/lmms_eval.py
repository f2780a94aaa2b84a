"""lmms-eval's samples logs (`--log_samples`: `<date>_samples_<task>.jsonl`), the one reader of
them: POPE's room (benchmarks/pope/lmms_eval.py) and MME's (benchmarks/mme/results.py) each say
which metric entry they read and what its fields mean for their questions.

lmms-eval (EvolvingLMMs-Lab/lmms-eval, v0.7.2 cb45ac4d and 75571cfe alike) logs one JSON object a
doc, one a line: evaluator.py (cb45ac4d l.1155-1197, 75571cfe l.1252-1296) builds it from `doc_id`
(the doc's index in the task's split), `target` (doc_to_target), `arguments`, `resps`,
`filtered_resps` (one per request), the doc less its images, `token_counts`, `doc_hash`,
`input_media` where the doc has any, then `example.update(metrics)`: every entry process_results
returned, by metric name. loggers/evaluation_tracker.py (l.265-286 at both) adds `input`, str()s
`target`, drops `arguments` and `doc`, and since v0.7 (d8fcb9c3) unwraps a one-item `filtered_resps`
to the string itself (a list of one before). So a row names no field of the doc: what a room needs
of it must be in its metric entries, and `doc_id` is the one key lmms-eval itself gives every row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..data import DataError, read_text

# What evaluator.py and evaluation_tracker.py put in a row themselves; any other is a metric's.
LOGGED = ("doc_id", "doc", "target", "arguments", "input", "resps", "filtered_resps",
          "token_counts", "doc_hash", "input_media")


@dataclass(frozen=True)
class Sample:
    """One row of a samples log: `where` is `file:line`, `text` the answer lmms-eval scored
    (`filtered_resps`, unwrapped), `target` as logged (a str since evaluation_tracker.py str()s it;
    None where absent), `metrics` every metric entry of the row by name."""

    where: str
    doc_id: int
    target: object
    text: str
    metrics: dict


def is_sample(row: object, metrics: tuple[str, ...]) -> bool:
    """Whether `row` is a samples-log row with an entry of one of `metrics`; detection uses it, so
    it never raises."""
    return (isinstance(row, dict) and "doc_id" in row
            and any(isinstance(row.get(m), dict) for m in metrics))


def first_row(path: Path) -> object:
    """The first line of `path` as JSON, or None where it is no readable JSON (never raises)."""
    try:
        with Path(path).open(encoding="utf-8") as file:
            return json.loads(file.readline())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _answer_text(row: dict, where: str) -> str:
    text = row.get("filtered_resps")
    while isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise DataError(f"{where}: filtered_resps {row.get('filtered_resps')!r} holds no one "
                        "answer text")
    return text


def _sample(row: object, where: str) -> Sample:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "doc_id" not in row:
        raise DataError(f"{where}: no doc_id (not an lmms-eval samples log?)")
    doc_id = row["doc_id"]
    if not isinstance(doc_id, int) or isinstance(doc_id, bool):
        raise DataError(f"{where}: doc_id {doc_id!r} is not an int")
    metrics = {name: value for name, value in row.items() if name not in LOGGED}
    return Sample(where, doc_id, row.get("target"), _answer_text(row, where), metrics)


def read_samples(path: Path, text: str | None = None) -> list[Sample]:
    """Every row of a samples log in file order (`text`: the file's text where the caller has read
    it). A blank line is skipped; malformed JSON, a row without an int doc_id or one answer text, a
    doc_id seen before and a log without rows are DataErrors naming the file (and line)."""
    path = Path(path)
    if text is None:
        text = read_text(path, "samples file")
    samples, seen = [], {}
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            sample = _sample(json.loads(line), where)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: malformed JSON: {err.msg}") from None
        if sample.doc_id in seen:
            raise DataError(f"{where}: doc_id {sample.doc_id} repeats "
                            f"(first at {seen[sample.doc_id]})")
        seen[sample.doc_id] = where
        samples.append(sample)
    if not samples:
        raise DataError(f"{path}: no samples")
    return samples
