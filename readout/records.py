"""Per-question records: writing them as a run goes, resuming, and reading them back for scoring.

Our records are JSON lines, one per (split, question), with a `meta.json` beside them that holds the
token sets, tokenizer and library versions. The published ugaa-research record files are read too
(two schemas, auto-detected); their stored predictions become the matching readouts.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .data import LABELS, DataError, Question, split_from_name
from .protocols import DECISIONS, READOUTS, TokenSets

RECORDS_FILE, META_FILE, LOCK_FILE = "records.jsonl", "meta.json", ".lock"
FORMAT = "pope-fast/records-v1"

# ugaa-research stored-prediction keys → our readout names, per schema.
UGAA_PAIRWISE = {"pred_2tok": "legacy_2tok", "pred_8tok": "legacy_8tok"}
UGAA_CROSS_MODEL = {"pred_legacy_2tok": "legacy_2tok", "pred_legacy_8tok": "legacy_8tok",
                    "pred_dynamic_single": "dynamic_single", "pred_string_parse": "string_parse"}

# run_multi_model_audit.py adapters whose decoded_response is generate's whole output, prompt included:
# their pred_string_parse is our string_parse_with_prompt.
UGAA_WHOLE_SEQUENCE = ("instructblip", "mplug_owl2")


def make_record(question: Question, template: str, *, first_token_id: int | None = None,
                candidate_logits: dict[int, float] | None = None, decoded: str | None = None,
                texts: dict[str, str] | None = None, decoded_sequence: str | None = None,
                predictions: dict[str, str] | None = None, error: str | None = None,
                image_sha256: str | None = None, probe: dict | None = None) -> dict:
    """One question's record. Its question text and the sha256 of its image's bytes are kept so that a
    resumed run can prove a recorded answer is still the answer to this question. `decoded` is the
    whole greedy continuation; `texts` the text readouts whose own prefix of it differs (read
    `decoded` for the others); `decoded_sequence` the prompt and the continuation decoded as one
    sequence (for string_parse_with_prompt); `probe` extra fields (the image-attention probe's one
    float per decoder layer)."""
    record = {"question_id": question.question_id, "split": question.split, "image": question.image,
              "label": question.label, "text": question.text, "template": template}
    if question.dataset:  # absent in records written before datasets were named: read back as ""
        record["dataset"] = question.dataset
    if image_sha256 is not None:
        record["image_sha256"] = image_sha256
    if error is not None:
        record["error"] = error
        return record
    record["first_token_id"] = first_token_id
    # -inf (a token a method's plausibility cut removed) is written as null: JSON has no infinities
    record["candidate_logits"] = {str(i): None if v == float("-inf") else float(v)
                                  for i, v in (candidate_logits or {}).items()}
    if decoded is not None:
        record["decoded"] = decoded
        differing = {n: t for n, t in (texts or {}).items() if t != decoded}
        if differing:
            record["texts"] = differing
    if decoded_sequence is not None:
        record["decoded_sequence"] = decoded_sequence
    record["predictions"] = dict(predictions or {})
    record.update(probe or {})  # e.g. image_attention: one float per decoder layer
    return record


def record_key(split: str, question_id, dataset: str = "") -> tuple[str, str, str]:
    """One question of one run: POPE's datasets reuse the question ids 1..3,000 in every split."""
    return dataset, split, str(question_id)


