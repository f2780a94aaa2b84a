"""Progress of a sweep for the command line: its bars (tqdm, on stderr), and under torchrun rank 0's
count of the records of the whole job (records.jsonl and every rank's part) from the folder, read
incrementally by a watcher thread."""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from .readout.records import RECORDS_FILE, rank_parts


class RecordCount:
    """Record lines in a run folder, records.jsonl and the rank parts together, read incrementally
    (a file replaced or shortened is counted again): rank 0's progress for the whole job."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        # path → (inode, bytes read, newlines in them)
        self._seen: dict[Path, tuple[int, int, int]] = {}

    def __call__(self) -> int:
        total = 0
        for path in [self.dir / RECORDS_FILE, *rank_parts(self.dir)]:
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
    """While the block runs, `update` (a progress bar's, taking increments) hears of every record
    any rank writes into out_dir, `every` seconds, up to `total`; once more at the end."""
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


class SweepProgress:
    """eval's progress of `total` questions of `benchmark` (its title) on stderr: a bar on a
    terminal, else (a log file would fill with a bar's redraws) one plain line at most every `every`
    seconds and one at the end. Called with more questions done; `decoding` hears how far a long
    continuation has come, which records no question until its batch ends."""

    def __init__(self, total: int, stream, every: float = 30.0, benchmark: str = "POPE"):
        from tqdm import tqdm

        self.total, self.stream, self.every, self.done, self.benchmark = (
            total, stream, every, 0, benchmark)
        self.bar = (tqdm(total=total, unit="q", desc=benchmark, dynamic_ncols=True, file=stream)
                    if stream.isatty() else None)
        self._last = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.set_postfix_str("", refresh=False)
            self.bar.update(n)
        elif self.done == self.total or time.monotonic() - self._last >= self.every:
            self._line(f"{self.done} of {self.total} questions recorded")

    def decoding(self, steps: int, most: int, rows: int) -> None:
        text = f"decoding {rows} questions: {steps} of at most {most} new tokens"
        if self.bar is not None:
            self.bar.set_postfix_str(text)
        elif time.monotonic() - self._last >= self.every:
            self._line(f"{self.done} of {self.total} questions recorded; {text}")

    def _line(self, text: str) -> None:
        print(f"{self.benchmark}: {text}", file=self.stream, flush=True)
        self._last = time.monotonic()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextmanager
def progress_bar(total: int, shown: bool, benchmark: str = "POPE", stream=None):
    """eval's progress of `benchmark`'s questions (SweepProgress on stderr, only where `shown`: rank
    0); entered, the callable told of more done, with its `decoding`."""
    import sys

    if not shown:
        yield lambda n: None
        return
    progress = SweepProgress(total, sys.stderr if stream is None else stream, benchmark=benchmark)
    try:
        yield progress
    finally:
        progress.close()


@contextmanager
def labelled_bars(stream=None):
    """progress(label, n, total): one bar per label, closed at the end; where `stream` (stderr) is
    no terminal, one plain line per label once it is done instead (a log file would fill with the
    bars' redraws), and transformers' own loading bars are off."""
    import sys

    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    plain = not stream.isatty()
    if plain:
        from transformers.utils import logging

        logging.disable_progress_bar()
    bars: dict[str, tqdm] = {}
    done: dict[str, int] = {}

    def progress(label: str, n: int, total: int) -> None:
        if plain:
            done[label] = done.get(label, 0) + n
            if done[label] == total:
                print(f"{label}: {total} done", file=stream, flush=True)
            return
        if label not in bars:
            bars[label] = tqdm(total=total, desc=label, unit="q", dynamic_ncols=True, leave=False,
                               file=stream)
        bars[label].update(n)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()
