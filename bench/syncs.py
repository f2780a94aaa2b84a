"""Where a sweep would wait on the device: its host↔device synchronisation points and its torch
calls on the device's tensors (about one kernel launch each on CUDA), per phase, counted on any
device (on the CPU nothing waits, but the same calls are made).

    python -m pope_fast.bench.syncs                # the demo's model, 60 questions, on the CPU
    python -m pope_fast.bench.syncs --questions 600 --batch-size 32 --image-batch 8  # other batches

Counted while a cold sweep runs (no records, no cached features, after the engine's warmup), where a
tensor is the host's if it lives on the CPU while the engine runs on CUDA, or, on the CPU, if the
sweep made it without naming a device (or from such a tensor), as it would be on CUDA:
- reads back: a device tensor read by the host (.tolist(), .item(), bool(), int(), .cpu(), ...),
  which waits for the device;
- copies to the device: `.to(device)` of a host tensor (non_blocking aside) or
  `torch.tensor(..., device=)`, a blocking copy from pageable host memory on CUDA;
- masked indexing: a tensor indexed by a boolean device tensor (read or written), whose shape the
  host must learn;
- device calls: torch calls on device tensors, views and metadata aside (about one kernel launch
  each on CUDA);
- non-blocking copies: `.to(device, non_blocking=True)` of a host tensor, which (from pinned memory)
  the host does not wait for;
- bytes to the device: what those copies move, blocking or not (in the dtype they arrive in: a copy
  to CUDA that also casts casts on the host first).
Phases are the engine's (engine/stats.py Clock: image_encode, prefix_prefill, question_prefill,
decode); "between" is the rest of the sweep (token rows built outside a phase, decisions, records).
On the CPU the kernels' torch references check their index ranges on the host (kernels/: only off
CUDA), which counts a few reads back that a GPU does not make.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from ..builtin import demo_inputs
from ..engine import Engine, Settings
from ..engine.utils import stats
from ..sweep import run_plain
from .tower import READS_BACK

KINDS = ("reads_back", "copies_to_device", "masked_indexing", "device_calls", "non_blocking_copies",
         "bytes_to_device")
COPIES = ("copies_to_device", "non_blocking_copies")
MOVES = (torch.Tensor.to, torch.Tensor.cuda)
MADE = (torch.tensor, torch.as_tensor)
METADATA = {"view", "reshape", "transpose", "permute", "expand", "unsqueeze", "squeeze", "size",
            "dim", "numel", "__getitem__", "__len__", "flatten", "unflatten", "narrow", "t",
            "contiguous", "stride", "is_contiguous", "view_as", "expand_as", "__get__", "data_ptr",
            "unbind", "split", "chunk"}
HOST = "_pope_fast_host"  # the attribute that marks a host tensor of a CPU run


def _tensors(args, kwargs) -> list[torch.Tensor]:
    out = []
    for a in [*args, *kwargs.values()]:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [t for t in a if isinstance(t, torch.Tensor)]
    return out


def _names_device(args, kwargs) -> bool:
    return (kwargs.get("device") is not None
            or any(isinstance(a, (torch.device, str)) for a in args[1:2]))


class SyncCounter(TorchFunctionMode):
    """Counts, while active, each synchronisation point and device call under the phase that
    is open."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.counts, self.phases = device, Counter(), ["between"]

    def host(self, t: torch.Tensor) -> bool:
        if self.device.type != "cpu":
            return t.device.type == "cpu"
        return getattr(t, HOST, False)

    def kind(self, func, args, kwargs, tensors) -> str | None:
        """Which synchronisation point a torch call is, or None."""
        if func in READS_BACK:
            return None if self.host(args[0]) else "reads_back"
        if func in MOVES:
            moved = func is torch.Tensor.cuda or _names_device(args, kwargs)
            if not moved or not self.host(args[0]):
                return None
            return "non_blocking_copies" if kwargs.get("non_blocking") else "copies_to_device"
        if func in MADE:
            return "copies_to_device" if kwargs.get("device") is not None else None
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and not self.host(i)
                   for i in index):
                return "masked_indexing"
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = _tensors(args, kwargs)
        kind = self.kind(func, args, kwargs, tensors)
        if kind is not None:
            self.counts[self.phases[-1], kind] += 1
        out = func(*args, **kwargs)
        # a copy to CUDA casts on the host first: out's bytes
        if kind in COPIES and isinstance(out, torch.Tensor):
            self.counts[self.phases[-1], "bytes_to_device"] += out.nbytes
        if func in MOVES and (func is torch.Tensor.cuda or _names_device(args, kwargs)):
            # now the device's: on the CPU `.to` gives back the host tensor itself, so the device's
            # is an alias of it
            return out.view_as(out) if out is args[0] and self.device.type == "cpu" else out
        on_host = any(self.host(t) for t in tensors) if tensors else kwargs.get("device") is None
        if not on_host and getattr(func, "__name__", "") not in METADATA and func not in READS_BACK:
            self.counts[self.phases[-1], "device_calls"] += 1
        if on_host and self.device.type == "cpu":
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    setattr(t, HOST, True)
        return out


