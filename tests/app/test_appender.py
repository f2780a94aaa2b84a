"""The records writer's thread without a model: batches fsynced together and always at close, and a
failed write or fsync raised by the next write or by close, naming the file, with no half batch left
behind."""
import errno
import json
import os
import time

import pytest

from pope_fast import appender
from pope_fast.appender import Appender
from pope_fast.readout import Question
from pope_fast.readout.records import make_record
from pope_fast.store import RecordWriter


def _batch(step, n=3):
    return [make_record(Question(step * n + i, f"img{step}.png", "Is there a dog?", "yes",
                                 "random"),
                        "t", first_token_id=1, candidate_logits={1: 0.5, 2: -1.25 * i})
            for i in range(n)]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def fsyncs(monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


def test_batches_are_fsynced_together_and_every_one_at_close(tmp_path, fsyncs):
    with RecordWriter(tmp_path) as w:
        for step in range(2 * appender.SYNC_EVERY + 3):
            w.write(_batch(step))
    assert len(fsyncs) == 3  # after 16 and 32 steps, and the last 3 at close; one per step before
    assert ([r["question_id"] for r in _lines(tmp_path / "records.jsonl")]
            == list(range(3 * (2 * 16 + 3))))


def test_records_wait_at_most_sync_seconds_for_their_fsync(tmp_path, fsyncs):
    path = tmp_path / "records.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    writer = Appender(fd, path, sync_every=1000, sync_seconds=0.05)
    writer.put(_batch(0))
    deadline = time.monotonic() + 10
    while not fsyncs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fsyncs == [fd] and len(_lines(path)) == 3  # synced by the clock, the sweep still running
    writer.close()
    os.close(fd)
    assert fsyncs == [fd]  # nothing new to sync at close


def test_a_full_disk_is_raised_by_the_next_write_naming_the_file_and_leaves_whole_batches(
        tmp_path, monkeypatch):

    real, writes = os.write, []

    def full(fd, data):  # the third batch gets half its bytes in, then the disk is full
        writes.append(len(data))
        if len(writes) == 3:
            real(fd, bytes(data[:len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    w = RecordWriter(tmp_path)
    w.open()
    with pytest.raises(OSError) as stopped:
        for step in range(200):  # the thread's error reaches one of the writes after the third
            w.write(_batch(step))
            time.sleep(0.01)
    assert (stopped.value.errno, stopped.value.filename) == (errno.ENOSPC,
                                                             str(tmp_path / "records.jsonl"))
    # raised after the third batch; nothing written after it
    assert 2 < step < 199 and len(writes) == 3
    with pytest.raises(OSError) as again:
        w.close()
    assert (again.value.errno, again.value.filename) == (errno.ENOSPC,
                                                         str(tmp_path / "records.jsonl"))
    # two whole batches
    assert [r["question_id"] for r in _lines(tmp_path / "records.jsonl")] == list(range(6))
    assert set(RecordWriter(tmp_path).open()) == {("", "random", str(i)) for i in range(6)}


def test_a_failed_fsync_cuts_every_batch_since_the_last_that_held(tmp_path, monkeypatch):
    real, calls = os.fsync, []

    def failing(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    path = tmp_path / "records.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    writer = Appender(fd, path, sync_every=2, sync_seconds=60)
    for step in range(5):
        writer.put(_batch(step))
    with pytest.raises(OSError) as stopped:
        writer.close()
    os.close(fd)
    assert (stopped.value.errno, stopped.value.filename) == (errno.EIO, str(path))
    assert len(calls) == 2  # the fifth batch is never written
    assert [r["question_id"] for r in _lines(path)] == list(range(6))  # steps 0-1, fsynced; 2-3 cut
