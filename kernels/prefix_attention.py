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

Without a kernel (CPU) the torch path computes the same softmax in a few batched ops for all runs
at once (rows padded to the longest run), not one reference call per prefix.
"""
import math

import torch

from .common import dot_dtype, on_gpu, resolve_backend, round_to, tl, tl_dtype, triton

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def prefix_attention_ref(
    q: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    k_suffix: torch.Tensor,
    v_suffix: torch.Tensor,
    suffix_lens: torch.Tensor,
    scale: float | None = None,
    prefix_index: list[int] | None = None,
    key_edit: "tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None" = None,
) -> torch.Tensor:
    """[B, Hq, S, D] in q's dtype: explicit fp32 softmax over [prefix ; causal suffix] per row;
    with prefix_index, k/v_prefix are [G, Hkv, P, D] and each run of rows takes its own prefix;
    key_edit as prefix_attention's (marked [G, P], or [P] without prefix_index)."""
    if prefix_index is not None:
        outs = [_one_prefix_ref(q[a:e], k_prefix[g], v_prefix[g], k_suffix[a:e], v_suffix[a:e], suffix_lens[a:e],
                                scale, None if key_edit is None else (key_edit[0][g], *key_edit[1:]))
                for g, a, e in prefix_runs(prefix_index)]
        return torch.cat(outs) if outs else torch.zeros_like(q)
    return _one_prefix_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, key_edit)


def prefix_runs(prefix_index: list[int]) -> list[tuple[int, int, int]]:
    """[0, 0, 1, 1, 1] → [(0, 0, 2), (1, 2, 5)]: (prefix, first row, end row) per run; raises unless
    rows are grouped by prefix."""
    runs: list[tuple[int, int, int]] = []
    for row, g in enumerate(prefix_index):
        if runs and runs[-1][0] == g:
            runs[-1] = (g, runs[-1][1], row + 1)
        else:
            if any(r[0] == g for r in runs):
                raise ValueError("rows must be grouped by prefix (prefix_index has a prefix in two runs)")
            runs.append((g, row, row + 1))
    return runs


class PrefixRuns:
    """A batch's rows grouped by prefix, worked out once for all its layers: the (prefix, first row,
    end row) runs, and (on first use) their int32 table on the device for the kernel, instead of a
    Python pass over the rows and a host-to-device copy in every layer's call."""

    def __init__(self, prefix_index: list[int], device: torch.device | str):
        self.index = list(prefix_index)
        self.runs = prefix_runs(self.index)
        self.device = torch.device(device)
        self._table: torch.Tensor | None = None

    def table(self) -> torch.Tensor:
        if self._table is None:
            self._table = torch.tensor(self.runs, dtype=torch.int32).to(self.device, non_blocking=True)  # [R, 3]
        return self._table


def _one_prefix_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, key_edit=None):
    batch, q_heads, length, head_dim = q.shape
    group = q_heads // k_prefix.shape[0]
    scale = head_dim**-0.5 if scale is None else scale
    lens = suffix_lens.to(q.device).long()
    position = torch.arange(length, device=q.device)
    valid = position[None, :] < lens[:, None]  # [B, S]: real tokens, queries and keys alike

    def expand_heads(t, dim):  # GQA: query head h reads KV head h // group (transformers' repeat_kv)
        return t.float().repeat_interleave(group, dim=dim) if group > 1 else t.float()

    k_p, v_p = expand_heads(k_prefix, 0), expand_heads(v_prefix, 0)  # [Hq, P, D]
    zero_pads = valid[:, None, :, None]
    k_s = torch.where(zero_pads, expand_heads(k_suffix, 1), 0.0)  # [B, Hq, S, D]
    v_s = torch.where(zero_pads, expand_heads(v_suffix, 1), 0.0)
    q32 = torch.where(zero_pads, q.float(), 0.0)
    scores_p = q32 @ k_p.transpose(-1, -2) * scale
    if key_edit is not None:  # [P] marked keys: scale * logit + bias per query head
        marked, head_scale, head_bias = key_edit
        edited = scores_p * head_scale.float().view(1, -1, 1, 1) + head_bias.float().view(1, -1, 1, 1)
        scores_p = torch.where(marked.view(1, 1, 1, -1), edited, scores_p)
    scores = torch.cat([scores_p, q32 @ k_s.transpose(-1, -2) * scale], dim=-1)
    causal = position[None, :] <= position[:, None]  # [S, S]: key t visible from query i when t <= i
    allowed = torch.cat(
        [torch.ones(batch, length, k_prefix.shape[1], dtype=torch.bool, device=q.device),
         causal[None] & valid[:, None, :]],
        dim=-1,
    )  # [B, S, P + S]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = probs[..., : k_prefix.shape[1]] @ v_p + probs[..., k_prefix.shape[1]:] @ v_s
    return torch.where(zero_pads, out, 0.0).to(q.dtype)


