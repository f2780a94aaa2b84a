"""The run folder: where a run's records and meta go as it runs. One writer appends whole batches
(from a thread of its own) and mends what a crash leaves; one lock keeps a second run out; repair
keeps one record per question; records are put in their canonical order; torchrun ranks write parts
that are folded in; every rewrite (meta.json, summaries, a repaired or reordered records file) is
atomic."""
from __future__ import annotations

import fcntl
import functools
import json
import os
import socket
import tempfile
from pathlib import Path

from .appender import Appender
from .readout.data import DataError
from .readout.records import (META_FILE, PART, RECORDS_FILE, checked_record, duplicate_message,
                              json_lines, rank_parts, record_key, strict_json)

LOCK_FILE = ".lock"
FORMAT = "pope-fast/records-v1"


class RecordWriter:
    """Appends records batch by batch; a run that stops resumes from what is on disk.

    Each batch is one append, made by a thread of its own and fsynced with the batches around it
    (appender.Appender: the sweep goes on meanwhile; a write's error is raised by the next write or
    by close, naming the file); a batch that fails part way (a full disk) is cut off again, and
    after a crash at most the last line is torn: `open` drops a torn last line (it was never
    complete, so nothing recorded is lost) and returns the questions already done: (split,
    question_id) → their record. Records the crash kept from the disk are not done either, and are
    recomputed. Error records do not count as done: a rerun retries them, and the new record
    supersedes the error. Two complete records of one question (two writers of old) are refused,
    naming `repair_records`.
    """

    def __init__(self, out_dir: str | Path, name: str = RECORDS_FILE, also: tuple[str, ...] = ()):
        self.path = Path(out_dir) / name
        # files of the same run read as recorded but never written (a torchrun rank writes its own
        # part and reads the merged records.jsonl)
        self.also = [Path(out_dir) / n for n in also]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: dict[tuple[str, str, str], dict] = {}
        self.recorded: set[tuple[str, str, str]] = set()  # every record's key, error records' too
        self.errors: dict[tuple[str, str, str], str] = {}  # the last error recorded per key
        self._fd: int | None = None
        self._appender: Appender | None = None

    def open(self) -> dict[tuple[str, str, str], dict]:
        try:
            for path in self.also:
                if path.exists():
                    self._read(path, path.read_text(encoding="utf-8"))
            if self.path.exists():
                self._mend_last_line()
                self._read(self.path, self.path.read_text(encoding="utf-8"))
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._appender = Appender(self._fd, self.path)
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
            if "error" in rec:
                self.errors[key] = rec["error"]
            else:
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
        """Hands the records to the writing thread (an earlier batch's error is raised here)."""
        if self._appender is None:
            raise RuntimeError("RecordWriter.open() first")
        self._appender.put(records)
        keys = [record_key(r["split"], r["question_id"], r.get("dataset", "")) for r in records]
        self.recorded.update(keys)
        self.done.update((k, r) for k, r in zip(keys, records) if "error" not in r)
        self.errors.update((k, r["error"]) for k, r in zip(keys, records) if "error" in r)

    def close(self) -> None:
        """Every record written and fsynced, or the writing thread's first error raised."""
        appender, fd = self._appender, self._fd
        self._appender = self._fd = None
        try:
            if appender is not None:
                appender.close()
        finally:
            if fd is not None:
                os.close(fd)

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()


class FolderBusy(ValueError):
    """Another process holds a run folder's lock; the message names it."""


