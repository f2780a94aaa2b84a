"""The language model's attention, every variant side by side, over the KV caches of caches.py:
the prefix pass (`causal_attention`), the question suffixes against their prefixes (the fused
`prefix_attention` kernel, or its torch reference off CUDA) or whole prompts (SDPA, or explicit
with an edit), the answer-row recompute of an answer-only edit, the decode step
(`masked_attention` over a `DecodeCache`, within a sliding window where the layer has one), and the
image-attention probe, all editing the image keys' logits with one AttentionEdit.

Torch paths compute in fp32 wherever transformers' eager attention takes its softmax in fp32, so the
probe and the edited paths match it; the unedited whole-prompt path is SDPA in the model dtype, as
transformers' sdpa attention runs it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...kernels import PrefixRuns, prefix_attention
from .caches import PrefixKV
from .interventions import AttentionEdit
from ..inputs.plan import TokenBatch


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, S, D], k and v [B, Hkv, S, D] → causal SDPA in the model dtype, as transformers'
    sdpa attention runs it; grouped heads are read in place, not repeated into copies."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          enable_gqa=q.shape[1] != k.shape[1])


def image_blocks(image: torch.Tensor) -> torch.Tensor:
    """image [B, S] → [B, S, S] bool: key k is visible from query q where k <= q or both lie in one
    run of image tokens (transformers' get_block_sequence_ids_for_mask and blockwise_overlay, Gemma
    3's)."""
    start = image & ~F.pad(image, (1, 0))[:, :-1]
    group = torch.where(image, start.cumsum(dim=1), 0)  # 0: text; n: the n-th image run
    same = (group[:, :, None] == group[:, None, :]) & image[:, :, None]
    length = image.shape[1]
    return same | torch.ones(length, length, dtype=torch.bool, device=image.device).tril()


def image_block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          image: torch.Tensor) -> torch.Tensor:
    """causal_attention, but the tokens of each image run attend to each other both ways
    (image_blocks); SDPA in the model dtype with that boolean mask, as transformers' sdpa attention
    runs Gemma 3."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=image_blocks(image)[:, None],
                                          enable_gqa=q.shape[1] != k.shape[1])


def prompt_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     image: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """One layer's attention of whole sequences from their first token (a prefix, whole prompts):
    causal, each image run's tokens seeing each other both ways where image [B, S] is given
    (image_blocks), and within a sliding window where the layer has one and the sequence outgrows
    it. transformers' sliding mask is AND(q - k < window, OR(causal, same image run))
    (masking_utils.sliding_window_overlay and blockwise_overlay), so an image token sees its run's
    later tokens whatever the window. SDPA in the model dtype."""
    length = q.shape[2]
    if window is None or length <= window:
        return (image_block_attention(q, k, v, image) if image is not None
                else causal_attention(q, k, v))
    rows = torch.arange(length, device=q.device)
    near = rows[:, None] - rows[None, :] < window  # [S, S]
    seen = image_blocks(image) if image is not None else (rows[None, :] <= rows[:, None])[None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(seen & near)[:, None],
                                          enable_gqa=q.shape[1] != k.shape[1])


def windowed_suffix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: PrefixKV,
                              layer: int, runs: list[tuple[int, int, int]],
                              window: int) -> torch.Tensor:
    """Question suffixes [B, Hq, S, D] against their prefixes on a sliding layer the sequence
    outgrows: suffix token j (sequence index P + j) sees prefix key p where P + j - p < window and
    its own key i <= j where j - i < window. Explicit, in fp32, as the prefix kernel's reference;
    runs: (prefix, first row, end row)."""
    length, p = q.shape[2], prefix.length
    rows = torch.arange(length, device=q.device)
    own = (rows[None, :] <= rows[:, None]) & (rows[:, None] - rows[None, :] < window)  # [S, S]
    near = p + rows[:, None] - torch.arange(p, device=q.device)[None, :] < window  # [S, P]
    return torch.cat([masked_attention(q[a:e], prefix.keys[layer][g], prefix.values[layer][g],
                                       k[a:e], v[a:e], own.expand(e - a, -1, -1),
                                       prefix_valid=near.expand(e - a, -1, -1))
                      for g, a, e in runs])


def edited_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, image: torch.Tensor,
                            edit: AttentionEdit, blocks: bool = False) -> torch.Tensor:
    """Causal attention of whole prompts with the image keys' logits edited (per query head) as seen
    from every query after the row's last image token; explicit, in fp32 (the softmax's dtype in
    transformers' eager attention). q [B, Hq, S, D], k/v [B, Hkv, S, D], image [B, S]; with blocks,
    each image run's tokens see each other both ways (image_blocks)."""
    b, hq, length, d = q.shape
    group = hq // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.float() @ kf.transpose(-1, -2) / math.sqrt(d)  # [B, Hq, S, S]
    columns = torch.arange(length, device=q.device)
    last_image = torch.where(image, columns, -1).amax(dim=1)  # [B]
    after = (columns[None] > last_image[:, None])[:, None, :, None]  # queries after the image
    edited = edit.apply(scores, lambda x: x.view(1, hq, 1, 1))
    scores = torch.where(after & image[:, None, None, :], edited, scores)
    causal = image_blocks(image)[:, None] if blocks else columns[None, :] <= columns[:, None]
    scores = scores.masked_fill(~causal, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).to(q.dtype)