def checked_record(rec, where: str) -> dict:
    """A parsed record line, or DataError naming `where`: a JSON object whose key fields have their types."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in ("question_id", "split", "label") if k not in rec]
    if missing:
        raise DataError(f"{where}: missing key(s) {', '.join(missing)}")
    qid, split = rec["question_id"], rec["split"]
    if not isinstance(qid, (int, str)) or isinstance(qid, bool):
        raise DataError(f"{where}: question_id {qid!r} is not an int or string")
    if not isinstance(split, str) or not split:
        raise DataError(f"{where}: split {split!r} is not a non-empty string")
    if rec["label"] not in LABELS:
        raise DataError(f"{where}: label {rec['label']!r} is not yes/no")
    expected = {"candidate_logits": dict, "predictions": dict, "decoded": str, "error": str, "text": str,
                "image": str, "image_sha256": str, "dataset": str, "texts": dict, "decoded_sequence": str,
                "image_attention": list, "image_attention_heads": list}
    for key, kind in expected.items():
        if rec.get(key) is not None and not isinstance(rec[key], kind):
            raise DataError(f"{where}: {key} {rec[key]!r} is not a {kind.__name__}")
    first = rec.get("first_token_id")
    if first is not None and (not isinstance(first, int) or isinstance(first, bool)):
        raise DataError(f"{where}: first_token_id {first!r} is not an int")
    return rec


def json_lines(text: str):
    """(line number, line) of a JSON-lines text, split on "\n" only: str.splitlines() also breaks
    at U+2028, U+2029 and U+0085, which json.dumps(ensure_ascii=False) writes raw inside strings
    (a decoded continuation can hold one)."""
    for lineno, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield lineno, line


class RecordWriter:
    """Appends records batch by batch; a run that stops resumes from what is on disk.

    Each batch is one append, fsynced; a batch that fails part way (a full disk) is cut off again
    before the error is raised, and after a crash at most the last line is torn: `open` drops a torn
    last line (it was never complete, so nothing recorded is lost) and returns the questions already
    done: (split, question_id) → their record. Error records do not count as done: a rerun retries
    them, and the new record supersedes the error. Two complete records of one question (two
    writers of old) are refused, naming `repair_records`.
    """

    def __init__(self, out_dir: str | Path, name: str = RECORDS_FILE, also: tuple[str, ...] = ()):
        self.path = Path(out_dir) / name
        # files of the same run read as recorded but never written (a torchrun rank writes its own part
        # and reads the merged records.jsonl)
        self.also = [Path(out_dir) / n for n in also]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: dict[tuple[str, str, str], dict] = {}
        self.recorded: set[tuple[str, str, str]] = set()  # every record's key, error records' too
        self._fd: int | None = None

    def open(self) -> dict[tuple[str, str, str], dict]:
        try:
            for path in self.also:
                if path.exists():
                    self._read(path, path.read_text(encoding="utf-8"))
            if self.path.exists():
                self._mend_last_line()
                self._read(self.path, self.path.read_text(encoding="utf-8"))
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(self.path)) from None
        except UnicodeDecodeError as err:
            raise DataError(f"{self.path}: not UTF-8 text ({err})") from None
        return dict(self.done)

    def _read(self, path: Path, text: str) -> None:
        for lineno, line in json_lines(text):
            where = f"{path}:{lineno}"
            try:
                rec = checked_record(json.loads(line), where)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not a pope-fast record ({err.msg}); `pope-fast repair "
                                f"{path.parent}` drops such lines") from None
            key = record_key(rec["split"], rec["question_id"], rec.get("dataset", ""))
            self.recorded.add(key)
            if "error" not in rec:
                if key in self.done:
                    raise DataError(duplicate_message(where, key, path.parent))
                self.done[key] = rec

    def _mend_last_line(self) -> None:
        """Complete a last line that lacks its newline, or drop it when it is torn JSON."""
        raw = self.path.read_bytes()
        if not raw or raw.endswith(b"\n"):
            return
        tail = raw[raw.rfind(b"\n") + 1:]
        try:
            json.loads(tail)
        except (json.JSONDecodeError, UnicodeDecodeError):
            with open(self.path, "r+b") as f:
                f.truncate(len(raw) - len(tail))
            return
        with open(self.path, "ab") as f:
            f.write(b"\n")

    def write(self, records: list[dict]) -> None:
        if self._fd is None:
            raise RuntimeError("RecordWriter.open() first")
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as err:
            os.ftruncate(self._fd, start)  # no torn line, no half batch: the rerun redoes it whole
            raise OSError(err.errno, err.strerror, str(self.path)) from None
        keys = [record_key(r["split"], r["question_id"], r.get("dataset", "")) for r in records]
        self.recorded.update(keys)
        self.done.update((k, r) for k, r in zip(keys, records) if "error" not in r)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()


def duplicate_message(where: str, key: tuple[str, str, str], run_dir: Path) -> str:
    return (f"{where}: duplicate record for question {key[2]} of split {key[1]} (two runs wrote to this "
            f"folder); `pope-fast repair {run_dir}` keeps the last complete record of each question")


class FolderBusy(ValueError):
    """Another process holds a run folder's lock; the message names it."""


class RunLock:
    """An exclusive lock on a run folder (flock on its .lock file) for as long as one process writes
    there: a second run into the same folder is refused at once, naming the holder. The kernel
    drops the lock when the holder exits, however it exits, so a killed run never leaves it stale."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        path = self.dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "a process that is starting"
            os.close(fd)
            raise FolderBusy(f"{self.dir}: another pope-fast run is writing here ({holder}); "
                             "wait for it to finish or choose another --out") from None
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as err:
            self.__exit__()
            raise OSError(err.errno, err.strerror, str(path)) from None
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


def repair_records(run_dir: str | Path) -> tuple[int, int]:
    """Rewrite a run folder's records keeping, per question, the last complete record (else its last
    error record), in first-seen order, and dropping lines that are not records; the caller holds the
    folder's RunLock. Returns (records kept, lines dropped)."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.is_file():
        raise DataError(f"{path}: no such records file")
    kept: dict[tuple[str, str, str], str] = {}
    dropped = 0
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
            rec = checked_record(json.loads(line), f"{path}:{lineno}")
        except (UnicodeDecodeError, json.JSONDecodeError, DataError):
            dropped += 1
            continue
        key = record_key(rec["split"], rec["question_id"], rec.get("dataset", ""))
        if key in kept:
            dropped += 1
            if "error" in rec and "error" not in json.loads(kept[key]):
                continue  # a complete record is never replaced by an error
        kept[key] = line
    atomic_write(path, "".join(line + "\n" for line in kept.values()))
    return len(kept), dropped


