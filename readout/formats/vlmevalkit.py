"""VLMEvalKit's prediction tables, the one reader of them: POPE's room
(benchmarks/pope/vlmevalkit.py) and the MME, AMBER and HallusionBench rooms each say what the rows
mean for their questions.

VLMEvalKit (open-compass/VLMEvalKit@e8e78f05) writes, per model and dataset, the dataset's TSV rows
less the base64 `image` column plus `prediction` (vlmeval/inference.py:280-285), as .xlsx by default
or as .tsv/.csv with PRED_FORMAT (vlmeval/smp/file.py:173-177: every field quoted). Its scorer then
reads, per row: `prediction` (str()-ed, image_yorn.py:47), `answer` (compared with the extraction,
image_yorn.py:88-91), `category` and `image_path` (MME_rating and AMBER_rating group by them,
yorn.py:24-32, 56-61) and, for HallusionBench, `l2-category` and the ids in `index` (yorn.py:102,
110, 117-119). Those are the columns the rooms require. .xlsx is refused (`read_table`): it needs an
Excel reader this project does not depend on.
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..data import DataError

BASE = ("index", "question", "answer", "category", "prediction")
SUFFIXES = {".tsv": "\t", ".csv": ","}


def is_prediction_table(path: Path) -> bool:
    """Whether `path` is named as a prediction table (.xlsx too, which `read_table` refuses)."""
    return path.suffix in SUFFIXES or path.suffix == ".xlsx"


def is_table(path: Path) -> bool:
    return Path(path).suffix in SUFFIXES and Path(path).is_file()


def _reader(file, path: Path):
    # strict: VLMEvalKit quotes every field, so a quote left open (a row swallowing the next ones)
    # is an error where the lenient reader would read one row fewer without a word
    return csv.DictReader(file, delimiter=SUFFIXES[path.suffix], strict=True)


def _open(path: Path):
    # a spreadsheet's BOM is no part of `index`
    return Path(path).open(encoding="utf-8-sig", newline="")


def _refuse_xlsx(path: Path) -> None:
    if path.suffix == ".xlsx":
        raise DataError(f"{path}: VLMEvalKit's .xlsx needs an Excel reader pope-fast does not "
                        "depend on: run VLMEvalKit with PRED_FORMAT=tsv "
                        "(or save the sheet as .tsv)")


def header(path: Path) -> list[str] | None:
    """The table's column names, or None where `path` is no readable table; detect uses it, so it
    never raises."""
    try:
        with _open(path) as file:
            return list(_reader(file, Path(path)).fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error, KeyError):
        return None


def column_values(path: Path, column: str) -> set[str] | None:
    """Every value of one column, or None where the table lacks it or won't read (never raises)."""
    try:
        with _open(path) as file:
            reader = _reader(file, Path(path))
            if column not in (reader.fieldnames or []):
                return None
            return {row[column] for row in reader}
    except (OSError, UnicodeDecodeError, csv.Error, KeyError):
        return None


def fits(path: Path, required: tuple[str, ...], categories) -> bool:
    """Whether `path` is a prediction table with these columns whose every `category` is one of
    `categories`: how a room tells its table from POPE's (whose categories are POPE's splits) and
    from the others'."""
    columns = header(path) if is_table(path) else None
    if columns is None or not set(required) <= set(columns):
        return False
    found = column_values(path, "category")
    return bool(found) and found <= set(categories)


def read_table(path: Path, required: tuple[str, ...], dataset: str) -> list[tuple[str, dict]]:
    """(where, row) per row, where `file:line` names the row's last physical line (a quoted field
    may span lines); a missing column, a blank index or an index seen before is a DataError naming
    the file and line."""
    path = Path(path)
    _refuse_xlsx(path)
    reader = None
    try:
        with _open(path) as file:
            reader = _reader(file, path)
            columns = reader.fieldnames or []
            if not columns:
                raise DataError(f"{path}: no rows")
            missing = [c for c in required if c not in columns]
            if missing:
                raise DataError(f"{path}:1: missing column(s) {', '.join(missing)} (a VLMEvalKit "
                                f"{dataset} prediction table has {', '.join(required)})")
            rows, seen = [], {}
            for row in reader:
                where = f"{path}:{reader.line_num}"
                # more or fewer fields than the header
                if None in row or any(row[c] is None for c in required):
                    raise DataError(f"{where}: {len(columns)} columns in the header, "
                                    "not in this row")
                index = row["index"].strip()
                if not index:
                    raise DataError(f"{where}: blank index")
                if index in seen:
                    raise DataError(f"{where}: index {index} repeats {seen[index]}")
                seen[index] = where
                rows.append((where, row))
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
    except csv.Error as err:
        after = f"the row after line {reader.line_num}" if reader is not None else "its header"
        raise DataError(f"{path}: {after} is no well-formed {SUFFIXES[path.suffix]!r}-separated "
                        f"row ({err}: a quote left open?)") from None
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def label(where: str, value: str, answers: dict[str, str]) -> str:
    if value not in answers:
        raise DataError(f"{where}: answer {value!r} is not {' or '.join(answers)}")
    return answers[value]
