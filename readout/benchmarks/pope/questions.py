"""POPE question files.

Three layouts exist in the wild. JSON lines (RUCAIBox/POPE `output/coco/coco_pope_*.json`) and JSON
arrays (their A-OKVQA and GQA files) share the keys `question_id`, `image`, `text`, `label`; the
lmms-lab/POPE parquet files (`Full/{split}-*.parquet`, or one test split with a `category` column)
hold `question_id`, `question`, `answer`, `category`, `image_source` and the image itself as a
`{bytes, path}` struct. Labels are always joined on `question_id`, never on line order: the official
`evaluate.py` joins by position, which silently mis-scores any answer file that was filtered,
resumed or reordered.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ...data import LABELS, DataError, Question, open_parquet, read_text, surrogate_fault

REQUIRED_KEYS = ("question_id", "image", "text", "label")

KNOWN_SPLITS = ("adversarial", "popular", "random")

KNOWN_DATASETS = ("coco", "aokvqa", "gqa")

PARQUET_DATASET = "lmms-lab"  # its images are COCO val2014's, embedded

QUESTION_SUFFIXES = (".json", ".jsonl", ".parquet")

PARQUET_COLUMNS = ("question_id", "question", "answer", "image")  # category, image_source: optional


def _named(path: str | Path, names: tuple[str, ...]) -> str | None:
    stem = Path(path).stem.lower()
    found = [n for n in names if re.search(rf"(^|[^a-z]){n}([^a-z]|$)", stem)]
    return found[0] if len(found) == 1 else None


def split_from_name(path: str | Path) -> str:
    """`coco_pope_adversarial.json` → `adversarial`; a name with no known split gives its stem."""
    return _named(path, KNOWN_SPLITS) or Path(path).stem


def dataset_from_name(path: str | Path) -> str:
    """`gqa_pope_seem_random.json` → `gqa`; parquet files are lmms-lab's; otherwise ""."""
    if Path(path).suffix == ".parquet":
        return PARQUET_DATASET
    return _named(path, KNOWN_DATASETS) or ""


