"""Qwen2.5-VL's vision tower, per image: attention calls and reads back to the host, transformers' forward
against the engine's (engine/models/qwen2_5_vl.py), counted on the CPU.

    python -m pope_fast.bench.tower                 # a 640 x 480 image's grid; seconds on a CPU
    python -m pope_fast.bench.tower --grid 1,32,32  # another grid (t,h,w in 14-px patches)

The tower has Qwen2.5-VL-7B's geometry (32 blocks, whole-image attention in blocks 7, 15, 23 and 31, windows
of 112 px, 14-px patches merged 2 x 2) at a small width, since neither count depends on the width. A read
back is a call that waits for the device where the tensor lives there (.tolist(), .item(), bool(), int(),
.cpu(), ...). Prints a markdown table; exits 1 if the two forwards' features differ in any bit.
"""
import argparse
import sys
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from ..engine.models.qwen2_5_vl import TowerPlan, windowed_tower

READS_BACK = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
              torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}
ATTENTION = {torch.nn.functional.scaled_dot_product_attention}
QWEN2_5_VL_7B = dict(depth=32, window_size=112, patch_size=14, spatial_merge_size=2,
                     fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu")


class CallCounter(TorchFunctionMode):
    """Counts, while active, the torch calls that attend and those that read a tensor back to the host."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in ATTENTION:
            self.counts["attention_calls"] += 1
        elif func in READS_BACK:
            self.counts["reads_back"] += 1
        return func(*args, **(kwargs or {}))


def random_tower(width: int = 32, seed: int = 0, **geometry):
    """transformers' Qwen2.5-VL tower at 7B's geometry (or `geometry`'s config fields) and the given width,
    random weights, fp32, SDPA."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = Qwen2_5_VLVisionConfig(hidden_size=width, num_heads=4, intermediate_size=2 * width, out_hidden_size=width,
                                    **{**QWEN2_5_VL_7B, **geometry})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config).eval()
    for p in tower.parameters():  # RMSNorm weights start at one: drawn, so that every weight matters
        torch.nn.init.normal_(p, std=0.1)
    return tower


def tower_counts(grids: list[tuple[int, int, int]], tower=None) -> dict:
    """Per call over `grids`' images: attention calls and reads back of transformers' forward (grid on the
    device, as the engine sent it) and of the engine's, and whether their features are equal bit for bit."""
    tower = tower if tower is not None else random_tower()
    config = tower.config
    patches = torch.randn(sum(t * h * w for t, h, w in grids), 3 * config.temporal_patch_size * config.patch_size**2)
    with torch.inference_mode():
        with CallCounter() as old:
            theirs = tower(hidden_states=patches, grid_thw=torch.tensor(grids)).pooler_output
        with CallCounter() as new:
            ours = windowed_tower(tower, patches, TowerPlan.of(grids, config, patches.device))
    keys = ("attention_calls", "reads_back")
    return {"transformers": {k: old.counts[k] for k in keys}, "engine": {k: new.counts[k] for k in keys},
            "bits_equal": bool(torch.equal(theirs, ours))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="append", default=None,
                        help="an image's patch grid t,h,w (repeatable: images in one call); default 1,34,46")
    args = parser.parse_args(argv)
    grids = [tuple(int(v) for v in g.split(",")) for g in (args.grid or ["1,34,46"])]
    counts = tower_counts(grids)
    print(f"Qwen2.5-VL tower (7B geometry), grids {grids}, per call\n")
    print("| forward | attention calls | reads back |\n|---|---|---|")
    for name in ("transformers", "engine"):
        print(f"| {name} | {counts[name]['attention_calls']} | {counts[name]['reads_back']} |")
    print(f"\nfeatures equal bit for bit: {counts['bits_equal']}")
    return 0 if counts["bits_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
