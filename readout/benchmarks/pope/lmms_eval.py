"""lmms-eval's POPE samples logs (`--log_samples`: `<date>_samples_<task>.jsonl`, read by formats/lmms_eval.py),
as records: the text lmms-eval scored becomes each record's decoded answer, so every text readout and every
published protocol rescores it; the logit readouts are unavailable (the log holds no logits).

What is POPE's in a row (lmms-eval v0.7.2 cb45ac4d, tasks/pope/utils.py l.17-28): one entry per metric,
`{"question_id", "score", "prediction", "ground_truth"}`, the same in each. The row names no category (the
doc is not logged, formats/lmms_eval.py): the split is the task's (tasks/pope/pope_adv.yaml's test_split
adversarial, and so on), told from the file's name, never guessed. `pope` (the three categories of lmms-lab/POPE's
test split, pooled) is split `all`.
"""
from __future__ import annotations

import re
from pathlib import Path

from ...data import LABELS, DataError
from ...formats.lmms_eval import Sample, is_sample, read_samples
from ...records import Entry, RecordSet

METRIC = "pope_accuracy"  # every POPE metric's entry holds the same fields; this one is always logged
TASK_SPLITS = {"pope_adv": "adversarial", "pope_pop": "popular", "pope_random": "random", "pope": "all"}
_TASK = re.compile(r"samples_(pope(?:_adv|_pop|_random)?)(?:\.jsonl|_)")


def is_samples_log(first_row: object) -> bool:
    return is_sample(first_row, (METRIC,))


def task_of(path: Path) -> str:
    found = _TASK.search(path.name)
    if found is None:
        raise DataError(f"{path}: an lmms-eval POPE samples log whose name names no POPE task "
                        f"({', '.join(TASK_SPLITS)}), so its split is unknown: keep lmms-eval's file name")
    return found.group(1)


def _entry(sample: Sample, split: str) -> Entry:
    entry = sample.metrics.get(METRIC)
    if not isinstance(entry, dict):
        raise DataError(f"{sample.where}: not an lmms-eval POPE sample (no {METRIC} entry)")
    label = str(entry.get("ground_truth", sample.target or "")).lower().strip()
    if label not in LABELS or "question_id" not in entry:
        raise DataError(f"{sample.where}: {METRIC} needs question_id and a yes/no ground_truth, not {entry!r}")
    return Entry(key=str(entry["question_id"]), split=split, label=label, decoded=sample.text)


def read_lmms_eval(path: Path, text: str) -> RecordSet:
    """The records of a POPE samples log: split the task's (from the file's name), keyed by question_id; a
    question_id seen before is a DataError naming its line."""
    task = task_of(path)
    entries, seen = [], {}
    for sample in read_samples(path, text):
        entry = _entry(sample, TASK_SPLITS[task])
        if entry.key in seen:
            raise DataError(f"{sample.where}: question_id {entry.key} repeats (first at {seen[entry.key]})")
        seen[entry.key] = sample.where
        entries.append(entry)
    meta = {"imported_from": "lmms-eval", "task": task}
    return RecordSet(str(path), entries, {}, meta, prefer_stored=False)