class RunLock:
    """An exclusive lock on a run folder (flock on its .lock file) for as long as one process writes
    there: a second run into the same folder is refused at once, naming the holder. The kernel drops
    the lock when the holder exits, however it exits, so a killed run never leaves it stale."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        path = self.dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
                      or "a process that is starting")
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


def remove_unused_folder(folder: Path) -> None:
    """Remove a run folder that holds nothing but, at most, a lock file no process holds (a run
    refused after it took the lock, before it wrote a record); any other content, or a held lock,
    leaves it as it is."""
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else None
    if names is None or set(names) - {LOCK_FILE}:
        return
    if names:
        try:
            with RunLock(folder):  # nobody else's lock: the file is this run's leftover
                (folder / LOCK_FILE).unlink()
        except FolderBusy:
            return
    folder.rmdir()


def repair_records(run_dir: str | Path) -> tuple[int, int]:
    """Rewrite a run folder's records keeping, per question, the last complete record (else its last
    error record), in first-seen order, and dropping lines that are not records; a stopped torchrun
    job's rank parts are folded in (and removed). The caller holds the folder's RunLock. Returns
    (records kept, lines dropped)."""
    path = Path(run_dir) / RECORDS_FILE
    parts = _ranked_parts(Path(run_dir))
    if not path.is_file() and not parts:
        raise DataError(f"{path}: no such records file")
    kept: dict[tuple[str, str, str], str] = {}
    dropped = 0
    for source in ([path] if path.is_file() else []) + parts:
        for lineno, raw in enumerate(source.read_bytes().split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
                rec = checked_record(json.loads(line), f"{source}:{lineno}")
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
    for part in parts:
        part.unlink()
    return len(kept), dropped


def order_records(run_dir: str | Path, order: dict[tuple[str, str, str], int]) -> bool:
    """records.jsonl as a run with nothing to retry writes it: one line per question, in `order`
    (question key → position). A question answered after an error record (an image restored, say)
    keeps only its answer; a question still failing keeps its last error record; lines of questions
    `order` lacks (another split recorded here earlier) come first as they were. The file is
    rewritten only where that changes it; returns whether it was."""
    path = Path(run_dir) / RECORDS_FILE
    lines = [line for _, line in json_lines(path.read_text(encoding="utf-8"))]
    keys = [record_key(rec["split"], rec["question_id"], rec.get("dataset", ""))
            for rec in (json.loads(line) for line in lines)]
    # a key's last line: its answer (written once), else its last error
    last = {key: i for i, key in enumerate(keys)}
    kept = [i for i, key in enumerate(keys) if last[key] == i]
    # stable: as they were where order is silent
    ranked = sorted(kept, key=lambda i: order.get(keys[i], -1))
    if ranked == list(range(len(lines))):
        return False
    atomic_write(path, "".join(lines[i] + "\n" for i in ranked))
    return True


@functools.cache
def _umask() -> int:
    """The process's umask (read once: os.umask can only read it by setting it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    """Write a whole file or leave the old one: a private temporary file, fsynced, then renamed over
    it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            # mkstemp makes the file 0600; the file it replaces is shared as any file here is
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk, say: name the file, not the temporary one
        os.unlink(tmp)
        raise OSError(err.errno, err.strerror, str(path)) from None
    except BaseException:
        os.unlink(tmp)
        raise


def write_meta(out_dir: str | Path, meta: dict) -> Path:
    path = Path(out_dir) / META_FILE
    atomic_write(path, strict_json({"format": FORMAT, **meta}, indent=2, ensure_ascii=False) + "\n")
    return path


def _ranked_parts(folder: Path) -> list[Path]:
    """The rank parts in rank order (a fold appends them in it)."""
    ranked = [p for p in rank_parts(folder) if PART.fullmatch(p.name)]
    return sorted(ranked, key=lambda p: int(PART.fullmatch(p.name).group(1)))


def fold_parts(out_dir: str | Path) -> int:
    """Append every complete record of the rank parts in out_dir to its records.jsonl, then remove
    the parts; a line already there (a fold that stopped before removing its parts) is not added
    twice, and a torn last line of a part (a rank killed mid-write) is dropped. Returns the records
    added."""
    out_dir = Path(out_dir)
    parts = _ranked_parts(out_dir)
    if not parts:
        return 0
    added = 0
    # mends a torn last line of records.jsonl, refuses duplicates
    with RecordWriter(out_dir) as writer:
        have = set(line for _, line in json_lines(writer.path.read_text(encoding="utf-8")))
        for part in parts:
            new = [rec for line, rec in _part_records(part) if line not in have]
            writer.write(new)
            have.update(json.dumps(r, ensure_ascii=False, allow_nan=False) for r in new)
            added += len(new)
    for part in parts:
        part.unlink()
    return added


def _part_records(path: Path) -> list[tuple[str, dict]]:
    """(line, record) of each complete line of a part."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
    out = []
    lines = list(json_lines(text))
    for i, (lineno, line) in enumerate(lines):
        try:
            out.append((line, checked_record(json.loads(line), f"{path}:{lineno}")))
        except json.JSONDecodeError as err:
            if i == len(lines) - 1 and not text.endswith("\n"):
                break  # torn by a kill mid-write: never a whole record
            raise DataError(f"{path}:{lineno}: not a pope-fast record ({err.msg})") from None
    return out
