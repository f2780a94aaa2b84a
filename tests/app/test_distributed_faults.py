"""Scale-out faults under torchrun: a rank that fails or is killed stops the job, and any number of
ranks (or one process) resumes it to a single process's bytes (the pieces and the plain jobs:
test_distributed.py)."""
import json
import signal
import sys
from pathlib import Path

import pytest
from torchrunjobs import CLONE, launch, make_job, run, run_here, same_run

import pope_fast
from pope_fast.readout.records import part_name
from pope_fast.store import RunLock


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_job(tmp_path_factory)


@pytest.mark.slow
def test_a_rank_that_fails_stops_the_job_and_any_number_of_ranks_resumes_it(job):
    """More ranks than stopped resume it here; one process resumes the killed job of the next test
    (the parts two ranks leave are the same either way), a launch fewer than resuming a copy of this
    one too."""
    out = job.root / "stopped"
    result = run(job, 2, out, fault="1")
    assert result.returncode != 0
    assert "Error: rank 1 of 2: RuntimeError: injected: stopped after writing" in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: rank 0")]
    # not a timeout
    assert all("rank(s) 1 stopped before the end of the sweep" in line for line in lines), lines
    parts = {p.name: [json.loads(line) for line in p.read_text().splitlines()]
             for p in out.glob("records.rank*")}
    assert sorted(parts) == [part_name(0), part_name(1)] and all(parts.values())
    images = {name: {r["image"] for r in recs} for name, recs in parts.items()}
    assert not images[part_name(0)] & images[part_name(1)]  # every prompt of an image on one rank
    assert sum(map(len, parts.values())) < 36
    with RunLock(out):  # a failure in setup, on rank 0 alone: every rank stops with its message
        busy = run(job, 2, out)
    assert busy.returncode != 0
    # one per rank
    stops = [line for line in busy.stderr.splitlines() if line.startswith("Error: ")]
    assert len(stops) == 2 and all(line.startswith("Error: rank 0 of 2: ")
                                   for line in stops), busy.stderr
    assert "another pope-fast run is writing here" in stops[0]
    # an expected failure: torchrun's summary shows each rank's line, not a traceback through
    # our code

    assert f'File "{Path(pope_fast.__file__).resolve().parents[1]}' not in busy.stderr
    resumed = run(job, 3, out)
    assert resumed.returncode == 0, resumed.stderr
    assert (f"resumed: {sum(map(len, parts.values()))} of 36 questions were already recorded"
            in resumed.stdout)
    same_run(job, out)


@pytest.mark.slow
def test_a_rank_killed_outright_stops_the_job_and_one_process_resumes_it(job):
    """A real SIGKILL (not an exception the rank reports): torchrun names the killed rank and stops
    the job (rank 0 may report the rank missing at its barrier first, or be stopped before it gets
    there), and a plain process finishes the run exactly."""
    out = job.root / "killed"
    result = run(job, 2, out, fault="1:kill")
    assert result.returncode != 0
    assert ("Signal 9 (SIGKILL)" in result.stderr
            and "rank      : 1 (local_rank: 1)" in result.stderr)
    resumed = run_here(job, out)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed: " in resumed.stdout
    same_run(job, out)


# A plain run killed by SIGKILL inside the records writer's thread, as it appends its second image
# step: part of the step's bytes in the file (a torn last line), the rest handed over but never
# written.
KILLED_WRITER = """
import os, signal
from pope_fast import appender
from pope_fast.cli import main

append, calls = appender.Appender._append, []

def killed(self, data):
    calls.append(len(data))
    if len(calls) == 2:
        os.write(self.fd, data[:int(len(data) * float(os.environ["KEEP"]))])
        os.kill(os.getpid(), signal.SIGKILL)
    append(self, data)

appender.Appender._append = killed
main(prog_name="pope-fast")
"""


@pytest.mark.slow
def test_a_run_killed_in_its_records_writer_resumes_to_the_same_bytes(job):
    keep = "0.5"
    out = job.root / "writer-killed"
    script = job.root / "killed_writer.py"
    script.write_text(KILLED_WRITER)
    killed = launch([sys.executable, str(script), *job.args, "--out", str(out)], CLONE, KEEP=keep)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    text = (out / "records.jsonl").read_text()
    assert not text.endswith("\n")  # torn mid-line: part of the step got in
    # the first step's 12 records (2 images, 6 questions each), some of the second's
    whole = text.count("\n")
    assert 12 < whole < 24
    resumed = run_here(job, out)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed: {whole} of 36 questions were already recorded" in resumed.stdout
    same_run(job, out)
