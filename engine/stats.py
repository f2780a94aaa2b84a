"""What a sweep measures about itself: seconds per phase and work done (the benchmark's inputs)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Timings:
    """Seconds per phase, summed over calls (for the benchmark's phase table)."""

    image_encode: float = 0.0
    prefix_prefill: float = 0.0
    question_prefill: float = 0.0
    decode: float = 0.0

    def to_json(self) -> dict:
        return {k: round(v, 4) for k, v in vars(self).items()}


@dataclass
class Counts:
    """Work done, summed over calls: what the benchmark turns into FLOPs."""

    images_encoded: int = 0
    vision_tokens: int = 0  # tokens through the vision tower (LLaVA: 577 per crop; Qwen2-VL: patches)
    prompts: int = 0
    prefix_tokens: int = 0
    suffix_tokens: int = 0
    decode_steps: int = 0


class Clock:
    """Adds elapsed wall time to one Timings field; synchronises CUDA so the phase is honest."""

    def __init__(self, timings: Timings, field: str, device: torch.device):
        self.timings, self.field, self.device = timings, field, device

    def __enter__(self):
        self._sync()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self._sync()
        setattr(self.timings, self.field, getattr(self.timings, self.field) + time.perf_counter() - self.start)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
