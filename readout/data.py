"""What every benchmark's data reader shares: the question a model is asked (`Question`), the yes/no
labels, the error a malformed input file raises (`DataError`, naming the file and line), reading a
text file with those errors, a file's JSON object (the engine's loader and the hub read theirs here
too, in their own errors), and opening a parquet file (pyarrow, imported only when one is read).
Each benchmark's own files are read in its room (readout/benchmarks/<name>/)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


LABELS = ("yes", "no")


class DataError(ValueError):
    """A malformed input file; the message names the file and, where there is one, the line."""


@dataclass(frozen=True)
class Question:
    question_id: int | str
    image: str
    text: str
    label: str
    split: str
    dataset: str = ""  # coco, aokvqa, gqa, lmms-lab; "" where the source does not say
    image_data: bytes | None = field(default=None, compare=False, repr=False)  # embedded (parquet)

    @property
    def key(self) -> str:
        """Join key: question ids are ints in the COCO files and strings in published records."""
        return str(self.question_id)


def surrogate_fault(text: str) -> str | None:
    """Why `text` is no Unicode text (a lone surrogate, which JSON's \\ud800 escape gives and no
    tokenizer or file name takes), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"holds a lone surrogate ({text[err.start]!r} at character {err.start + 1}), "
                "which is no Unicode text (a \\u escape of half a character pair?)")
    return None


def read_text(path: Path, what: str) -> str:
    """A UTF-8 file's text; a DataError naming it where missing ("no such <what>") or not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such {what}") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None


def read_json_object(path: Path, error: type[Exception] = DataError) -> dict:
    """The JSON object a file holds; `error` (the caller's kind: DataError, CheckpointError,
    HubError) naming the file, and the line where its JSON is malformed, where it is not UTF-8 text
    or holds anything but an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise error(f"{path}:{err.lineno}: malformed JSON: {err.msg}") from None
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text ({err.reason})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def open_parquet(path: Path, columns: tuple[str, ...]):
    """A parquet file (pyarrow's ParquetFile) holding `columns`, or a DataError saying why not."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f'{path}: reading parquet needs pyarrow: '
                        'pip install -e ".[parquet]"') from None
    try:
        table = pq.ParquetFile(path)
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable parquet file ({err})") from None
    missing = [c for c in columns if c not in table.schema_arrow.names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}")
    return table
