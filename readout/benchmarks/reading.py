"""Reading a records file, whichever tool wrote it, told by its content: ours (a run folder, its
rank parts included, or its records.jsonl: readout/records.py) or another tool's per-question file,
which POPE's room imports (pope/: ugaa-research's record files, lmms-eval's samples logs,
VLMEvalKit's prediction tables)."""
from __future__ import annotations

import json
from pathlib import Path

from ..data import DataError
from ..formats.vlmevalkit import is_prediction_table
from ..records import RECORDS_FILE, RecordSet, rank_parts, read_ours
from .pope.lmms_eval import is_samples_log, read_lmms_eval
from .pope.ugaa import read_ugaa
from .pope.vlmevalkit import read_vlmevalkit


def read_records(path: str | Path) -> RecordSet:
    """Our records (a run folder, its rank parts included, or its records.jsonl), a published
    ugaa-research file, an lmms-eval POPE samples log or a VLMEvalKit POPE prediction table."""
    path = Path(path)
    parts = rank_parts(path) if path.is_dir() else []
    if path.is_dir():
        path = path / RECORDS_FILE
    if not path.is_file() and not parts:
        raise DataError(f"{path}: no such records file")
    if is_prediction_table(path):
        return read_vlmevalkit(path)
    files = [(f, _text(f)) for f in ([path] if path.is_file() else []) + parts]
    text = next((t for _, t in files if t.strip()), None)
    if text is None:
        raise DataError(f"{path}: no records yet (the file is empty)")
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None  # JSON lines: several objects
        if isinstance(obj, dict) and isinstance(obj.get("results"), list):
            return read_ugaa(path, obj)
        if is_samples_log(_first_row(text)):
            return read_lmms_eval(path, text)
        return read_ours(path, files)
    raise DataError(f"{path}: neither pope-fast JSON-lines records nor a ugaa-research record file")


def _first_row(text: str):
    try:
        return json.loads(text.lstrip().split("\n", 1)[0])
    except json.JSONDecodeError:
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
