"""Attention of a batch of question suffixes over their image's prefix plus their own tokens.

Each question b has suffix_lens[b] valid query positions i; query i attends to all P keys of its
prefix (one shared by the whole batch, or prefix_index[b] of several, already RoPE'd) and causally
to its own suffix keys 0..i: softmax over the concatenation [prefix ; suffix[:i+1]], exactly SDPA
over each concatenated sequence. Questions come grouped by prefix (a run of rows per prefix).

The kernel packs the queries of every question and every query head of one KV head into the rows
of one tile set (row = (question, head in group, position)), so the prefix K/V of a KV head is read
once per row tile for the whole batch instead of once per question, and the online softmax then
continues over each row's own suffix keys: the prefix and suffix parts merge by log-sum-exp in
registers. Several prefixes are one launch: a third grid axis walks the runs. Padded query rows
(i >= suffix_lens[b]) come out as zeros; padded suffix keys and queries are never read, so they
cannot touch valid rows.

The reference, the CPU's batched torch path and the runs of rows grouped by prefix are in
prefix_attention_torch.py.
"""
import math

import torch

from .common import dot_dtype, on_gpu, resolve_backend, round_to, tl, tl_dtype, triton
from .prefix_attention_torch import PrefixRuns, prefix_attention_ref, prefix_attention_torch

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _online_softmax_step(q, k, v, allowed, m_i, l_i, acc, scale_log2e, DOT_DTYPE: tl.constexpr,
                         marked, row_scale, row_bias, EDIT: tl.constexpr):
    """One key block of the flash-attention recurrence (base-2 exponentials); with EDIT the marked
    keys' logits become row_scale * s + row_bias (row_bias in base-2 units)."""
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2e
    if EDIT:
        s = tl.where(marked[None, :], s * row_scale[:, None] + row_bias[:, None], s)
    s = tl.where(allowed, s, float("-inf"))
    # m_i starts finite (-1e30), so a row with every key masked keeps alpha = 1 and p = 0
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _prefix_attention_kernel(
    q_ptr, k_prefix_ptr, v_prefix_ptr, k_suffix_ptr, v_suffix_ptr, lens_ptr, runs_ptr, out_ptr,
    marked_ptr, head_scale_ptr, head_bias_ptr,
    stride_qb, stride_qh, stride_qs,
    stride_kpg, stride_kph, stride_kpp, stride_vpg, stride_vph, stride_vpp,
    stride_ksb, stride_ksh, stride_kss, stride_vsb, stride_vsh, stride_vss,
    stride_ob, stride_oh, stride_os,
    S, P, D, scale_log2e,
    GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EDIT: tl.constexpr,
):
    kv_head = tl.program_id(1)
    # this program's run: rows [run_start, run_end) continue prefix run_prefix
    # (runs_ptr: int32 [R, 3])
    run_prefix = tl.load(runs_ptr + tl.program_id(2) * 3)
    run_start = tl.load(runs_ptr + tl.program_id(2) * 3 + 1)
    run_end = tl.load(runs_ptr + tl.program_id(2) * 3 + 2)
    rows_per_question = GROUP * S
    if tl.program_id(0) * BLOCK_M >= (run_end - run_start) * rows_per_question:
        return  # the grid is sized for the longest run
    k_prefix_ptr += run_prefix.to(tl.int64) * stride_kpg
    v_prefix_ptr += run_prefix.to(tl.int64) * stride_vpg
    # packed (question, head in group, position)
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    question = run_start + row // rows_per_question
    head = kv_head * GROUP + (row // S) % GROUP
    position = row % S
    row_in = question < run_end
    length = tl.load(lens_ptr + question, mask=row_in, other=0)
    valid = row_in & (position < length)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D

    q = tl.load(
        q_ptr + question[:, None] * stride_qb + head[:, None] * stride_qh
        + position[:, None] * stride_qs + d[None, :],
        mask=valid[:, None] & d_mask[None, :], other=0.0,
    ).to(DOT_DTYPE)
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    row_scale = tl.full((BLOCK_M,), 1.0, dtype=tl.float32)
    row_bias = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if EDIT:  # each row's head's edit of the marked keys' logits; the bias in base-2 units
        row_scale = tl.load(head_scale_ptr + head, mask=row_in, other=1.0)
        row_bias = tl.load(head_bias_ptr + head, mask=row_in, other=0.0) * 1.4426950408889634

    # the shared prefix: one pass over its keys serves every question in this row tile
    for p0 in range(0, P, BLOCK_N):
        key = p0 + tl.arange(0, BLOCK_N)
        kv_mask = (key < P)[:, None] & d_mask[None, :]
        k = tl.load(k_prefix_ptr + kv_head * stride_kph + key[:, None] * stride_kpp + d[None, :],
                    kv_mask, other=0.0)
        v = tl.load(v_prefix_ptr + kv_head * stride_vph + key[:, None] * stride_vpp + d[None, :],
                    kv_mask, other=0.0)
        marked = key < 0
        if EDIT:
            marked = tl.load(marked_ptr + run_prefix.to(tl.int64) * P + key, mask=key < P,
                             other=0) != 0
        m_i, l_i, acc = _online_softmax_step(
            q, k.to(DOT_DTYPE), v.to(DOT_DTYPE), (key < P)[None, :], m_i, l_i, acc, scale_log2e,
            DOT_DTYPE, marked, row_scale, row_bias, EDIT
        )

    # each question's own keys, causally; a tile holds the rows of a few consecutive questions
    first_question = run_start + (tl.program_id(0) * BLOCK_M) // rows_per_question
    last_row = tl.program_id(0) * BLOCK_M + BLOCK_M - 1
    last_question = min(run_start + last_row // rows_per_question, run_end - 1)
    for other in range(first_question, last_question + 1):
        other_length = tl.load(lens_ptr + other)
        for t0 in range(0, other_length, BLOCK_N):
            key = t0 + tl.arange(0, BLOCK_N)
            key_in = key < other_length
            kv_mask = key_in[:, None] & d_mask[None, :]
            k = tl.load(
                k_suffix_ptr + other * stride_ksb + kv_head * stride_ksh
                + key[:, None] * stride_kss + d[None, :],
                mask=kv_mask, other=0.0,
            )
            v = tl.load(
                v_suffix_ptr + other * stride_vsb + kv_head * stride_vsh
                + key[:, None] * stride_vss + d[None, :],
                mask=kv_mask, other=0.0,
            )
            allowed = ((question == other)[:, None] & (key[None, :] <= position[:, None])
                       & key_in[None, :])
            m_i, l_i, acc = _online_softmax_step(
                q, k.to(DOT_DTYPE), v.to(DOT_DTYPE), allowed, m_i, l_i, acc, scale_log2e, DOT_DTYPE,
                key < 0, row_scale, row_bias, False
            )

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out = tl.where(valid[:, None], out, 0.0)
    out_row = out_ptr + question * stride_ob + head * stride_oh + position * stride_os
    tl.store(out_row[:, None] + d[None, :], round_to(out, OUT_DTYPE),
             mask=row_in[:, None] & d_mask[None, :])


def prefix_attention(
    q: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    k_suffix: torch.Tensor,
    v_suffix: torch.Tensor,
    suffix_lens: torch.Tensor,
    scale: float | None = None,
    backend: str = "auto",
    *,
    prefix_index: "list[int] | PrefixRuns | None" = None,
    out: torch.Tensor | None = None,
    key_edit: "tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None" = None,
) -> torch.Tensor:
    """[B, Hq, S, D] attention output in q's dtype.

    key_edit (marked [G, P] bool, scale [Hq], bias [Hq]): the scaled logits of the marked prefix
    keys become scale * logit + bias for every query (an attention intervention on image keys).

    q: [B, Hq, S, D] (S = longest suffix; rows past suffix_lens[b] are padding); k_prefix and
    v_prefix: [Hkv, P, D] shared by every row, or [G, Hkv, P, D] with prefix_index, B host ints in
    [0, G) naming each row's prefix, rows grouped by prefix (a list, so the runs are known without a
    device sync; or a PrefixRuns of it, built once for every layer of a batch); k_suffix and
    v_suffix: [B, Hkv, S, D]; suffix_lens: [B] ints in [0, S] (checked on the host except on CUDA,
    where that would sync); Hq = Hkv * g. Any D works: tiles pad it to a power of two >= 16 for
    tl.dot.
    """
    k_prefix, v_prefix, runs, grouped = _checked(q, k_prefix, v_prefix, k_suffix, v_suffix,
                                                 suffix_lens, prefix_index, out)
    head_dim, prefix_len = q.shape[3], k_prefix.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    if resolve_backend(backend, q.device) == "torch":
        if not runs:
            result = torch.zeros_like(q)
        elif prefix_len == 0:  # nothing to merge: the reference's plain softmax over the own keys
            result = prefix_attention_ref(q, k_prefix[0], v_prefix[0], k_suffix, v_suffix,
                                          suffix_lens, scale)
        else:
            result = prefix_attention_torch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens,
                                            scale, runs, key_edit)
        return result if out is None else out.copy_(result)
    return _launch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, runs, grouped,
                   out, key_edit)


