"""lmms-eval's POPE samples logs (`--log_samples`: `<date>_samples_<task>.jsonl`), read as records: the text
lmms-eval scored (`filtered_resps`) becomes each record's decoded answer, so every text readout and every
published protocol rescores it; the logit readouts are unavailable (the log holds no logits).

A row (lmms-eval v0.7.2, lmms_eval/evaluator.py and loggers/evaluation_tracker.py): `doc_id`, `target`
(the doc's answer), `filtered_resps` (the answer text: a one-item list before v0.7, the string since), and
one entry per metric from tasks/pope/utils.py l.17-28, `{"question_id", "score", "prediction",
"ground_truth"}`. The row names no category: the split is the task's (tasks/pope/pope_adv.yaml's
test_split adversarial, and so on), told from the file's name, never guessed; `pope` (the three
categories of lmms-lab/POPE's test split, pooled) is split `all`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ...data import LABELS, DataError
from ...records import Entry, RecordSet

METRIC = "pope_accuracy"  # every POPE metric's entry holds the same fields; this one is always logged
TASK_SPLITS = {"pope_adv": "adversarial", "pope_pop": "popular", "pope_random": "random", "pope": "all"}
_TASK = re.compile(r"samples_(pope(?:_adv|_pop|_random)?)(?:\.jsonl|_)")


def is_samples_log(first_row: object) -> bool:
    return isinstance(first_row, dict) and isinstance(first_row.get(METRIC), dict) and "doc_id" in first_row


def task_split(path: Path) -> str:
    found = _TASK.search(path.name)
    if found is None:
        raise DataError(f"{path}: an lmms-eval POPE samples log whose name names no POPE task "
                        f"({', '.join(TASK_SPLITS)}), so its split is unknown: keep lmms-eval's file name")
    return TASK_SPLITS[found.group(1)]


def _entry(row: object, where: str, split: str) -> Entry:
    if not is_samples_log(row):
        raise DataError(f"{where}: not an lmms-eval POPE sample (no doc_id, or no {METRIC} entry)")
    entry = row[METRIC]
    text = row.get("filtered_resps")
    while isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise DataError(f"{where}: filtered_resps {row.get('filtered_resps')!r} holds no one answer text")
    label = str(entry.get("ground_truth", row.get("target", ""))).lower().strip()
    if label not in LABELS or "question_id" not in entry:
        raise DataError(f"{where}: {METRIC} needs question_id and a yes/no ground_truth, not {entry!r}")
    return Entry(key=str(entry["question_id"]), split=split, label=label, decoded=text)


def read_lmms_eval(path: Path, text: str) -> RecordSet:
    split = task_split(path)
    entries, seen = [], {}
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            entry = _entry(json.loads(line), where, split)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: malformed JSON: {err.msg}") from None
        if entry.key in seen:
            raise DataError(f"{where}: question_id {entry.key} repeats (first at {seen[entry.key]})")
        seen[entry.key] = where
        entries.append(entry)
    meta = {"imported_from": "lmms-eval", "task": next(t for t, s in TASK_SPLITS.items() if s == split)}
    return RecordSet(str(path), entries, {}, meta, prefer_stored=False)
