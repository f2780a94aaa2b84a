"""Appends batches of records to a file from a thread of its own, so that a sweep never waits on the
disk.

A batch is serialised and written whole (a batch that fails part way is cut off again); the file is
fsynced every `sync_every` batches, after `sync_seconds` without one, and at close. What a crash
loses is only records written since the last fsync, which a resume recomputes: lines reach the file
in the order they were given, a torn last line is mended on open (RecordWriter), and resume is bit
for bit as before.

The first error (a full disk, a refused write, a record that is not JSON) stops the thread writing;
it is raised by the next `put` or by `close` (an OSError naming the file).
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path

SYNC_EVERY = 16  # batches (image steps) between two fsyncs
SYNC_SECONDS = 2.0  # the longest unsynced records wait while the sweep is busy elsewhere
_CLOSE = object()


def encode(records: list[dict]) -> bytes:
    """One JSON line per record; make_record writes a non-finite value as null, allow_nan=False
    keeps a bare NaN from ever reaching the file."""
    text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records)
    return text.encode("utf-8")


class Appender:
    def __init__(self, fd: int, path: Path, sync_every: int = SYNC_EVERY,
                 sync_seconds: float = SYNC_SECONDS):
        self.fd, self.path = fd, path
        self.sync_every, self.sync_seconds = sync_every, sync_seconds
        # a disk slower than the sweep holds the sweep back
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._error: BaseException | None = None
        self._synced = os.fstat(fd).st_size  # the file's length at the last fsync that held
        self._thread = threading.Thread(target=self._run, name=f"records {path.name}", daemon=True)
        self._thread.start()

    def put(self, records: list[dict]) -> None:
        self._raise()
        self._queue.put(records)

    def close(self) -> None:
        """Every batch put so far written and fsynced, or the first error raised."""
        if self._thread.is_alive():
            self._queue.put(_CLOSE)
            self._thread.join()
        self._raise()

    def _raise(self) -> None:
        err = self._error
        if err is None:
            return
        if isinstance(err, OSError):
            raise OSError(err.errno, err.strerror, str(self.path))
        raise err

    def _run(self) -> None:
        unsynced, last_sync = 0, time.monotonic()
        while True:
            wait = (max(0.0, self.sync_seconds - (time.monotonic() - last_sync)) if unsynced
                    else None)
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = None  # nothing came for sync_seconds: sync what is written
            if self._error is None:
                try:
                    if item is not None and item is not _CLOSE:
                        self._append(encode(item))
                        unsynced += 1
                    if unsynced and (item is None or item is _CLOSE or unsynced >= self.sync_every
                                     or time.monotonic() - last_sync >= self.sync_seconds):
                        self._sync()
                        unsynced, last_sync = 0, time.monotonic()
                # kept for the caller's next put or close, never lost with the thread
                except BaseException as err:
                    # nothing more is written, so nothing waits for a sync
                    self._error, unsynced = err, 0
            if item is _CLOSE:
                return

    def _sync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError:
            # the kernel may have dropped any batch since the last fsync that held: cut them all,
            # the rerun redoes them
            self._cut(self._synced)
            raise
        self._synced = os.fstat(self.fd).st_size

    def _append(self, data: bytes) -> None:
        start = os.fstat(self.fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:
            self._cut(start)  # no torn line, no half batch: the rerun redoes it whole
            raise

    def _cut(self, size: int) -> None:
        try:
            os.ftruncate(self.fd, size)
        except OSError:
            # a file that refuses writes (made immutable, say) refuses this too: nothing was written
            pass