@contextmanager
def counted(device: torch.device):
    """A SyncCounter over the block, each engine phase (stats.Clock) told apart."""
    counter = SyncCounter(device)
    enter, leave, from_numpy = stats.Clock.__enter__, stats.Clock.__exit__, torch.from_numpy

    def entered(clock):
        counter.phases.append(clock.field)
        counter.counts[clock.field, "calls"] += 1
        return enter(clock)

    def left(clock, *exc):
        counter.phases.pop()
        return leave(clock, *exc)

    # an array's tensor is the host's (torch function modes do not see from_numpy)
    def host_array(array):
        t = from_numpy(array)
        setattr(t, HOST, True)
        return t

    stats.Clock.__enter__, stats.Clock.__exit__, torch.from_numpy = entered, left, host_array
    try:
        with counter:
            yield counter
    finally:
        stats.Clock.__enter__, stats.Clock.__exit__, torch.from_numpy = enter, leave, from_numpy


def sweep_counts(questions: int = 60, device: str = "cpu", batch_size: int | None = None,
                 image_batch: int | None = None, folder: Path | None = None) -> dict:
    """Per phase, each kind's count over one cold sweep of the demo's model (the engine warmed
    first), and the phases' calls (question batches, prefix groups, ...)."""
    with tempfile.TemporaryDirectory(prefix="pope-fast-syncs-") as tmp:
        root = Path(folder or tmp)
        checkpoint, asked, images = demo_inputs(root, [], None, questions, None)
        settings = Settings(device=device, batch_size=batch_size, image_batch=image_batch,
                            max_new_tokens=6)
        engine = Engine.load(checkpoint, settings)
        engine.warmup()
        engine.reset(clear_cache=True)
        shutil.rmtree(root / "records", ignore_errors=True)
        with counted(settings.torch_device) as counter:
            run_plain(engine, asked, images, root / "records", workers=1)
    phases = dict.fromkeys(p for p, _ in counter.counts)
    table = {p: {k: counter.counts[p, k] for k in (*KINDS, "calls")} for p in phases}
    table["sweep"] = {k: sum(row[k] for row in table.values()) for k in (*KINDS, "calls")}
    return {"questions": len(asked),
            "settings": {k: settings.to_json()[k] for k in ("batch_size", "image_batch")},
            "phases": table}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=60,
                        help="the demo's built-in questions (6 an image)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: the device's (engine/utils/budget.py)")
    parser.add_argument("--image-batch", type=int, default=None, help="default: the device's")
    args = parser.parse_args(argv)
    report = sweep_counts(args.questions, args.device, args.batch_size, args.image_batch)
    s = report["settings"]
    print(f"{report['questions']} demo questions on {args.device}, batch size {s['batch_size']}, "
          f"image batch {s['image_batch']}: per sweep\n")
    print("| phase | calls | reads back | copies to device | masked indexing | device calls "
          "| non-blocking copies | bytes to device |\n|---|---|---|---|---|---|---|---|")
    for phase, row in report["phases"].items():
        print(f"| {phase} | {row['calls']} | {row['reads_back']} | {row['copies_to_device']} | "
              f"{row['masked_indexing']} | {row['device_calls']} | {row['non_blocking_copies']} | "
              f"{row['bytes_to_device']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
