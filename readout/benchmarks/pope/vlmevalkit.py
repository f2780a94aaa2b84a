"""VLMEvalKit's POPE prediction tables (`<model>_POPE.tsv` with PRED_FORMAT=tsv, or `.csv`), read as
records: each row's `prediction` becomes its decoded answer, so every text readout and protocol
rescores it (`--protocol vlmevalkit` gives VLMEvalKit's own numbers under exact matching).

The table holds POPE.tsv's columns plus `prediction` (vlmeval/inference.py; written by
vlmeval/smp/file.py dump_tsv, l.176-177: tab-separated, every field quoted). `answer` is Yes/No;
`category` names the split, or several joined by commas where one question stands in more than one
split (yorn.py l.160 splits and explodes it; so does this reader: one record per split). The key is
`index`. VLMEvalKit's default format, .xlsx, needs an Excel reader this project does not depend on:
run VLMEvalKit with PRED_FORMAT=tsv.
"""
from __future__ import annotations

from pathlib import Path

from ...data import DataError
from ...formats.vlmevalkit import read_table
from ...records import Entry, RecordSet
from .questions import KNOWN_SPLITS

COLUMNS = ("index", "answer", "category", "prediction")
ANSWERS = {"Yes": "yes", "No": "no"}


def read_vlmevalkit(path: Path) -> RecordSet:
    """The table's records, each row checked as every VLMEvalKit table is (read_table: its field
    count, a stripped, unique index), then as POPE's (its answer, its splits)."""
    entries, seen = [], {}
    for where, row in read_table(path, COLUMNS, "POPE"):
        if row["answer"] not in ANSWERS:
            raise DataError(f"{where}: answer {row['answer']!r} is not Yes or No")
        splits = [c.strip().lower() for c in (row["category"] or "").split(",")]
        if not splits or any(s not in KNOWN_SPLITS for s in splits):
            raise DataError(f"{where}: category {row['category']!r} is not POPE's splits "
                            f"({', '.join(KNOWN_SPLITS)}, comma-joined)")
        for split in splits:
            key = (split, row["index"].strip())
            if key in seen:
                raise DataError(f"{where}: index {row['index']} is in {split} twice "
                                f"(first at {seen[key]})")
            seen[key] = where
            entries.append(Entry(key=row["index"].strip(), split=split,
                                 label=ANSWERS[row["answer"]], decoded=row["prediction"],
                                 text=row.get("question")))
    return RecordSet(str(path), entries, {}, {"imported_from": "VLMEvalKit"}, prefer_stored=False)