def _rows(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed JSON value) per question; line numbers 1-based, 0 for array items."""
    text = read_text(path, "question file")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: malformed JSON array: {err.msg}") from None
        # An array's items have no line of their own; report their index as item N (1-based).
        return [(-(i + 1), item) for i, item in enumerate(items)]
    rows = []
    # not splitlines(): U+2028 may sit in a string
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: malformed JSON: {err.msg}") from None
    return rows


def _where(path: Path, lineno: int) -> str:
    return f"{path}:{lineno}" if lineno > 0 else f"{path} item {-lineno}"


def _parquet_rows(path: Path, images: dict[str, bytes]) -> list[tuple[int, dict]]:
    """(-(row + 1), row as a POPE dict) per parquet row, its image bytes registered in `images` by
    name: the first copy of each distinct content is kept and shared, so the 3 × 3,000 rows of the
    lmms-lab files (each holding its own copy of one of 500 images) hold 500 images in memory."""
    table = open_parquet(path, PARQUET_COLUMNS)
    names = table.schema_arrow.names
    columns = list(PARQUET_COLUMNS) + [c for c in ("category", "image_source") if c in names]
    by_content: dict[bytes, bytes] = {}  # sha256 → the one kept copy
    rows, index = [], 0
    for batch in table.iter_batches(batch_size=64, columns=columns):
        for row in batch.to_pylist():
            index += 1
            image = row.pop("image") or {}
            data = image.get("bytes") if isinstance(image, dict) else None
            if not data:
                raise DataError(f"{path} item {index}: image has no embedded bytes")
            name = row.pop("image_source", None) or Path(image.get("path") or "").name \
                or f"sha256-{hashlib.sha256(data).hexdigest()[:16]}"
            known = images.get(name)
            if known is None:
                images[name] = data = by_content.setdefault(hashlib.sha256(data).digest(), data)
            elif known != data:
                raise DataError(f"{path} item {index}: image {name!r} differs from an earlier "
                                "image of that name")
            else:
                data = known
            rows.append((-index, {"question_id": row["question_id"], "image": name,
                                  "text": row["question"], "label": row["answer"],
                                  "category": row.get("category"), "image_data": data}))
    return rows


def _category(value, where: str) -> str | None:
    """A row's category as a split name: one of POPE's three however it is cased or padded; any
    other is refused rather than taken as a split of its own (pass --split to name the split of such
    a file)."""
    if value is None:
        return None
    name = str(value).strip().lower()
    if name not in KNOWN_SPLITS:
        raise DataError(f"{where}: category {value!r} is not one of {', '.join(KNOWN_SPLITS)} "
                        "(give --split to name this file's split)")
    return name


def find_question_files(path: str | Path) -> list[Path]:
    """A question file, or every POPE file (*.json, *.jsonl, *.parquet) directly in a folder, then
    POPE's question files in its sub-folders: those named `{dataset}_pope_*` of a known dataset
    (RUCAIBox/POPE's output/ holds COCO's in coco/ and A-OKVQA's and GQA's in seem/aokvqa/ and
    seem/gqa/; VCD's data/POPE one folder each), COCO's, then A-OKVQA's, then GQA's, as papers order
    them. Other files below the folder (images, a run's records) are not read."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix in QUESTION_SUFFIXES and p.is_file())
    below = [p for p in path.glob("*/**/*")
             if p.suffix in (".json", ".jsonl") and p.is_file() and _pope_file(p)]
    files += sorted(below, key=lambda p: (KNOWN_DATASETS.index(dataset_from_name(p)), p))
    if not files:
        suffixes = ", ".join("*" + s for s in QUESTION_SUFFIXES)
        raise DataError(f"{path}: no question files ({suffixes}) in this folder "
                        "(the lmms-lab/POPE download keeps them in Full/ or data/)")
    return files


def _pope_file(path: Path) -> bool:
    """A file named as POPE names its question files: `{dataset}_pope_...` of its three datasets."""
    return (dataset_from_name(path) in KNOWN_DATASETS
            and re.match(r"[a-z]+_pope_", path.name.lower()) is not None)


def load_questions(path: str | Path, split: str | None = None, dataset: str | None = None,
                   images: dict[str, bytes] | None = None) -> list[Question]:
    """Read one POPE question file; every problem raises DataError naming the file and line.

    The split is `split`, else the row's `category` (lmms-lab's column, or the same field of a JSON
    row: one of POPE's three splits, however cased), else the file's name; the dataset is `dataset`,
    else the file's name. `images` collects a parquet file's embedded images by name (shared across
    files, so a name cannot stand for two images)."""
    path = Path(path)
    if dataset is None:
        dataset = dataset_from_name(path)
    parquet = path.suffix == ".parquet"
    if parquet:
        if not path.is_file():
            raise DataError(f"{path}: no such question file")
        rows = _parquet_rows(path, {} if images is None else images)
    else:
        rows = _rows(path)
    questions: list[Question] = []
    seen: dict[tuple[str, str], int] = {}
    for lineno, row in rows:
        where = _where(path, lineno)
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        missing = [k for k in REQUIRED_KEYS if k not in row]
        if missing:
            raise DataError(f"{where}: missing key(s) {', '.join(missing)}")
        label = str(row["label"]).strip().lower()
        if label not in LABELS:
            raise DataError(f"{where}: label {row['label']!r} is not yes/no")
        qid = row["question_id"]
        if not isinstance(qid, (int, str)) or isinstance(qid, bool):
            raise DataError(f"{where}: question_id {qid!r} is not an int or string")
        row_split = split or _category(row.get("category"), where) or split_from_name(path)
        if (row_split, str(qid)) in seen:
            first = _where(path, seen[row_split, str(qid)])
            raise DataError(f"{where}: duplicate question_id {qid!r} (first at {first})")
        for key in ("image", "text"):  # null would become the string "None"
            if not isinstance(row[key], str) or not row[key].strip():
                raise DataError(f"{where}: {key} {row[key]!r} is not a non-empty string")
        # written to records and read by a tokenizer or a file system
        for key in ("question_id", "image", "text"):
            fault = surrogate_fault(row[key]) if isinstance(row[key], str) else None
            if fault:
                raise DataError(f"{where}: {key} {row[key]!r} {fault}")
        seen[row_split, str(qid)] = lineno
        questions.append(Question(qid, row["image"], row["text"], label, str(row_split), dataset,
                                  row["image_data"] if parquet else None))
    if not questions:
        raise DataError(f"{path}: no questions")
    return questions


def load_question_sources(paths: list[str | Path], split: str | None = None,
                          dataset: str | None = None,
                          skipped: list[tuple[Path, str]] | None = None) -> list[Question]:
    """Every question of the given files and folders (`find_question_files`), in order. A JSON file
    in a folder that is no question file at all (a provenance or config file beside them) is left
    out, and named with the reason in `skipped`; one named on its own is read, and any fault in it
    raised."""
    images: dict[str, bytes] = {}
    questions = []
    for source in paths:
        for path in find_question_files(source):
            reason = not_questions(path) if Path(source).is_dir() else None
            if reason is not None:
                if skipped is not None:
                    skipped.append((path, reason))
                continue
            questions += load_questions(path, split, dataset, images)
    return questions


def not_questions(path: Path) -> str | None:
    """Why a JSON file is no question file (its only or first value is not an object with any
    question key), or None: parquet files and any file that may be one (even one with faults, named
    when it is read)."""
    if path.suffix == ".parquet":
        return None
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        value = json.loads(text)  # an array, or a single object
    except json.JSONDecodeError:
        try:
            value = json.loads(text.split("\n", 1)[0])  # JSON lines: the first row
        except json.JSONDecodeError:
            return None
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, dict) and set(REQUIRED_KEYS) & set(value):
        return None
    return f"not a question file (its first row has none of the keys {', '.join(REQUIRED_KEYS)})"