def kept_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kept: torch.Tensor,
                          image: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of whole prompts in which every query sees only the kept keys (kept [B, S]
    bool) and itself: a dropped token is gone for every later query, as if removed from the sequence
    at its own position (a dropped row still sees itself, so that no softmax is empty; nothing reads
    it). Explicit, in fp32; with image [B, S], each image run's tokens see each other both ways
    (image_blocks)."""
    b, hq, length, d = q.shape
    group = hq // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.float() @ kf.transpose(-1, -2) / math.sqrt(d)  # [B, Hq, S, S]
    eye = torch.eye(length, dtype=torch.bool, device=q.device)
    seen = image_blocks(image) if image is not None else torch.ones_like(eye).tril()
    scores = scores.masked_fill(~(seen & (kept[:, None, :] | eye))[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).to(q.dtype)


def key_scaled_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                scale: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Causal attention of whole prompts in which each query of `queries` [B, S] bool multiplies
    every key's attention logit (q.k / sqrt(d), before the mask) by that key's factor in scale
    [B, S] (ClearSight's VAF); the other queries attend as they are. Explicit, in fp32."""
    b, hq, length, d = q.shape
    group = hq // k.shape[1]
    kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.float() @ kf.transpose(-1, -2) / math.sqrt(d)  # [B, Hq, S, S]
    # [B, S(query), S(key)]
    factor = torch.where(queries[:, :, None], scale[:, None, :].float(), 1.0)
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = (scores * factor[:, None]).masked_fill(~causal, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).to(q.dtype)


