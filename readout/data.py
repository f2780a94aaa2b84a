"""POPE question files.

Two layouts exist in the wild with the same keys (`question_id`, `image`, `text`, `label`): JSON lines
(RUCAIBox/POPE `output/coco/coco_pope_*.json`) and JSON arrays (their AOKVQA/GQA files). Labels are
always joined on `question_id`, never on line order: the official `evaluate.py` joins by position,
which silently mis-scores any answer file that was filtered, resumed or reordered.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

LABELS = ("yes", "no")
REQUIRED_KEYS = ("question_id", "image", "text", "label")
KNOWN_SPLITS = ("adversarial", "popular", "random")


class DataError(ValueError):
    """A malformed input file; the message names the file and, where there is one, the line."""


@dataclass(frozen=True)
class Question:
    question_id: int | str
    image: str
    text: str
    label: str
    split: str

    @property
    def key(self) -> str:
        """Join key: question ids are ints in the COCO files and strings in published records."""
        return str(self.question_id)


def split_from_name(path: str | Path) -> str:
    """`coco_pope_adversarial.json` → `adversarial`; a name with no known split gives its stem."""
    stem = Path(path).stem
    found = [s for s in KNOWN_SPLITS if re.search(rf"(^|[^a-z]){s}([^a-z]|$)", stem.lower())]
    return found[0] if len(found) == 1 else stem


def _rows(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed JSON value) per question; line numbers are 1-based, 0 for array items."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such question file") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: malformed JSON array: {err.msg}") from None
        # An array's items have no line of their own; report their index as item N (1-based).
        return [(-(i + 1), item) for i, item in enumerate(items)]
    rows = []
    for lineno, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 may sit in a string
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: malformed JSON: {err.msg}") from None
    return rows


def _where(path: Path, lineno: int) -> str:
    return f"{path}:{lineno}" if lineno > 0 else f"{path} item {-lineno}"


def load_questions(path: str | Path, split: str | None = None) -> list[Question]:
    """Read one POPE question file; every problem raises DataError naming the file and line."""
    path = Path(path)
    split = split or split_from_name(path)
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for lineno, row in _rows(path):
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
        if str(qid) in seen:
            raise DataError(f"{where}: duplicate question_id {qid!r} (first at {_where(path, seen[str(qid)])})")
        for key in ("image", "text"):  # null would become the string "None"
            if not isinstance(row[key], str) or not row[key].strip():
                raise DataError(f"{where}: {key} {row[key]!r} is not a non-empty string")
        seen[str(qid)] = lineno
        questions.append(Question(qid, row["image"], row["text"], label, split))
    if not questions:
        raise DataError(f"{path}: no questions")
    return questions
