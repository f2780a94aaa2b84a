"""What a sweep measures about itself: seconds per phase and work done (the benchmark's inputs)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import torch


@dataclass
class Timings:
    """Seconds per phase, summed over calls (for the benchmark's phase table). With `synchronize`
    (bench sets it: Engine.reset(timed=True)) each phase waits for the device at its start and end,
    so its seconds are the device's; without it a phase is the host's time to launch its work, and a
    sweep never waits for a clock."""

    image_encode: float = 0.0
    prefix_prefill: float = 0.0
    question_prefill: float = 0.0
    decode: float = 0.0
    synchronize: bool = field(default=False, compare=False)

    def to_json(self) -> dict:
        return {f.name: round(getattr(self, f.name), 4) for f in fields(self)
                if f.name != "synchronize"}


@dataclass
class Counts:
    """Work done, summed over calls: what the benchmark turns into FLOPs."""

    images_encoded: int = 0
    # tokens through the vision tower (LLaVA: 577 per crop; Qwen2-VL: patches)
    vision_tokens: int = 0
    prompts: int = 0
    prefix_tokens: int = 0
    suffix_tokens: int = 0
    decode_steps: int = 0


class Clock:
    """Adds elapsed wall time to one Timings field; synchronises CUDA where the timings ask for it,
    so the phase is the device's."""

    def __init__(self, timings: Timings, field: str, device: torch.device):
        self.timings, self.field, self.device = timings, field, device

    def __enter__(self):
        self._sync()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self._sync()
        setattr(self.timings, self.field,
                getattr(self.timings, self.field) + time.perf_counter() - self.start)

    def _sync(self):
        if self.timings.synchronize and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