def _prefix_attention_torch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, runs, key_edit=None):
    """The reference's values in batched fp32 ops for every run at once. k/v_prefix [G, Hkv, P, D];
    runs from prefix_runs. The prefix and suffix softmaxes are computed apart and merged by their
    maxima and sums, so no [prefix ; suffix] score tensor is concatenated per row."""
    batch, q_heads, length, head_dim = q.shape
    kv_heads, prefix_len = k_prefix.shape[1:3]
    group = q_heads // kv_heads
    lens = suffix_lens.to(q.device).long()
    position = torch.arange(length, device=q.device)
    valid = position[None, :] < lens[:, None]  # [B, S]
    qf = torch.where(valid[:, None, :, None], q.float(), 0.0) * scale  # padded rows may hold NaN

    # Prefix part: rows of each run padded to the longest run, [R, Hkv, rows * group * S, D] @ [R, Hkv, D, P].
    widest = max(e - a for _, a, e in runs)
    slot = torch.full((len(runs) * widest,), batch, device=q.device)  # row `batch` is all zeros
    for r, (_, a, e) in enumerate(runs):
        slot[r * widest:r * widest + e - a] = torch.arange(a, e, device=q.device)
    rows = torch.cat([qf, qf.new_zeros(1, q_heads, length, head_dim)])[slot]  # [R * W, Hq, S, D]
    rows = rows.view(len(runs), widest, kv_heads, group * length, head_dim).transpose(1, 2)
    rows = rows.reshape(len(runs), kv_heads, widest * group * length, head_dim)
    prefixes = [g for g, _, _ in runs]
    if prefixes == list(range(prefixes[0], prefixes[-1] + 1)):  # the usual case: views, no copies
        k_p, v_p = k_prefix[prefixes[0]:prefixes[-1] + 1], v_prefix[prefixes[0]:prefixes[-1] + 1]
    else:
        k_p, v_p = k_prefix[prefixes], v_prefix[prefixes]
    scores = rows @ k_p.float().transpose(-1, -2)  # [R, Hkv, W * g * S, P]
    if key_edit is not None:  # scale * s + bias on the marked prefix keys, per query head
        marked, head_scale, head_bias = key_edit
        view = scores.view(len(runs), kv_heads, widest, group, length, prefix_len)
        hs, hb = (t.float().view(1, kv_heads, 1, group, 1, 1) for t in (head_scale, head_bias))
        keys = marked[prefixes].view(len(runs), 1, 1, 1, 1, prefix_len)
        scores = torch.where(keys, view * hs + hb, view).view_as(scores)
    max_p = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - max_p)
    sum_p = weights.sum(-1, keepdim=True)
    out_p = weights @ v_p.float()  # [R, Hkv, W * g * S, D], unnormalized

    def to_rows(t):  # [R, Hkv, W * g * S, X] → [B, Hq, S, X] in row order
        t = t.view(len(runs), kv_heads, widest, group * length, -1).transpose(1, 2)
        t = t.reshape(len(runs) * widest, q_heads, length, -1)
        return t[torch.cat([torch.arange(r * widest, r * widest + e - a, device=q.device)
                            for r, (_, a, e) in enumerate(runs)])]

    out_p, max_p, sum_p = to_rows(out_p), to_rows(max_p), to_rows(sum_p)

    # Own part: [B, Hkv, g * S, D] @ [B, Hkv, D, S], causal and within each row's length.
    zero_pads = valid[:, None, :, None]
    k_s = torch.where(zero_pads, k_suffix.float(), 0.0)
    v_s = torch.where(zero_pads, v_suffix.float(), 0.0)
    own = qf.reshape(batch, kv_heads, group * length, head_dim) @ k_s.transpose(-1, -2)
    own = own.view(batch, q_heads, length, length)
    allowed = (position[None, :] <= position[:, None])[None] & valid[:, None, :]  # [B, S (query), S (key)]
    own = own.masked_fill(~allowed[:, None], float("-inf"))
    best = torch.maximum(max_p, own.amax(-1, keepdim=True))  # finite: every row has P >= 1 prefix keys
    prefix_weight = torch.exp(max_p - best)
    own_weights = torch.exp(own - best)
    total = sum_p * prefix_weight + own_weights.sum(-1, keepdim=True)
    own_out = (own_weights.view(batch, kv_heads, group * length, length) @ v_s).view(batch, q_heads, length, head_dim)
    out = (out_p * prefix_weight + own_out) / total
    return torch.where(zero_pads, out, 0.0).to(q.dtype)


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
    # this program's run: rows [run_start, run_end) continue prefix run_prefix (runs_ptr: int32 [R, 3])
    run_prefix = tl.load(runs_ptr + tl.program_id(2) * 3)
    run_start = tl.load(runs_ptr + tl.program_id(2) * 3 + 1)
    run_end = tl.load(runs_ptr + tl.program_id(2) * 3 + 2)
    rows_per_question = GROUP * S
    if tl.program_id(0) * BLOCK_M >= (run_end - run_start) * rows_per_question:
        return  # the grid is sized for the longest run
    k_prefix_ptr += run_prefix.to(tl.int64) * stride_kpg
    v_prefix_ptr += run_prefix.to(tl.int64) * stride_vpg
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # packed (question, head in group, position)
    question = run_start + row // rows_per_question
    head = kv_head * GROUP + (row // S) % GROUP
    position = row % S
    row_in = question < run_end
    length = tl.load(lens_ptr + question, mask=row_in, other=0)
    valid = row_in & (position < length)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D

    q = tl.load(
        q_ptr + question[:, None] * stride_qb + head[:, None] * stride_qh + position[:, None] * stride_qs + d[None, :],
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
        k = tl.load(k_prefix_ptr + kv_head * stride_kph + key[:, None] * stride_kpp + d[None, :], kv_mask, other=0.0)
        v = tl.load(v_prefix_ptr + kv_head * stride_vph + key[:, None] * stride_vpp + d[None, :], kv_mask, other=0.0)
        marked = key < 0
        if EDIT:
            marked = tl.load(marked_ptr + run_prefix.to(tl.int64) * P + key, mask=key < P, other=0) != 0
        m_i, l_i, acc = _online_softmax_step(
            q, k.to(DOT_DTYPE), v.to(DOT_DTYPE), (key < P)[None, :], m_i, l_i, acc, scale_log2e, DOT_DTYPE,
            marked, row_scale, row_bias, EDIT
        )

    # each question's own keys, causally; a tile holds the rows of a few consecutive questions
    first_question = run_start + (tl.program_id(0) * BLOCK_M) // rows_per_question
    last_question = min(run_start + (tl.program_id(0) * BLOCK_M + BLOCK_M - 1) // rows_per_question, run_end - 1)
    for other in range(first_question, last_question + 1):
        other_length = tl.load(lens_ptr + other)
        for t0 in range(0, other_length, BLOCK_N):
            key = t0 + tl.arange(0, BLOCK_N)
            key_in = key < other_length
            kv_mask = key_in[:, None] & d_mask[None, :]
            k = tl.load(
                k_suffix_ptr + other * stride_ksb + kv_head * stride_ksh + key[:, None] * stride_kss + d[None, :],
                mask=kv_mask, other=0.0,
            )
            v = tl.load(
                v_suffix_ptr + other * stride_vsb + kv_head * stride_vsh + key[:, None] * stride_vss + d[None, :],
                mask=kv_mask, other=0.0,
            )
            allowed = (question == other)[:, None] & (key[None, :] <= position[:, None]) & key_in[None, :]
            m_i, l_i, acc = _online_softmax_step(
                q, k.to(DOT_DTYPE), v.to(DOT_DTYPE), allowed, m_i, l_i, acc, scale_log2e, DOT_DTYPE,
                key < 0, row_scale, row_bias, False
            )

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out = tl.where(valid[:, None], out, 0.0)
    out_row = out_ptr + question * stride_ob + head * stride_oh + position * stride_os
    tl.store(out_row[:, None] + d[None, :], round_to(out, OUT_DTYPE), mask=row_in[:, None] & d_mask[None, :])


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

    key_edit (marked [G, P] bool, scale [Hq], bias [Hq]): the scaled logits of the marked prefix keys
    become scale * logit + bias for every query (an attention intervention on image keys).

    q: [B, Hq, S, D] (S = longest suffix; rows past suffix_lens[b] are padding); k_prefix and
    v_prefix: [Hkv, P, D] shared by every row, or [G, Hkv, P, D] with prefix_index, B host ints in
    [0, G) naming each row's prefix, rows grouped by prefix (a list, so the runs are known without a
    device sync; or a PrefixRuns of it, built once for every layer of a batch); k_suffix and v_suffix:
    [B, Hkv, S, D]; suffix_lens: [B] ints in [0, S] (checked on the host except on CUDA, where that would
    sync); Hq = Hkv * g. Any D works: tiles pad it to a power of two >= 16 for tl.dot.
    """
    k_prefix, v_prefix, runs, grouped = _checked(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_index,
                                                 out)
    head_dim, prefix_len = q.shape[3], k_prefix.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    if resolve_backend(backend, q.device) == "torch":
        if not runs:
            result = torch.zeros_like(q)
        elif prefix_len == 0:  # nothing to merge: the reference's plain softmax over the own keys
            result = prefix_attention_ref(q, k_prefix[0], v_prefix[0], k_suffix, v_suffix, suffix_lens, scale)
        else:
            result = _prefix_attention_torch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, runs,
                                             key_edit)
        return result if out is None else out.copy_(result)
    return _launch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, runs, grouped, out, key_edit)


def _checked(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, prefix_index, out):
    """The inputs checked (ValueError/TypeError naming the one that is wrong); k/v_prefix as [G, Hkv, P, D],
    the runs (prefix, first row, end row) and the PrefixRuns (None for one shared prefix)."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, Hq, S, D], got {tuple(q.shape)}")
    batch, q_heads, length, head_dim = q.shape
    shared = "[Hkv, P, D]" if prefix_index is None else "[G, Hkv, P, D] (one per prefix_index value)"
    if k_prefix.dim() != (3 if prefix_index is None else 4) or v_prefix.shape != k_prefix.shape \
            or k_prefix.shape[-1] != head_dim:
        raise ValueError(f"k_prefix and v_prefix must both be {shared} with D = {head_dim}, "
                         f"got {tuple(k_prefix.shape)} and {tuple(v_prefix.shape)}")
    grouped = None
    if prefix_index is None:
        k_prefix, v_prefix, runs = k_prefix[None], v_prefix[None], [(0, 0, batch)] if batch else []
    else:
        grouped = prefix_index if isinstance(prefix_index, PrefixRuns) else PrefixRuns(prefix_index, q.device)
        if len(grouped.index) != batch or any(not 0 <= g < k_prefix.shape[0] for g in grouped.index):
            raise ValueError(f"prefix_index must hold {batch} ints in [0, {k_prefix.shape[0]})")
        runs = grouped.runs
    kv_heads, prefix_len = k_prefix.shape[1:3]
    if k_suffix.shape != (batch, kv_heads, length, head_dim) or v_suffix.shape != k_suffix.shape:
        raise ValueError(f"k_suffix and v_suffix must both be [{batch}, {kv_heads}, {length}, {head_dim}]")
    if q_heads % kv_heads:
        raise ValueError(f"Hq = {q_heads} is not a multiple of Hkv = {kv_heads}")
    tensors = (q, k_prefix, v_prefix, k_suffix, v_suffix)
    if q.dtype not in INPUT_DTYPES or any(t.dtype != q.dtype for t in tensors):
        raise TypeError("q, k and v must share one dtype among fp16, bf16, fp32")
    if any(t.device != q.device for t in (*tensors, suffix_lens)):
        raise ValueError(f"every input must be on {q.device}")
    if suffix_lens.shape != (batch,) or suffix_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"suffix_lens must be an int32/int64 [{batch}] tensor")
    if q.device.type != "cuda" and batch and (int(suffix_lens.min()) < 0 or int(suffix_lens.max()) > length):
        raise ValueError(f"suffix_lens must lie in [0, {length}]")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(3) != 1):
        raise ValueError(f"out must be a {q.dtype} tensor of q's shape with unit stride along D")
    return k_prefix, v_prefix, runs, grouped


def _launch(q, k_prefix, v_prefix, k_suffix, v_suffix, suffix_lens, scale, runs, grouped, out, key_edit):
    """The Triton kernel over every run of rows in one launch."""
    _, q_heads, length, head_dim = q.shape
    kv_heads, prefix_len = k_prefix.shape[1:3]
    tensors = (q, k_prefix, v_prefix, k_suffix, v_suffix)
    q, k_prefix, v_prefix, k_suffix, v_suffix = (t if t.stride(-1) == 1 else t.contiguous() for t in tensors)
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
        marked, head_scale, head_bias = (key_edit[0].to(torch.int8).contiguous(), key_edit[1].float().contiguous(),
                                         key_edit[2].float().contiguous()) if key_edit is not None else (out,) * 3
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
