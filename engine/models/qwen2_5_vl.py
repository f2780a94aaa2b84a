"""Qwen2.5-VL (transformers `model_type: qwen2_5_vl`; Qwen2.5-VL-7B-Instruct).

Qwen2-VL's pipeline with a new vision tower: the same processor (14-px patches of two frames, 2 x 2
merging, images resized to multiples of 28 px within a pixel budget), the same Qwen2 language model
with M-RoPE and the same positions for a still image (transformers spaces the temporal stream by
tokens_per_second * second_per_grid_ts for videos only; an image has one frame at temporal 0). The
tower differs: RMSNorm, a gated SiLU MLP, 2-D rotary embeddings, and attention within windows of
window_size px (merge groups permuted window by window, the merger's output put back in raster
order) except in the fullatt_block_indexes blocks, which attend over the whole image. The tower's
weights live in transformers' own module, as for Qwen2-VL; its forward is ours (windowed_tower),
with the same arithmetic; everything else is Qwen2VLModel's.

transformers' forward attends window by window (a 640 x 480 image: 30 windows, 844 SDPA calls) and
reads the window lengths back from the grid's device three times a block (100 reads an image;
bench/tower.py). Ours lays the windows out once per image grid on the CPU and, per windowed block,
attends all windows of one length in one batched SDPA call (one image has 4 lengths at most: full
windows, the right column's, the bottom row's, the corner's; 116 calls in all at 640 x 480) and
reads nothing back. The windows are batched, not padded to one length under a mask, because a mask
moves CUDA's SDPA off the flash kernel that transformers' unmasked calls run, to one with other
bits; a batch runs each window as its own call does. The whole-image blocks attend one image per
call, as transformers does: flash-attention may split long keys by a rule that depends on the batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..utils.stats import Counts
from .qwen2_vl import Qwen2VLModel


class Qwen2_5_VLModel(Qwen2VLModel):
    """Everything the engine needs from one Qwen2.5-VL checkpoint."""

    family = "qwen2_5_vl"
    name = "Qwen2.5-VL"
    seed_model = "Qwen2.5-VL-7B-Instruct"
    inner_types = {"text_config": ("qwen2_5_vl_text",), "vision_config": ("qwen2_5_vl_vision",)}

    @staticmethod
    def transformers_classes() -> tuple[type, type, type]:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel)

        return (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                Qwen2_5_VisionTransformerPretrainedModel)

    def tower(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """transformers' tower forward with its windows laid out on the CPU and batched by
        length (windowed_tower); its own forward where its attention is not SDPA (eager:
        other arithmetic)."""
        if self.vision.config._attn_implementation != "sdpa":
            return super().tower(patches, grids)
        plan = TowerPlan.of(grids, self.config.vision_config, patches.device)
        return windowed_tower(self.vision, patches, plan)

    def vision_flops(self, counts: Counts) -> float:
        """Per patch (14 x 14 x 2 frames x 3 channels in) the blocks (q/k/v and output projections,
        the gated MLP's three matrices; windows change the attention scores only), the patch
        embedding, and the merger, whose MLP runs once per four patches."""
        vc = self.config.vision_config
        d, merged = vc.hidden_size, vc.spatial_merge_size**2
        per_patch = (2 * vc.depth * (4 * d * d + 3 * d * vc.intermediate_size)
                     + 2 * 3 * vc.temporal_patch_size * vc.patch_size**2 * d
                     + 2 * ((merged * d) ** 2 + merged * d * vc.out_hidden_size) / merged)
        return per_patch * counts.vision_tokens


@lru_cache(maxsize=256)
def image_windows(grid: tuple[int, int, int], merge: int,
                  side: int) -> tuple[np.ndarray, tuple[int, ...], np.ndarray]:
    """One image's layout, as transformers' get_vision_window_index and get_vision_position_ids make
    it: its patches in window order (frame, window row, window column; merged tokens in raster order
    within a window, each one's merge x merge patches together), each window's number of patches,
    and each patch's (row, col) in the processor's order [t * h * w, 2]."""
    t, h, w = grid
    rows, cols, unit = h // merge, w // merge, merge * merge
    tokens = np.arange(t * rows * cols).reshape(t, rows, cols)
    windows = [tokens[f, r:r + side, c:c + side].reshape(-1) for f in range(t)
               for r in range(0, rows, side) for c in range(0, cols, side)]
    order = (np.concatenate(windows)[:, None] * unit + np.arange(unit)).reshape(-1)
    row, col = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    # [h, w] → [h / merge, w / merge, merge, merge]: the processor's merge groups in raster order
    positions = np.stack([a.reshape(rows, merge, cols, merge).transpose(0, 2, 1, 3).reshape(-1)
                          for a in (row, col)], 1)
    for array in (order, positions):
        array.setflags(write=False)
    return order, tuple(len(window) * unit for window in windows), np.tile(positions, (t, 1))


@dataclass(frozen=True)
class Groups:
    """Sequences attended in one SDPA call per group: group i holds counts[i] sequences of
    lengths[i] tokens; `order` gathers the tokens group by group and `inverse` puts the outputs back
    (both None where the groups already lie in order)."""
    lengths: tuple[int, ...]
    counts: tuple[int, ...]
    order: torch.Tensor | None = None
    inverse: torch.Tensor | None = None

    @staticmethod
    def by_length(lengths: list[int]) -> tuple[list[int], list[int], np.ndarray | None]:
        """The distinct lengths (first seen first), how many sequences have each, and the token
        order that puts each length's sequences together (None where it is the present order)."""
        starts = np.cumsum([0, *lengths[:-1]])
        distinct = list(dict.fromkeys(lengths))
        members = [[s for s, n in zip(starts, lengths) if n == length] for length in distinct]
        order = np.concatenate([np.arange(s, s + n)
                                for n, group in zip(distinct, members) for s in group])
        identity = bool(np.array_equal(order, np.arange(len(order))))
        return distinct, [len(group) for group in members], None if identity else order


@dataclass(frozen=True)
class TowerPlan:
    """Everything a tower call needs from the images' grids, made on the CPU and sent in
    one copy."""
    order: torch.Tensor      # [patches]: the patches in window order
    # [merged tokens]: the merger's outputs back in raster order, image after image
    reverse: torch.Tensor
    positions: torch.Tensor  # [patches, 2]: each patch's (row, col), in the processor's order
    windows: Groups          # the windowed blocks' attention
    whole: Groups            # the other blocks': one image (frame) per call

    @classmethod
    def of(cls, grids: list[tuple[int, int, int]], vision_config,
           device: torch.device) -> "TowerPlan":
        merge = vision_config.spatial_merge_size
        # merged tokens a window side
        side = vision_config.window_size // merge // vision_config.patch_size
        if side < 1:
            raise ValueError(f"vision_config.window_size {vision_config.window_size} is under one "
                             f"merged token ({merge * vision_config.patch_size} px): no window to "
                             "attend in")
        layouts = [image_windows(tuple(int(v) for v in grid), merge, side) for grid in grids]
        sizes = np.cumsum([0] + [len(order) for order, _, _ in layouts])
        order = np.concatenate([o + start for (o, _, _), start in zip(layouts, sizes)])
        lengths = [n for _, windows, _ in layouts for n in windows]
        distinct, counts, window_order = Groups.by_length(lengths)
        merged = order[::merge * merge] // (merge * merge)
        parts = [order, np.argsort(merged, kind="stable"),
                 np.concatenate([p for _, _, p in layouts]).reshape(-1)]
        if window_order is not None:
            parts += [window_order, np.argsort(window_order, kind="stable")]
        host = torch.from_numpy(np.concatenate(parts).astype(np.int64))
        # pinned: the host goes on without waiting for the copy or the work queued before it
        if device.type == "cuda":
            host = host.pin_memory()
        sent = host.to(device, non_blocking=True).split([len(p) for p in parts])
        frames = [h * w for t, h, w in grids for _ in range(t)]
        return cls(order=sent[0], reverse=sent[1], positions=sent[2].view(-1, 2),
                   windows=Groups(tuple(distinct), tuple(counts), *sent[3:]),
                   whole=Groups(tuple(frames), (1,) * len(frames)))


def windowed_tower(vision, patches: torch.Tensor, plan: TowerPlan) -> torch.Tensor:
    """Qwen2_5_VisionTransformerPretrainedModel.forward's merged features [tokens, hidden] with its
    ops in its order, but the attention batched (attend) and the layout from the plan."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    x = vision.patch_embed(patches)[plan.order]
    cos, sin = (f[plan.order] for f in vision.rotary_pos_emb(x, plan.positions))
    for i, block in enumerate(vision.blocks):
        groups = plan.whole if i in vision.fullatt_block_indexes else plan.windows
        attn, n = block.attn, x.shape[0]
        qkv = attn.qkv(block.norm1(x)).reshape(n, 3, attn.num_heads, -1)
        q, k, v = qkv.permute(1, 0, 2, 3).unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
        x = x + attn.proj(attend(q, k, v, groups, attn.scaling))
        x = x + block.mlp(block.norm2(x))
    return vision.merger(x)[plan.reverse]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: Groups,
           scale: float) -> torch.Tensor:
    """Attention within each sequence of q, k, v [tokens, heads, head_dim] → [tokens, heads *
    head_dim]: one SDPA call per group of equal-length sequences."""
    if groups.order is not None:
        q, k, v = q[groups.order], k[groups.order], v[groups.order]
    out, start = [], 0
    for length, count in zip(groups.lengths, groups.counts):
        end = start + count * length
        # [count * length, heads, head_dim] → [count, heads, length, head_dim]
        batch = (t[start:end].unflatten(0, (count, length)).transpose(1, 2) for t in (q, k, v))
        attended = torch.nn.functional.scaled_dot_product_attention(*batch, scale=scale)
        out.append(attended.transpose(1, 2).reshape(end - start, -1))

        start = end
    out = torch.cat(out) if len(out) > 1 else out[0]
    return out if groups.inverse is None else out[groups.inverse]
