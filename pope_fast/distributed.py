"""Scale-out with torchrun: one sweep split across processes (ranks) by image, its records merged
exactly.

torchrun starts one process per device and gives each RANK, WORLD_SIZE, LOCAL_RANK and the
rendezvous; `Shard.from_env` reads them and `Shard.join` joins the process group (gloo on CPU, nccl
on CUDA, and a gloo group beside it for the few control messages). A sweep then asks the shard

- which image steps this rank runs (`share`): whole steps (the `image_batch` images a single process
  runs as one model step, formed from all the questions whatever is recorded, pope_fast.sweep), so
  every prompt of an image is on one rank (prefix reuse and dedup keep their full effect) and each
  rank's results are bit for bit a single process's; balanced by vision tokens plus prompt tokens
  with a greedy costliest-first assignment that every rank computes alike from the same questions
  and records;
- where its records go (`writer`): its own part, `records.rank<R>.jsonl`, while the run's
  `records.jsonl` is read as recorded, so whatever any rank recorded before is skipped;
- for the merge (`merge`): a barrier after which rank 0 folds the parts into `records.jsonl`.

Parts left by a job that stopped are folded in by rank 0 before any rank reads what is recorded
(`begin`), so a rerun with any number of ranks, or a single process (`fold_parts`), resumes from
them. Rank 0 alone holds the run folder's RunLock; the other ranks write only their parts.

When a rank fails: a step every rank takes at the same point (setup, `begin`, `merge`) ends in
`agree`, an all-gather of each rank's error, so every rank stops with the first failing rank's
message. A rank that fails on its own (mid-sweep, or killed) exits non-zero; torchrun's agent then
stops the other ranks and exits non-zero naming the rank. A rank already waiting in a collective
sees gloo's error for the closed connection, and a live but hung peer is bounded by the group's
timeout (POPE_FAST_DIST_TIMEOUT seconds, default 3600: the end barrier waits for the slowest rank's
shard); the end barrier is `monitored_barrier`, which names the ranks that never arrived.
"""
from __future__ import annotations

import heapq
import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
# torch.distributed.nn's functions take `group=group.WORLD` as a default argument: imported while a
# group is up (transformers imports it loading some models) they hold the group past
# destroy_process_group, and it is then torn down at interpreter exit, where gloo's threads were
# seen to abort the rank ("terminate called without an active exception"). Imported with this
# module, before any group, the defaults are None. (Imported inside Shard.join, it made `torch` a
# local name there, so the CUDA branch's torch.cuda.set_device raised UnboundLocalError.)
import torch.distributed.nn  # noqa: F401
from PIL import Image

from .readout import DataError, Question
from .readout.records import RECORDS_FILE, part_name
from .store import RecordWriter, fold_parts

TIMEOUT_ENV = "POPE_FAST_DIST_TIMEOUT"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # where torchrun's agent reads a rank's failure


class RankError(ValueError):
    """A step failed on some rank; raised on every rank, naming the first that failed."""


