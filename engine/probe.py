"""The image-attention probe: how much of the answer position's attention falls on the image tokens.

Per layer and head, the answer position (the last prompt token, whose logits are read) attends to its
prefix's keys and its own; the probe is the softmax mass on the keys that hold image tokens. It is
taken from the queries and keys the layer already computed, for the answer row only: one query per
prompt against its keys ([B, Hq, P + S] scores, never a [sequence, sequence] matrix), in fp32 as
transformers' eager attention takes its softmax, and the same whichever backend ran the attention.
"""
from __future__ import annotations

import torch


def answer_image_attention(q: torch.Tensor, lengths: torch.Tensor, k_own: torch.Tensor,
                           own_image: torch.Tensor | None, k_prefix: torch.Tensor | None = None,
                           prefix_image: torch.Tensor | None = None,
                           runs: list[tuple[int, int, int]] | None = None,
                           edit=None) -> torch.Tensor:
    """[B, Hq] fp32: each row's attention mass on image keys at its last valid query.

    q [B, Hq, S, D] (RoPE applied); lengths [B]; k_own [B, Hkv, S, D] the rows' own keys, own_image
    [B, S] marking image keys among them (None: none); k_prefix [G, Hkv, P, D] with prefix_image
    [G, P] and runs (prefix, first row, end row) when the rows continue prefixes; edit (llama.HeadEdit)
    as Intervention.image_attention applies it to the image keys' logits."""
    batch, q_heads, length, head_dim = q.shape
    kv_heads = k_own.shape[1]
    group = q_heads // kv_heads
    rows = torch.arange(batch, device=q.device)
    last = q[rows, :, lengths - 1].float().view(batch, kv_heads, group, head_dim) * head_dim**-0.5
    own = last @ k_own.float().transpose(-1, -2)  # [B, Hkv, g, S]
    own = own.masked_fill(~(torch.arange(length, device=q.device)[None, :] < lengths[:, None])[:, None, None],
                          float("-inf"))
    image = own_image if own_image is not None else torch.zeros(batch, length, dtype=torch.bool, device=q.device)
    if k_prefix is not None:
        prefix = torch.cat([last[a:e] @ k_prefix[g].float().transpose(-1, -2) for g, a, e in runs])  # [B, Hkv, g, P]
        own = torch.cat([prefix, own], dim=-1)
        image = torch.cat([torch.cat([prefix_image[g].expand(e - a, -1) for g, a, e in runs]), image], dim=-1)
    if edit is not None:
        own = torch.where(image[:, None, None], edit.apply(own, lambda x: x.view(kv_heads, group, 1)), own)
    probs = torch.softmax(own, dim=-1)
    return (probs * image[:, None, None]).sum(-1).view(batch, q_heads)