def answer_key_attention(q: torch.Tensor, lengths: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[B, Hq, S] fp32: each whole prompt's answer-position (last valid query) attention weights
    over every key, as transformers' eager attention returns them (softmax in fp32); the per-key
    form of the probe's image sum (answer_image_attention). q [B, Hq, S, D] (RoPE applied), lengths
    [B], k [B, Hkv, S, D]."""
    batch, q_heads, length, head_dim = q.shape
    kv_heads = k.shape[1]
    rows = torch.arange(batch, device=q.device)
    last = q[rows, :, lengths - 1].float().view(batch, kv_heads, q_heads // kv_heads, head_dim)
    last = last * head_dim**-0.5
    scores = last @ k.float().transpose(-1, -2)  # [B, Hkv, g, S]
    valid = torch.arange(length, device=q.device)[None, :] < lengths[:, None]
    scores = scores.masked_fill(~valid[:, None, None], float("-inf"))
    return torch.softmax(scores, dim=-1).view(batch, q_heads, length)


def masked_attention(q, k_prefix, v_prefix, k_own, v_own, valid, edit: AttentionEdit | None = None,
                     prefix_image: torch.Tensor | None = None,
                     own_image: torch.Tensor | None = None,
                     prefix_valid: torch.Tensor | None = None):
    """Attention over each row's prefix plus its own keys, in fp32 (a decode step, an answer row).

    q [B, Hq, T, D]; k/v_prefix [Hkv, P, D], shared by the rows and broadcast, never copied per row
    (P may be 0); k/v_own [B, Hkv, K, D]; valid [B, T, K] marks which own keys each query may see,
    and prefix_valid [B, T, P] which prefix keys (None: all; a sliding window's narrows both). With
    an edit, the logits of the image keys (prefix_image [P], own_image [B, K]) are edited.
    """
    b, hq, t, d = q.shape
    k_prefix, v_prefix = k_prefix[None], v_prefix[None]
    hkv = k_own.shape[1]
    g = hq // hkv
    qf = q.float().reshape(b, hkv, g * t, d) / math.sqrt(d)
    scores_p = qf @ k_prefix.float().transpose(-1, -2)  # [B, Hkv, gT, P]
    scores_o = qf @ k_own.float().transpose(-1, -2)  # [B, Hkv, gT, K]
    if edit is not None:
        def heads(x):  # [Hq] → [1, Hkv, g * T, 1], as the queries are laid out
            return x.view(hkv, g, 1).expand(hkv, g, t).reshape(1, hkv, g * t, 1)

        scores_p = torch.where(prefix_image[None, None, None], edit.apply(scores_p, heads),
                               scores_p)
        scores_o = torch.where(own_image[:, None, None], edit.apply(scores_o, heads), scores_o)
    def per_query(m):  # [B, T, N] → [B, 1, g * T, N], as the queries are laid out
        return m[:, None, None].expand(b, 1, g, t, m.shape[-1]).reshape(b, 1, g * t, -1)

    scores_o = scores_o.masked_fill(~per_query(valid), float("-inf"))
    if prefix_valid is not None:
        scores_p = scores_p.masked_fill(~per_query(prefix_valid), float("-inf"))
    probs = torch.softmax(torch.cat([scores_p, scores_o], dim=-1), dim=-1)
    p = k_prefix.shape[2]
    out = probs[..., :p] @ v_prefix.float() + probs[..., p:] @ v_own.float()
    return out.reshape(b, hq, t, d).to(q.dtype)


def suffix_attention(q, k, v, batch: TokenBatch, prefix: PrefixKV | None, runs: PrefixRuns | None,
                     layer: int, edit: AttentionEdit | None, backend: str,
                     image_bidirectional: bool = False, window: int | None = None) -> torch.Tensor:
    """One layer's attention of a suffix batch [B, Hq, S, D]: every row's queries over its prefix
    (one fused call for every image's rows: each run reads its prefix once) and causally over its
    own keys, or whole prompts causally; an edit of every query is applied inside, an answer-only
    one by recomputing each row's answer position. With image_bidirectional, a whole prompt's image
    tokens see each other both ways (a suffix's own tokens are text: its image lies in the prefix,
    prefilled so). On a sliding layer (window) that the rows outgrow, every query attends within the
    window; no edit acts there."""
    every = edit if edit is not None and not edit.answer_only else None
    seen = q.shape[2] + (prefix.length if prefix is not None else 0)
    if window is not None and seen > window:
        if edit is not None:
            raise NotImplementedError(f"an attention edit of a {seen}-token prompt past the "
                                      f"sliding window of {window} tokens (edits read whole "
                                      "prompts within the window only)")
        if prefix is not None:
            return windowed_suffix_attention(q, k, v, prefix, layer, runs.runs, window)
        return prompt_attention(q, k, v, batch.image_mask if image_bidirectional else None, window)
    if prefix is not None:
        key_edit = None if every is None or prefix.image_mask is None else \
            (prefix.image_mask, every.scale, every.bias)
        attn = prefix_attention(q, prefix.keys[layer], prefix.values[layer], k, v, batch.lengths,
                                backend=backend, prefix_index=runs, key_edit=key_edit)
    elif every is not None and batch.image_mask is not None:
        attn = edited_causal_attention(q, k, v, batch.image_mask, every, blocks=image_bidirectional)
    elif image_bidirectional and batch.image_mask is not None:
        attn = image_block_attention(q, k, v, batch.image_mask)
    else:
        attn = causal_attention(q, k, v)
    if edit is not None and edit.answer_only:
        attn = _answer_row(attn, q, k, v, batch, prefix, runs, layer, edit)
    return attn


def _answer_row(attn, q, k, v, batch: TokenBatch, prefix: PrefixKV | None, runs: PrefixRuns | None,
                layer: int, edit: AttentionEdit) -> torch.Tensor:
    """attn with each row's answer position (its last token) recomputed under an answer-only edit:
    one query per row against its prefix and own keys, as a decode step is."""
    b, s = batch.ids.shape
    rows = torch.arange(b, device=q.device)
    last = batch.lengths - 1
    valid = (torch.arange(s, device=q.device)[None] < batch.lengths[:, None])[:, None]  # [B, 1, S]
    own_image = batch.image_mask if batch.image_mask is not None else \
        torch.zeros(b, s, dtype=torch.bool, device=q.device)
    query = q[rows, :, last][:, :, None]  # [B, Hq, 1, D]
    empty = k.new_zeros(k.shape[1], 0, k.shape[3])
    out = []
    for g, a, e in runs.runs if prefix is not None else [(None, 0, b)]:
        kp, vp = (prefix.keys[layer][g], prefix.values[layer][g]) if g is not None else \
            (empty, empty)
        image = prefix.image_keys(g) if g is not None else \
            torch.zeros(0, dtype=torch.bool, device=q.device)
        out.append(masked_attention(query[a:e], kp, vp, k[a:e], v[a:e], valid[a:e], edit, image,
                                    own_image[a:e]))
    attn = attn.clone()
    attn[rows, :, last] = torch.cat(out)[:, :, 0]
    return attn


def probe_attention(q, k, batch: TokenBatch, prefix: PrefixKV | None, runs: PrefixRuns | None,
                    layer: int, edit: AttentionEdit | None) -> torch.Tensor:
    """The image-attention probe of one layer [B, Hq]: how much of each row's answer-position
    attention falls on image keys (its prefix's and its own), under the layer's edit."""
    if prefix is None:
        return answer_image_attention(q, batch.lengths, k, batch.image_mask, edit=edit)
    image = prefix.image_mask if prefix.image_mask is not None else \
        torch.zeros(prefix.keys[layer].shape[0], prefix.length, dtype=torch.bool, device=q.device)
    return answer_image_attention(q, batch.lengths, k, batch.image_mask, prefix.keys[layer], image,
                                  runs.runs, edit=edit)


def answer_image_attention(q: torch.Tensor, lengths: torch.Tensor, k_own: torch.Tensor,
                           own_image: torch.Tensor | None, k_prefix: torch.Tensor | None = None,
                           prefix_image: torch.Tensor | None = None,
                           runs: list[tuple[int, int, int]] | None = None,
                           edit: AttentionEdit | None = None) -> torch.Tensor:
    """[B, Hq] fp32: each row's attention mass on image keys at its last valid query.

    Taken from the queries and keys the layer already computed, for the answer row only: one query
    per prompt against its keys ([B, Hq, P + S] scores, never a [sequence, sequence] matrix), in
    fp32 as transformers' eager attention takes its softmax, and the same whichever backend ran the
    attention. q [B, Hq, S, D] (RoPE applied); lengths [B]; k_own [B, Hkv, S, D] the rows' own keys,
    own_image [B, S] marking image keys among them (None: none); k_prefix [G, Hkv, P, D] with
    prefix_image [G, P] and runs (prefix, first row, end row) when the rows continue prefixes."""
    batch, q_heads, length, head_dim = q.shape
    kv_heads = k_own.shape[1]
    group = q_heads // kv_heads
    rows = torch.arange(batch, device=q.device)
    last = q[rows, :, lengths - 1].float().view(batch, kv_heads, group, head_dim) * head_dim**-0.5
    own = last @ k_own.float().transpose(-1, -2)  # [B, Hkv, g, S]
    valid = torch.arange(length, device=q.device)[None, :] < lengths[:, None]  # [B, S]
    own = own.masked_fill(~valid[:, None, None], float("-inf"))
    image = own_image if own_image is not None else \
        torch.zeros(batch, length, dtype=torch.bool, device=q.device)
    if k_prefix is not None:
        # [B, Hkv, g, P]
        prefix = torch.cat([last[a:e] @ k_prefix[g].float().transpose(-1, -2) for g, a, e in runs])
        own = torch.cat([prefix, own], dim=-1)
        image = torch.cat([torch.cat([prefix_image[g].expand(e - a, -1) for g, a, e in runs]),
                           image], dim=-1)
    if edit is not None:
        own = torch.where(image[:, None, None],
                          edit.apply(own, lambda x: x.view(kv_heads, group, 1)), own)
    probs = torch.softmax(own, dim=-1)
    return (probs * image[:, None, None]).sum(-1).view(batch, q_heads)