@dataclass
class Shard:
    rank: int
    world_size: int
    local_rank: int
    # the gloo group for control messages, once joined
    group: object = field(default=None, repr=False)
    timeout: timedelta = timedelta(seconds=3600)

    @classmethod
    def from_env(cls) -> "Shard | None":
        """This process's place in a torchrun job, or None outside one."""
        if "WORLD_SIZE" not in os.environ:
            return None
        try:
            return cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                       int(os.environ.get("LOCAL_RANK", 0)))
        except (KeyError, ValueError) as err:
            raise ValueError("torchrun environment: RANK/WORLD_SIZE/LOCAL_RANK are not integers "
                             f"({err})") from None

    @property
    def lead(self) -> bool:
        return self.rank == 0

    @property
    def name(self) -> str:
        return f"rank {self.rank} of {self.world_size}"

    def device(self, device: str) -> str:
        """One device per local rank: cuda means cuda:LOCAL_RANK."""
        return f"cuda:{self.local_rank}" if device == "cuda" else device

    def join(self, device: str) -> None:
        """Join the job's process group (torchrun's rendezvous from the environment)."""
        self.timeout = timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, 3600)))
        on_cuda = device.startswith("cuda")
        if on_cuda:
            torch.cuda.set_device(torch.device(self.device(device)))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if on_cuda else "gloo", timeout=timeout)
        self.group = (dist.new_group(backend="gloo", timeout=timeout) if on_cuda
                      else dist.group.WORLD)

    def leave(self) -> None:
        """Leave the process group once every rank's work is done (NCCL asks for it before exit),
        after the ranks meet. Nothing holds the group after: its threads stop here, while the
        interpreter runs, not in the interpreter's teardown (`join`)."""
        if dist.is_initialized():
            dist.barrier(group=self.group)
            self.group = None
            dist.destroy_process_group()

    def agree(self, error: BaseException | None) -> None:
        """Every rank's outcome of one step; if any failed, RankError on every rank naming
        the first."""
        outcomes = [None] * self.world_size
        mine = None if error is None else (str(error) or type(error).__name__)
        dist.all_gather_object(outcomes, mine, group=self.group)
        failed = [(rank, message) for rank, message in enumerate(outcomes) if message is not None]
        if failed:
            rank, message = failed[0]
            raise RankError(message if message.startswith("rank ")
                            else f"rank {rank} of {self.world_size}: {message}")

    def gather(self, value) -> list:
        values = [None] * self.world_size
        dist.all_gather_object(values, value, group=self.group)
        return values

    def record_failure(self, message: str) -> None:
        """Leave this rank's failure in torchrun's error file (TORCHELASTIC_ERROR_FILE), whose
        message torchrun's summary shows: the one line, where torch's own ErrorHandler would leave
        the traceback of the exception being handled (an expected failure is no bug, its traceback
        only noise)."""
        path = os.environ.get(ERROR_FILE_ENV)
        if path:
            extra = {"py_callstack": message, "timestamp": str(int(time.time()))}
            entry = {"message": f"RankError: {message}", "extraInfo": extra}
            Path(path).write_text(json.dumps({"message": entry}))

    def begin(self, out_dir: Path) -> None:
        """Rank 0 folds in the parts an earlier job left; the others wait, then read what is
        recorded."""
        error = None
        if self.lead:
            try:
                fold_parts(out_dir)
                # mends a torn last line before the other ranks read the file
                with RecordWriter(out_dir):
                    pass
            except (DataError, OSError) as err:
                error = err
        self.agree(error)

    def share(self, steps: list[list[str]], questions: list[Question], engine) -> list[list[str]]:
        """This rank's image steps, in their order: those `assign_steps` gives it, by the tokens
        each step's images and prompts run (`image_costs`), every rank computing the same
        assignment."""
        costs = image_costs(questions, engine)
        owner = assign_steps([sum(costs[name] for name in step) for step in steps], self.world_size)
        return [step for step, rank in zip(steps, owner) if rank == self.rank]

    def writer(self, out_dir: Path) -> RecordWriter:
        """This rank's part, with records.jsonl read as recorded."""
        return RecordWriter(out_dir, part_name(self.rank), also=(RECORDS_FILE,))

    def merge(self, out_dir: Path, counts: tuple[int, int]) -> tuple[int, int]:
        """The end barrier (naming the ranks that never arrive), then rank 0 folds every part into
        records.jsonl. Returns `counts` (evaluated prompts, error records) summed over the ranks."""
        try:
            dist.monitored_barrier(group=self.group, timeout=self.timeout, wait_all_ranks=True)
        # gloo says "failed to pass in <timeout>" even of a rank that died at once
        except RuntimeError as err:
            found = re.search(r"Ranks? ([\d, ]+) failed to pass", str(err))
            missing = f"rank(s) {found.group(1).strip()}" if found else "a rank"
            raise RankError(f"{self.name}: {missing} stopped before the end of the sweep "
                            "(torchrun names why); "
                            "rerun the same command to resume") from None
        total = tuple(map(sum, zip(*self.gather(counts))))
        if self.lead:
            fold_parts(out_dir)
        return total


def device_and_shard(device: str | None) -> tuple[str, Shard | None]:
    """The device (cuda when available) and this process's torchrun Shard, joined (None outside
    torchrun); ValueError naming why it cannot join."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return device, join_job(device)


def join_job(device: str) -> Shard | None:
    """This process's Shard, joined to its torchrun job, or None outside torchrun; ValueError naming
    why it cannot join."""
    try:
        shard = Shard.from_env()
        if shard is not None:
            shard.join(device)
    except (ValueError, RuntimeError) as err:
        raise ValueError(f"torchrun: cannot join the job ({err})") from None
    return shard


@contextmanager
def every_rank(shard: Shard | None):
    """A step every rank takes: if it fails on any rank, every rank stops naming the first that
    failed."""
    if shard is None:
        yield
        return
    try:
        yield
    except Exception as err:
        shard.agree(err)
        raise
    shard.agree(None)


def image_costs(questions: list[Question], engine) -> dict[str, int]:
    """Per image, first asked first: the tokens its vision pass runs plus those of its distinct
    prompts, from the question set alone (a 640 x 480 image's vision tokens stand for every
    image's)."""
    model = engine.model
    vision = model.vision_tokens(model.preprocess(Image.new("RGB", (640, 480), (124, 116, 104))))
    lengths: dict[str, int] = {}
    prompts: dict[str, set[str]] = {}
    for q in questions:
        prompt = engine.prompt(q.text)
        if prompt not in lengths:
            lengths[prompt] = len(model.tokenizer(prompt)["input_ids"])
        prompts.setdefault(q.image, set()).add(prompt)
    return {name: vision + sum(lengths[p] for p in asked) for name, asked in prompts.items()}


def assign_steps(costs: list[float], world_size: int) -> list[int]:
    """Rank of each step: the costliest step first (the earlier on ties) to the least loaded rank
    (the lower on ties). Deterministic, so every rank computes the same assignment from the same
    costs; a rank runs its steps in their order, so only the last step of all can be short, and it
    stays last."""
    loads = [(0.0, rank) for rank in range(world_size)]
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, rank = heapq.heappop(loads)
        owner[i] = rank
        heapq.heappush(loads, (load + costs[i], rank))
    return owner


