"""Whole pope-fast jobs under torchrun, for the process tests (test_distributed,
test_distributed_faults): a tiny job and its single-process run, a launcher that can inject a fault
into one rank, and the byte-for-byte check against the single process."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from click.testing import CliRunner
from filelock import FileLock

from pope_fast.cli import main
from pope_fast.engine.synthetic import llava as llava_checkpoints
from pope_fast.engine.synthetic import builtin_questions, write_images, write_question_file


# Every job starts in the clone's root, where users stand (the README's commands put them there):
# torchrun's `-m pope_fast` and `python -m pope_fast` then have the root on sys.path, beside the
# installed package.
CLONE = Path(__file__).resolve().parents[1]


def make_job(tmp_path_factory) -> SimpleNamespace:
    """A tiny fp32 LLaVA, 36 POPE-shaped questions (6 images) and a single-process run of them
    (root/single): made once a session for both modules of torchrun tests (8 s of CPU), under xdist
    by whichever worker comes first, in the session's folder above the workers' own. Their tests
    write folders of their own names beside it."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "torchrun-job"
    with FileLock(f"{root}.lock"):
        if not (root / "whole").is_file():  # a job cut short by a failure is made again
            shutil.rmtree(root, ignore_errors=True)
            _write_job(root)
    return SimpleNamespace(root=root, args=_args(root))


def _args(root: Path) -> list[str]:
    return ["eval", "--model", str(root / "llava-tiny"), "--questions",
            str(root / "demo_pope.json"), "--split", "demo", "--images", str(root / "images"),
            "--max-new-tokens", "6", "--image-batch", "2", "--device", "cpu"]


def _write_job(root: Path) -> None:
    checkpoint = llava_checkpoints.write_checkpoint(root / "llava-tiny", "tiny",
                                                    dtype=torch.float32)
    questions = builtin_questions(36, "demo")
    write_question_file(root / "demo_pope.json", questions)
    write_images(root / "images", [q.image for q in questions])
    assert checkpoint == root / "llava-tiny"
    single = run_here(SimpleNamespace(root=root, args=_args(root)), root / "single")
    assert single.returncode == 0, single.stderr
    (root / "whole").touch()


# pope-fast's command with a fault injected from outside: rank FAULT_RANK's records writer raises
# (or, with FAULT_HOW=kill, the rank SIGKILLs itself) right after its first image step's records
# reach its part file.
FAULTY = """
import os, signal, time
from pope_fast import store
from pope_fast.appender import encode
from pope_fast.cli import main
from pope_fast.readout.records import part_name

write = store.RecordWriter.write

def faulty(self, records):
    size = self.path.stat().st_size
    write(self, records)
    if self.path.name == part_name(int(os.environ["FAULT_RANK"])):
        # the step's records in the file first (the writer appends them from a thread of its own)
        while self.path.stat().st_size < size + len(encode(records)):
            time.sleep(0.01)
        if os.environ.get("FAULT_HOW") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected: stopped after writing {len(records)} records")

store.RecordWriter.write = faulty
main(prog_name="pope-fast")
"""


def run(job, ranks: int, out: Path, fault: str | None = None, **env) -> subprocess.CompletedProcess:
    """pope-fast eval into `out`, started in the clone's root: under torchrun with `ranks`
    processes, or (0) as one plain process; fault "R" or "R:kill" injects FAULTY's fault into rank
    R. Every process computes on one thread, as torchrun sets it for several."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(ranks)] \
        if ranks else [sys.executable]
    command = ["-m", "pope_fast"]
    if fault is not None:
        script = job.root / "faulty.py"
        script.write_text(FAULTY)
        rank, _, how = fault.partition(":")
        command, env = [str(script)], {**env, "FAULT_RANK": rank, "FAULT_HOW": how}
    return launch([*launcher, *command, *job.args, "--out", str(out)], CLONE, **env)


def run_here(job, out: Path) -> subprocess.CompletedProcess:
    """pope-fast eval into `out` as one process: this one, whose imports (seconds of torch and
    transformers a process) are made, on one thread as run()'s processes compute."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(main, [*job.args, "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    failure = "" if result.exception is None or isinstance(result.exception, SystemExit) \
        else repr(result.exception)
    return subprocess.CompletedProcess(job.args, result.exit_code, result.stdout,
                                       result.stderr + failure)


def launch(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    """Run a command in a session of its own, so that a timeout kills torchrun's workers too."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                          start_new_session=True) as proc:

        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def run_meta(folder: Path) -> dict:
    """meta.json less when and by which command line the run was made, which two runs never
    share."""
    return {k: v for k, v in json.loads((folder / "meta.json").read_text()).items()
            if k not in ("created", "updated", "command")}


def same_run(job, out: Path) -> None:
    """`out` is the job's single-process run (job.root/single), byte for byte: same_folder."""
    same_folder(out, job.root / "single")


def same_folder(out: Path, single: Path) -> None:
    """A run's folder as one process wrote `single`: its records the same bytes, its meta and
    summaries the same but for when, by which command and in which folder; no rank's part left."""
    assert (out / "records.jsonl").read_bytes() == (single / "records.jsonl").read_bytes()
    assert run_meta(out) == run_meta(single)
    for name in ("summary.json", "summary.md"):  # identical but for the folder they name
        ours, theirs = (out / name).read_text(), (single / name).read_text()
        assert ours.replace(str(out), "RUN") == theirs.replace(str(single), "RUN"), name
    assert not list(out.glob("records.rank*"))