def _checked(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_index, out):
    """The inputs checked (ValueError/TypeError naming the one that is wrong); k/v_prefix as
    [G, Hkv, P, D], the runs (prefix, first row, end row) and the PrefixRuns (None for one shared
    prefix)."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, Hq, S, D], got {tuple(q.shape)}")
    batch, q_heads, length, head_dim = q.shape
    shared = ("[Hkv, P, D]" if prefix_index is None
              else "[G, Hkv, P, D] (one per prefix_index value)")
    if k_prefix.dim() != (3 if prefix_index is None else 4) or v_prefix.shape != k_prefix.shape \
            or k_prefix.shape[-1] != head_dim:
        raise ValueError(f"k_prefix and v_prefix must both be {shared} with D = {head_dim}, "
                         f"got {tuple(k_prefix.shape)} and {tuple(v_prefix.shape)}")
    grouped = None
    if prefix_index is None:
        k_prefix, v_prefix, runs = k_prefix[None], v_prefix[None], [(0, 0, batch)] if batch else []
    else:
        grouped = (prefix_index if isinstance(prefix_index, PrefixRuns)
                   else PrefixRuns(prefix_index, q.device))
        if len(grouped.index) != batch \
                or any(not 0 <= g < k_prefix.shape[0] for g in grouped.index):
            raise ValueError(f"prefix_index must hold {batch} ints in [0, {k_prefix.shape[0]})")
        runs = grouped.runs
    kv_heads, prefix_len = k_prefix.shape[1:3]
    if k_suffix.shape != (batch, kv_heads, length, head_dim) or v_suffix.shape != k_suffix.shape:
        raise ValueError(f"k_suffix and v_suffix must both be [{batch}, {kv_heads}, "
                         f"{length}, {head_dim}]")
    if q_heads % kv_heads:
        raise ValueError(f"Hq = {q_heads} is not a multiple of Hkv = {kv_heads}")
    tensors = (q, k_prefix, v_prefix, k_suffix, v_suffix)
    if q.dtype not in INPUT_DTYPES or any(t.dtype != q.dtype for t in tensors):
        raise TypeError("q, k and v must share one dtype among fp16, bf16, fp32")
    if any(t.device != q.device for t in (*tensors, suffix_lens)):
        raise ValueError(f"every input must be on {q.device}")
    if suffix_lens.shape != (batch,) or suffix_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"suffix_lens must be an int32/int64 [{batch}] tensor")
    if q.device.type != "cuda" and batch and (int(suffix_lens.min()) < 0
                                              or int(suffix_lens.max()) > length):
        raise ValueError(f"suffix_lens must lie in [0, {length}]")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(3) != 1):
        raise ValueError(f"out must be a {q.dtype} tensor of q's shape with unit stride along D")
    return k_prefix, v_prefix, runs, grouped


def _launch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, runs, grouped, out,
            key_edit):
    """The Triton kernel over every run of rows in one launch."""
    _, q_heads, length, head_dim = q.shape
    kv_heads, prefix_len = k_prefix.shape[1:3]
    tensors = (q, k_prefix, v_prefix, k_suffix, v_suffix)
    q, k_prefix, v_prefix, k_suffix, v_suffix = (t if t.stride(-1) == 1 else t.contiguous()
                                                 for t in tensors)
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    if not runs:
        return out
    group = q_heads // kv_heads
    gpu = on_gpu(q.device)
    # GPU: 64 packed rows x 64 keys per step, D up to 128 in registers (the FlashAttention-2 tile
    # for these head sizes); the interpreter takes 16 x 16 so that small tests cross tiles.
    block_m, block_n = (64, 64) if gpu else (16, 16)
    block_d = max(16, triton.next_power_of_2(head_dim))
    widest = max(e - a for _, a, e in runs)
    run_table = grouped.table() if grouped is not None else \
        torch.tensor(runs, dtype=torch.int32).to(q.device, non_blocking=True)  # [R, 3]
    grid = (triton.cdiv(widest * group * length, block_m), kv_heads, len(runs))
    if grid[0]:
        marked, head_scale, head_bias = (
            (key_edit[0].to(torch.int8).contiguous(), key_edit[1].float().contiguous(),
             key_edit[2].float().contiguous()) if key_edit is not None else (out,) * 3)
        _prefix_attention_kernel[grid](
            q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens.contiguous(), run_table, out,
            marked, head_scale, head_bias,
            q.stride(0), q.stride(1), q.stride(2),
            k_prefix.stride(0), k_prefix.stride(1), k_prefix.stride(2),
            v_prefix.stride(0), v_prefix.stride(1), v_prefix.stride(2),
            k_suffix.stride(0), k_suffix.stride(1), k_suffix.stride(2),
            v_suffix.stride(0), v_suffix.stride(1), v_suffix.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            length, prefix_len, head_dim, scale * math.log2(math.e),
            GROUP=group, DOT_DTYPE=tl_dtype(dot_dtype(q.dtype)), OUT_DTYPE=tl_dtype(q.dtype),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, EDIT=key_edit is not None,
            num_warps=4, num_stages=2 if gpu else 1, enable_fp_fusion=True,
        )
    return out