def order_records(run_dir: str | Path, order: dict[tuple[str, str, str], int]) -> bool:
    """Put records.jsonl's lines in `order` (question key → position), rewriting the file only where it
    is out of order; the lines of one question keep their order (an error record, then its retry), and
    lines of questions `order` lacks (another split recorded here earlier) come first as they were.
    Returns whether the file was rewritten."""
    path = Path(run_dir) / RECORDS_FILE
    lines = [line for _, line in json_lines(path.read_text(encoding="utf-8"))]
    positions = []
    for line in lines:
        rec = json.loads(line)
        positions.append(order.get(record_key(rec["split"], rec["question_id"], rec.get("dataset", "")), -1))
    if all(a <= b for a, b in zip(positions, positions[1:])):
        return False
    ranked = sorted(range(len(lines)), key=positions.__getitem__)  # stable: a question's lines keep their order
    atomic_write(path, "".join(lines[i] + "\n" for i in ranked))
    return True


def atomic_write(path: Path, text: str) -> None:
    """Write a whole file or leave the old one: a private temporary file, fsynced, then renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk, say: name the file, not the temporary one
        os.unlink(tmp)
        raise OSError(err.errno, err.strerror, str(path)) from None
    except BaseException:
        os.unlink(tmp)
        raise


def read_meta(path: Path) -> dict:
    """A run's meta.json ({} when absent), or DataError naming it."""
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err}); a torn meta.json: move the run folder away "
                        "or restore the file") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    for key in ("model", "settings", "tokenizer", "token_sets"):
        if not isinstance(meta.get(key, {}), dict):
            raise DataError(f"{path}: {key} is not a JSON object")
    try:
        for sets in meta.get("token_sets", {}).values():
            TokenSets.from_json(sets)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise DataError(f"{path}: token_sets must map readouts to yes_ids and no_ids lists of ints") from None
    return meta


