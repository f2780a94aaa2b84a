"""The phase clock: it waits for the device only where the timings ask for it (bench), never in
a plain run."""
import time

import torch

from pope_fast.engine.utils.stats import Clock, Timings


def _synced(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    return calls


def test_a_clock_synchronises_only_where_timing_is_asked_for(monkeypatch):
    calls = _synced(monkeypatch)
    cuda = torch.device("cuda", 0)  # a device object only: the stand-in takes its synchronize
    plain = Timings()
    with Clock(plain, "decode", cuda):
        time.sleep(0.002)
    assert calls == [] and plain.decode > 0
    timed = Timings(synchronize=True)
    for field in ("image_encode", "question_prefill"):
        with Clock(timed, field, cuda):
            pass
    assert calls == [cuda] * 4  # at each phase's start and end
    with Clock(timed, "decode", torch.device("cpu")):
        pass
    assert len(calls) == 4


def test_timings_json_holds_the_phases_only():
    assert Timings(decode=1.23456, synchronize=True).to_json() == {
        "image_encode": 0.0, "prefix_prefill": 0.0, "question_prefill": 0.0, "decode": 1.2346}
