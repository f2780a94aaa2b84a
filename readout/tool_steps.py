"""What a tool does beyond its prompt and length, as the engine's settings name it: its steps (image handling and
generate's options, each an engine Settings field) and how it cuts its answer out of generate's whole output.
A protocol's coverage sets them (protocols/base.py `Coverage`), a readout plan carries the cut, and a comparison
holds two runs to the same steps (compare.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# What a tool does to each image and to its generate beyond the prompt and length, each an engine Settings field
# of the same name and default (meta.json's settings and coverage record each only where it is not the default).
TOOL_STEPS = ("image_reencode", "image_resize", "processor_pixels", "processor_patches", "min_new_tokens",
              "answer_cut", "image_mask", "generation_config", "repetition_penalty", "num_beams", "length_penalty",
              "max_length", "do_sample", "temperature", "top_k", "top_p")


@dataclass(frozen=True)
class AnswerCut:
    """How a tool makes its answer from generate's whole output (the prompt, the new tokens and the stop token
    that ended them, decoded as one), where it does not decode the new tokens alone (Settings.answer_cut)."""

    readout: str  # the tool's rule, whose text this is (the other readouts read the new tokens, as theirs do)
    special_tokens: bool  # decoded with the special tokens (skip_special_tokens=False), or without them
    cut: Callable[[str], str]  # that text → the tool's answer