def leaf_differences(a, b, first: str, second: str, width: int = 40, name: str = "") -> list[str]:
    """'name: A-value {first}, B-value {second}' for every leaf where two nested dicts differ (their
    dotted key paths, sorted), each value's repr cut to `width` characters."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in leaf_differences(a.get(k), b.get(k), first, second, width, f"{name}.{k}" if name else str(k))]
    if a == b:
        return []
    short = [text if len(text := repr(v)) <= width else text[:width - 3] + "..." for v in (a, b)]
    return [f"{name}: {short[0]} {first}, {short[1]} {second}"]


def write_meta(out_dir: str | Path, meta: dict) -> Path:
    path = Path(out_dir) / META_FILE
    atomic_write(path, json.dumps({"format": FORMAT, **meta}, indent=2, ensure_ascii=False) + "\n")
    return path


@dataclass
class Entry:
    """One scored question, normalised from any record format."""

    key: str
    split: str
    label: str
    first_token_id: int | None = None
    dataset: str = ""
    candidate_logits: dict[int, float] | None = None
    decoded: str | None = None
    stored: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    texts: dict[str, str] = field(default_factory=dict)  # text readouts whose prefix differs from decoded
    decoded_sequence: str | None = None
    image_attention: list[float] | None = None  # the probe's one value per decoder layer, where it ran
    text: str | None = None  # the question, where the record keeps it (ours do; published files do not)
    image: str | None = None

    def text_for(self, name: str) -> str | None:
        return self.texts.get(name, self.decoded)


@dataclass
class RecordSet:
    source: str
    entries: list[Entry]
    token_sets: dict[str, TokenSets]
    meta: dict
    prefer_stored: bool  # imported records: their stored predictions are the readouts they name


def _check_decision(value, where: str, name: str) -> str:
    if value not in DECISIONS:
        raise DataError(f"{where}: prediction {name}={value!r} is not yes/no/unknown")
    return value


def _read_ours(path: Path, text: str) -> RecordSet:
    meta = read_meta(path.parent / META_FILE)
    token_sets = {n: TokenSets.from_json(s) for n, s in meta.get("token_sets", {}).items()}
    entries: list[Entry] = []
    position: dict[tuple[str, str, str], int] = {}  # key → index in entries
    for lineno, line in json_lines(text):
        where = f"{path}:{lineno}"
        try:
            rec = checked_record(json.loads(line), where)
        except json.JSONDecodeError as err:
            if not text.endswith("\n") and lineno == text.count("\n") + 1:
                break  # a last line still being written (or torn by a crash): not a record yet
            raise DataError(f"{where}: malformed JSON: {err.msg}") from None
        key = record_key(rec["split"], rec["question_id"], rec.get("dataset", ""))
        if key in position and entries[position[key]].error is None:
            raise DataError(duplicate_message(where, key, path.parent))
        entry = Entry(
            key=str(rec["question_id"]), split=rec["split"], label=rec["label"],
            first_token_id=rec.get("first_token_id"), dataset=rec.get("dataset", ""),
            candidate_logits=_logits(rec.get("candidate_logits"), where),
            decoded=rec.get("decoded"), texts=dict(rec.get("texts") or {}),
            decoded_sequence=rec.get("decoded_sequence"), image_attention=rec.get("image_attention"),
            text=rec.get("text"), image=rec.get("image"),
            stored={n: _check_decision(v, where, n) for n, v in rec.get("predictions", {}).items()
                    if n in READOUTS},
            error=rec.get("error"))
        if key in position:  # a retried question: its new record supersedes the error record
            entries[position[key]] = entry
        else:
            position[key] = len(entries)
            entries.append(entry)
    return RecordSet(str(path), entries, token_sets, meta, prefer_stored=False)


def _logits(logits: dict | None, where: str) -> dict[int, float] | None:
    if logits is None:
        return None
    try:
        return {int(i): float("-inf") if v is None else float(v) for i, v in logits.items()}
    except (TypeError, ValueError):
        raise DataError(f"{where}: candidate_logits must map token ids to numbers") from None


def _read_ugaa(path: Path, obj: dict) -> RecordSet:
    results = obj["results"]
    if not results:
        raise DataError(f"{path}: a ugaa-research record file with no results")
    summary = obj.get("summary") if isinstance(obj.get("summary"), dict) else {}
    split = summary.get("split") or split_from_name(path)
    for i, rec in enumerate(results):
        if not isinstance(rec, dict):
            raise DataError(f"{path} results[{i}]: expected a JSON object, got {type(rec).__name__}")
    keys = set().union(*(r.keys() for r in results))
    mapping = UGAA_CROSS_MODEL if "pred_legacy_2tok" in keys else UGAA_PAIRWISE
    adapter = str(summary.get("model") or path.name.split("_pope_")[0])
    whole = mapping is UGAA_CROSS_MODEL and adapter in UGAA_WHOLE_SEQUENCE
    if whole:
        mapping = {**mapping, "pred_string_parse": "string_parse_with_prompt"}
    entries, seen = [], set()
    for i, rec in enumerate(results, start=1):
        where = f"{path} results[{i - 1}]"
        for k in ("question_id", "label"):
            if k not in rec:
                raise DataError(f"{where}: missing key {k}")
        if str(rec["question_id"]) in seen:
            raise DataError(f"{where}: duplicate question_id {rec['question_id']!r}")
        seen.add(str(rec["question_id"]))
        if "error" in rec:  # a question whose generate failed: the paper's code drops it from every count
            entries.append(Entry(key=str(rec["question_id"]), split=split, label=str(rec["label"]).lower(),
                                 error=str(rec["error"])))
            continue
        entries.append(Entry(
            key=str(rec["question_id"]), split=split, label=str(rec["label"]).lower(),
            first_token_id=rec.get("top_token_id"),
            decoded=None if whole else rec.get("decoded_response"),
            decoded_sequence=rec.get("decoded_response") if whole else None,
            stored={ours: _check_decision(str(rec[theirs]).lower(), where, theirs)
                    for theirs, ours in mapping.items() if theirs in rec}))
    meta = {"imported_from": "ugaa-research", "schema": "pairwise" if mapping is UGAA_PAIRWISE
            else "cross_model", "whole_sequence": whole, "summary": summary}
    return RecordSet(str(path), entries, {}, meta, prefer_stored=True)


def read_records(path: str | Path) -> RecordSet:
    """Our records (a run folder or its records.jsonl) or a published ugaa-research file."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORDS_FILE
    if not path.is_file():
        raise DataError(f"{path}: no such records file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None  # JSON lines: several objects
        if isinstance(obj, dict) and isinstance(obj.get("results"), list):
            return _read_ugaa(path, obj)
        return _read_ours(path, text)
    raise DataError(f"{path}: neither pope-fast JSON-lines records nor a ugaa-research record file")
