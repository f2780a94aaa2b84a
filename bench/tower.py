"""Qwen2.5-VL's vision tower, per image: attention calls and reads back to the host, transformers'
forward against the engine's (engine/models/qwen2_5_vl.py), counted on the CPU or a GPU.

    python -m pope_fast.bench.tower                 # a 640 x 480 image's grid; seconds on a CPU
    python -m pope_fast.bench.tower --grid 1,32,32  # another grid (t,h,w in 14-px patches)
    python -m pope_fast.bench.tower --device cuda --dtype fp16 --width 1280 --heads 16  # 7B, timed

The tower has Qwen2.5-VL-7B's geometry (32 blocks, whole-image attention in blocks 7, 15, 23 and 31,
windows of 112 px, 14-px patches merged 2 x 2) at a small width unless told, since neither count
depends on the width. A read back is a call that waits for the device where the tensor lives there
(.tolist(), .item(), bool(), int(), .cpu(), ...). On CUDA (on a CPU with --time) each forward is
also timed (median of 5 after a warm-up). Prints a markdown table; exits 1 if the two forwards'
features differ in any bit.
"""
import argparse
import statistics
import sys
import time
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from ..engine.models.qwen2_5_vl import TowerPlan, windowed_tower

READS_BACK = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
              torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}
ATTENTION = {torch.nn.functional.scaled_dot_product_attention}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
QWEN2_5_VL_7B = dict(depth=32, window_size=112, patch_size=14, spatial_merge_size=2,
                     fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu")


class CallCounter(TorchFunctionMode):
    """Counts, while active, the torch calls that attend and those that read a tensor back to
    the host."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in ATTENTION:
            self.counts["attention_calls"] += 1
        elif func in READS_BACK:
            self.counts["reads_back"] += 1
        return func(*args, **(kwargs or {}))


def random_tower(width: int = 32, heads: int = 4, seed: int = 0, **geometry):
    """transformers' Qwen2.5-VL tower at 7B's geometry (or `geometry`'s config fields) and the given
    width, random weights, fp32, SDPA."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel)

    config = Qwen2_5_VLVisionConfig(hidden_size=width, num_heads=heads, intermediate_size=2 * width,
                                    out_hidden_size=width, **{**QWEN2_5_VL_7B, **geometry})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config).eval()
    # RMSNorm weights start at one: drawn, so that every weight matters
    for p in tower.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return tower


def tower_counts(grids: list[tuple[int, int, int]], tower=None, timed: bool = False) -> dict:
    """Per call over `grids`' images: attention calls and reads back of transformers' forward (grid
    on the tower's device, as the engine sent it) and of the engine's, whether their features are
    equal bit for bit, and where `timed` each one's median milliseconds."""
    tower = tower if tower is not None else random_tower()
    config, weight = tower.config, next(tower.parameters())
    n_patches = sum(t * h * w for t, h, w in grids)
    patches = torch.randn(n_patches, 3 * config.temporal_patch_size * config.patch_size**2,
                          device=weight.device, dtype=weight.dtype)

    def transformers():
        return tower(hidden_states=patches,
                     grid_thw=torch.tensor(grids, device=patches.device)).pooler_output

    def engine():
        return windowed_tower(tower, patches, TowerPlan.of(grids, config, patches.device))

    forwards = {"transformers": transformers, "engine": engine}
    report, out = {}, {}
    with torch.inference_mode():
        for name, forward in forwards.items():
            with CallCounter() as counter:
                out[name] = forward()
            report[name] = {k: counter.counts[k] for k in ("attention_calls", "reads_back")}
            if timed:
                report[name]["ms"] = median_ms(forward, patches.device)
    return {**report, "bits_equal": bool(torch.equal(out["transformers"], out["engine"]))}


def median_ms(forward, device: torch.device, reps: int = 5) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    forward()
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        forward()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="append", default=None,
                        help="an image's patch grid t,h,w (repeatable: images in one call); "
                             "default 1,34,46")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--width", type=int, default=32, help="hidden size (7B: 1280)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (7B: 16)")
    parser.add_argument("--time", action="store_true", help="time each forward on a CPU too")
    args = parser.parse_args(argv)
    grids = [tuple(int(v) for v in g.split(",")) for g in (args.grid or ["1,34,46"])]
    device = torch.device(args.device)
    tower = random_tower(args.width, args.heads).to(device, DTYPES[args.dtype])
    counts = tower_counts(grids, tower, timed=args.time or device.type == "cuda")
    print(f"Qwen2.5-VL tower (7B geometry, width {args.width}, {args.heads} heads, {args.dtype} "
          f"on {device}), grids {grids}, per call\n")
    print("| forward | attention calls | reads back | ms |\n|---|---|---|---|")
    for name in ("transformers", "engine"):
        print(f"| {name} | {counts[name]['attention_calls']} | {counts[name]['reads_back']} | "
              f"{counts[name].get('ms', '-')} |")
    print(f"\nfeatures equal bit for bit: {counts['bits_equal']}")
    return 0 if counts["bits_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
