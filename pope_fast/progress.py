"""Progress of a sweep for the command line: under torchrun, rank 0 counts the records of the whole job
(records.jsonl and every rank's part) from the folder, read incrementally by a watcher thread."""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from .readout.records import RECORDS_FILE


class RecordCount:
    """Record lines in a run folder, records.jsonl and the rank parts together, read incrementally (a
    file replaced or shortened is counted again): rank 0's progress for the whole job."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self._seen: dict[Path, tuple[int, int, int]] = {}  # path → (inode, bytes read, newlines in them)

    def __call__(self) -> int:
        total = 0
        for path in [self.dir / RECORDS_FILE, *self.dir.glob("records.rank*.jsonl")]:
            try:
                with open(path, "rb") as f:
                    inode, size = os.fstat(f.fileno()).st_ino, os.fstat(f.fileno()).st_size
                    seen_inode, offset, lines = self._seen.get(path, (inode, 0, 0))
                    if seen_inode != inode or size < offset:
                        offset, lines = 0, 0
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:  # a part folded and removed meanwhile
                continue
            self._seen[path] = (inode, offset + len(data), lines + data.count(b"\n"))
            total += lines + data.count(b"\n")
        return total


@contextmanager
def watched(out_dir: Path, update: Callable[[int], None], total: int, every: float = 0.5):
    """While the block runs, `update` (a progress bar's, taking increments) hears of every record any rank
    writes into out_dir, `every` seconds, up to `total`; once more at the end."""
    count, stop = RecordCount(out_dir), threading.Event()
    shown = 0

    def catch_up():
        nonlocal shown
        now = min(count(), total)
        if now > shown:
            update(now - shown)
            shown = now

    def watch():
        while not stop.wait(every):
            catch_up()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    catch_up()
