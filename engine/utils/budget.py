"""How big a step is when the settings leave it to the device: the question rows of one prefill
batch and the images of one step, from the device's total memory (the GPU's, or the machine's RAM
for the CPU).

On a GPU a question batch of ~30 rows is launch-bound (bench/RESULTS.md: 46 ms a batch against
~10-14 ms of work for LLaVA-1.5-7B), so a step should put all the questions of many images into one
prefill. What bounds it is memory: per image its prefix's KV (7B fp16: ~0.5 MB a token, ~0.3 GB for
LLaVA-1.5's 600 tokens, ~1.5 GB for LLaVA-NeXT's ~2,900), per question row its suffix's KV and the
first 64 decode slots of a continuation (~40 MB). The rule is sized for a 7B model beside its
weights, and reads total memory, never free memory: the same device gives the same batches, so a
rerun or a resume computes every prompt in the same shapes (docs/design.md)."""
from __future__ import annotations

import os
from functools import cache

import torch

GIB = 1 << 30
ROWS_PER_GIB, MIN_ROWS, MAX_ROWS = 16, 32, 2048
GIB_PER_IMAGE, MIN_IMAGES, MAX_IMAGES = 4, 8, 32


@cache
def device_memory(device: torch.device) -> int:
    """Total bytes of the device's memory: a CUDA device's own, else the machine's physical RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def question_rows(memory: int, row_bytes: int = 0) -> int:
    """Question suffixes per prefill batch: 16 per GiB, within 32 .. 2048 (an H200: 2048, an H100:
    1,265, a 24 GB card or a 23 GB CPU machine: ~370). `row_bytes`: what a row holds beyond its KV
    (a hybrid decoder's recurrent state, DecoderDims.row_state_bytes), added to each row's 1/16 GiB:
    Qwen3.5-9B's 50 MB a row would otherwise ask an H200 for 100 GB of states."""
    return max(MIN_ROWS, min(MAX_ROWS, memory // (GIB // ROWS_PER_GIB + row_bytes)))


def step_images(memory: int, gpu: bool = True) -> int:
    """Images per step (their vision calls, their prefixes prefilled together, their questions
    batched): on a GPU one per 4 GiB, within 8 .. 32 (an H200: 32, an H100: 19, 32 GB or less: 8);
    on the CPU 8, whatever its RAM: it is compute-bound, so a larger step saves no launches and only
    makes what a crash loses larger."""
    return max(MIN_IMAGES, min(MAX_IMAGES, memory // (GIB_PER_IMAGE * GIB))) if gpu else MIN_IMAGES
