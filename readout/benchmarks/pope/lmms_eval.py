"""lmms-eval's POPE samples logs (`--log_samples`: `<date>_samples_<task>.jsonl`, read by
formats/lmms_eval.py), as records: the text lmms-eval scored becomes each record's decoded answer,
so every text readout and every published protocol rescores it; the logit readouts are unavailable
(the log holds no logits).

What is POPE's in a row (lmms-eval v0.7.2 cb45ac4d, tasks/pope/utils.py l.17-28): one entry per
metric, `{"question_id", "score", "prediction", "ground_truth"}`, the same in each. The row names no
category (the doc is not logged, formats/lmms_eval.py): the split is the task's
(tasks/pope/pope_adv.yaml's test_split adversarial, and so on), told from the file's name, never
guessed. `pope` (tasks/pope/pope.yaml: lmms-lab/POPE's test split, whose `category` column names
each question's split, 9,000 questions aggregated at once by utils.py l.31-84) is split `all`: no
row carries the category and a doc's split is not inferred from its position, so the pooled log is
scored as one split, as lmms-eval scores it.
"""
from __future__ import annotations

import re
from pathlib import Path

from ...data import LABELS, DataError
from ...formats.lmms_eval import Sample, is_sample, read_samples
from ...records import Entry, RecordSet

METRIC = "pope_accuracy"  # every POPE metric's entry holds the same fields; this one always logged
TASK_SPLITS = {"pope_adv": "adversarial", "pope_pop": "popular", "pope_random": "random",
               "pope": "all"}
POOLED_TASK = "pope"
_TASK = re.compile(r"samples_(pope(?:_adv|_pop|_random)?)(?:\.jsonl|_)")


def is_samples_log(first_row: object) -> bool:
    return is_sample(first_row, (METRIC,))


def task_of(path: Path) -> str:
    found = _TASK.search(path.name)
    if found is None:
        raise DataError(f"{path}: an lmms-eval POPE samples log whose name names no POPE task "
                        f"({', '.join(TASK_SPLITS)}), so its split is unknown: keep lmms-eval's "
                        "file name")
    rest = path.name[found.end(1):].lower()
    named = next((s for s in ("adversarial", "popular", "random") if s in rest), None)
    # `samples_pope_adversarial.jsonl`: one split's, not the pooled
    if found.group(1) == POOLED_TASK and named:
        task = next(t for t, s in TASK_SPLITS.items() if s == named)
        raise DataError(f"{path}: the name reads as the pooled task `pope` (split all) followed by "
                        f"{named!r}, a split: rename it as lmms-eval names its per-split task's "
                        f"log (samples_{task}.jsonl) or its pooled one (samples_pope.jsonl)")
    return found.group(1)


def _entry(sample: Sample, split: str, pooled: bool) -> Entry:
    entry = sample.metrics.get(METRIC)
    if not isinstance(entry, dict):
        raise DataError(f"{sample.where}: not an lmms-eval POPE sample (no {METRIC} entry)")
    label = str(entry.get("ground_truth", sample.target or "")).lower().strip()
    if label not in LABELS or "question_id" not in entry:
        raise DataError(f"{sample.where}: {METRIC} needs question_id and a yes/no ground_truth, "
                        f"not {entry!r}")
    # The key. A per-split task's docs are one POPE split, whose question ids are unique (1..3000 in
    # each of lmms-lab/POPE's Full/{split}): keyed by question_id as every POPE record is, such a
    # log pairs question by question with a pope-fast run of that split (compare joins on dataset,
    # split, key) and RePOPE relabels it (relabel.py joins on split, question_id). The pooled task's
    # docs are the three splits, each numbering its questions from 1, so question ids repeat three
    # times; lmms-eval keys those docs by doc_id, and so does this: split `all` pairs with no split
    # of a pope-fast run and RePOPE covers no split `all`, so nothing that joins on question_id is
    # lost.
    key = sample.doc_id if pooled else entry["question_id"]
    return Entry(key=str(key), split=split, label=label, decoded=sample.text)


def read_lmms_eval(path: Path, text: str) -> RecordSet:
    """The records of a POPE samples log: split the task's (from the file's name), keyed by
    question_id, or by doc_id for the pooled `pope` task; a repeated key is a DataError naming its
    line."""
    task = task_of(path)
    entries, seen = [], {}
    for sample in read_samples(path, text):
        entry = _entry(sample, TASK_SPLITS[task], task == POOLED_TASK)
        if entry.key in seen:  # only question ids repeat: read_samples refuses a repeated doc_id
            raise DataError(f"{sample.where}: question_id {entry.key} repeats "
                            f"(first at {seen[entry.key]}), but a {task} log is one POPE split")
        seen[entry.key] = sample.where
        entries.append(entry)
    meta = {"imported_from": "lmms-eval", "task": task,
            "key": "doc_id" if task == POOLED_TASK else "question_id"}
    return RecordSet(str(path), entries, {}, meta, prefer_stored=False)
