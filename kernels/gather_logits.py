"""Logits of a few lm_head rows, and the full-vocabulary argmax, without [B, V] logits.

A POPE readout needs the logits of a handful of candidate tokens (▁Yes, ▁No, ...) and the greedy
first token; the full [B, V] fp32 logits of every question are never needed. Both ops optionally
fuse the model's final LLaMA RMSNorm, computed exactly as transformers' LlamaRMSNorm:
``x.float() * rsqrt(mean(x^2) + eps)``, rounded back to x's dtype, then ``norm_weight * x`` (in
the promoted dtype of the two). The logits are then fp32 sums of products of that normed hidden
and the weight rows in their dtype (an NF4 weight is dequantized, bit for bit as bitsandbytes
does, to its ``dtype``): ``normed.float() @ rows.float().T``. transformers' lm_head would round
them to fp16/bf16 as well; these stay fp32.
"""
import torch

from .common import dot_dtype, on_gpu, resolve_backend, round_to, tl, tl_dtype, triton
from .nf4 import NF4Weight, check_nf4, dequantize_rows_ref, nf4_pointers, nf4_row_block, nf4_values
from .norm import rms_norm

ARGMAX_CHUNK_ROWS = 8192  # rows of the weight the reference turns into logits at a time
# An fp32 dense weight is sliced without a copy, so a whole LLaMA vocabulary goes in one piece
# (the CPU engine's case); fp16/bf16 rows are copied to fp32 and NF4 rows dequantized, so those
# stay in chunks.
ARGMAX_CHUNK_ROWS_FP32 = 32768


def _weight_rows_fp32(weight, rows: torch.Tensor | slice) -> torch.Tensor:
    if isinstance(weight, NF4Weight):
        if isinstance(rows, slice):
            rows = torch.arange(rows.start, rows.stop, device=weight.device)
        return dequantize_rows_ref(weight, rows).float()
    return weight[rows].float()  # a slice of an fp32 weight is a view: no copy of the vocabulary


def gather_logits_ref(
    hidden: torch.Tensor, weight, ids: torch.Tensor, norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6
) -> torch.Tensor:
    """[B, n] fp32 logits of rows ``ids`` (see the module docstring)."""
    if norm_weight is not None:
        hidden = rms_norm(hidden, norm_weight, eps)
    return hidden.float() @ _weight_rows_fp32(weight, ids).T


def vocab_argmax_ref(
    hidden: torch.Tensor, weight, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """[B] int64 argmax over all V rows of the fp32 logits (rounded to logits_dtype first when
    given), the smallest index on ties."""
    if norm_weight is not None:
        hidden = rms_norm(hidden, norm_weight, eps)
    hidden = hidden.float()
    n_rows = weight.shape[0]
    best = torch.full((hidden.shape[0],), float("-inf"), device=hidden.device)
    best_index = torch.zeros(hidden.shape[0], dtype=torch.int64, device=hidden.device)
    fp32 = isinstance(weight, torch.Tensor) and weight.dtype == torch.float32
    chunk = ARGMAX_CHUNK_ROWS_FP32 if fp32 else ARGMAX_CHUNK_ROWS
    for start in range(0, n_rows, chunk):
        logits = hidden @ _weight_rows_fp32(weight, slice(start, min(start + chunk, n_rows))).T
        if logits_dtype is not None:
            logits = logits.to(logits_dtype).float()
        chunk_max, chunk_index = logits.max(dim=1)
        better = chunk_max > best  # strict: an earlier chunk keeps a tie
        best = torch.where(better, chunk_max, best)
        best_index = torch.where(better, chunk_index + start, best_index)
    return best_index


@triton.jit
def _logits_tile(
    hidden_ptr, stride_hb, b, b_mask, H, eps,
    row, row_mask, weight_ptr, stride_wv,
    absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, norm_ptr,
    NF4: tl.constexpr, ALIGNED: tl.constexpr, BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr,
    NESTED_BLOCKSIZE: tl.constexpr, NORM: tl.constexpr,
    HIDDEN_DTYPE: tl.constexpr, NORMED_DTYPE: tl.constexpr, WEIGHT_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """fp32 [BLOCK_B, BLOCK_V] logits of hidden rows ``b`` (normed when NORM) by weight ``row``s."""
    hidden_row = hidden_ptr + b[:, None] * stride_hb
    if NORM:
        sum_squares = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(hidden_row + k[None, :], mask=b_mask[:, None] & (k < H)[None, :], other=0.0)
            x = x.to(tl.float32)
            sum_squares += tl.sum(x * x, axis=1)
        rstd = tl.rsqrt(sum_squares / H + eps)
    logits = tl.zeros((BLOCK_B, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(hidden_row + k[None, :], mask=b_mask[:, None] & (k < H)[None, :], other=0.0)
        if NORM:
            x = round_to(x.to(tl.float32) * rstd[:, None], HIDDEN_DTYPE).to(tl.float32)
            gamma = tl.load(norm_ptr + k, mask=k < H, other=0.0).to(tl.float32)
            # a product of two 16-bit floats is exact in fp32, so one rounding equals torch's
            x = round_to(x * gamma[None, :], NORMED_DTYPE)
        if NF4:
            if ALIGNED:
                w = nf4_row_block(
                    row, k0, row_mask, H, weight_ptr, absmax_ptr, code_ptr, nested_absmax_ptr,
                    nested_code_ptr, offset_ptr, BLOCKSIZE, NESTED, NESTED_BLOCKSIZE,
                )
            else:
                w = nf4_values(
                    row[:, None] * H + k[None, :], row_mask[:, None] & (k < H)[None, :], weight_ptr,
                    absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, BLOCKSIZE,
                    NESTED, NESTED_BLOCKSIZE,
                )
            w = round_to(w, WEIGHT_DTYPE)
        else:
            w = tl.load(
                weight_ptr + row[:, None] * stride_wv + k[None, :],
                mask=row_mask[:, None] & (k < H)[None, :], other=0.0
            )
        logits = tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), logits, input_precision="ieee")
    return logits


@triton.jit
def _gather_logits_kernel(
    hidden_ptr, stride_hb, B, H, eps, ids_ptr, n_ids, V, weight_ptr, stride_wv,
    absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, norm_ptr,
    out_ptr, stride_ob,
    NF4: tl.constexpr, ALIGNED: tl.constexpr, BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr,
    NESTED_BLOCKSIZE: tl.constexpr, NORM: tl.constexpr,
    HIDDEN_DTYPE: tl.constexpr, NORMED_DTYPE: tl.constexpr, WEIGHT_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    j = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    j_mask = j < n_ids
    b_mask = b < B
    row = tl.load(ids_ptr + j, mask=j_mask, other=0).to(tl.int64)
    tl.device_assert((row >= 0) & (row < V), "gather_logits: an id is outside the vocabulary")
    logits = _logits_tile(
        hidden_ptr, stride_hb, b, b_mask, H, eps, row, j_mask, weight_ptr, stride_wv,
        absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, norm_ptr,
        NF4, ALIGNED, BLOCKSIZE, NESTED, NESTED_BLOCKSIZE, NORM,
        HIDDEN_DTYPE, NORMED_DTYPE, WEIGHT_DTYPE, DOT_DTYPE, BLOCK_B, BLOCK_V, BLOCK_K,
    )
    tl.store(out_ptr + b[:, None] * stride_ob + j[None, :], logits,
             mask=b_mask[:, None] & j_mask[None, :])


@triton.jit
def _vocab_argmax_kernel(
    hidden_ptr, stride_hb, B, H, eps, V, weight_ptr, stride_wv,
    absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, norm_ptr,
    tile_max_ptr, tile_index_ptr,
    NF4: tl.constexpr, ALIGNED: tl.constexpr, BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr,
    NESTED_BLOCKSIZE: tl.constexpr, NORM: tl.constexpr,
    HIDDEN_DTYPE: tl.constexpr, NORMED_DTYPE: tl.constexpr, WEIGHT_DTYPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    ROUND_LOGITS: tl.constexpr, LOGITS_DTYPE: tl.constexpr,
):
    tile = tl.program_id(0)
    row = tile.to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = row < V
    b_mask = b < B
    logits = _logits_tile(
        hidden_ptr, stride_hb, b, b_mask, H, eps, row, row_mask, weight_ptr, stride_wv,
        absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, norm_ptr,
        NF4, ALIGNED, BLOCKSIZE, NESTED, NESTED_BLOCKSIZE, NORM,
        HIDDEN_DTYPE, NORMED_DTYPE, WEIGHT_DTYPE, DOT_DTYPE, BLOCK_B, BLOCK_V, BLOCK_K,
    )
    if ROUND_LOGITS:
        # as the model's lm_head output is: rounding makes ties, the first id wins them
        logits = round_to(logits, LOGITS_DTYPE).to(tl.float32)
    logits = tl.where(row_mask[None, :], logits, float("-inf"))
    best = tl.max(logits, axis=1)
    # the first column holding the maximum, written out: the interpreter ignores tie_break_left
    column = tl.arange(0, BLOCK_V)
    best_column = tl.min(tl.where(logits == best[:, None], column[None, :], BLOCK_V), axis=1)
    n_tiles = tl.num_programs(0)
    tl.store(tile_max_ptr + b * n_tiles + tile, best, mask=b_mask)
    tl.store(tile_index_ptr + b * n_tiles + tile, tile.to(tl.int64) * BLOCK_V + best_column,
             mask=b_mask)


def _launch_args(hidden, weight, norm_weight, device, few_rows: bool):
    """Checks shared by both ops; the kernel arguments that describe hidden, weight and norm.

    ``few_rows`` (gather_logits): one program walks all of H for a handful of rows, so it takes
    long K steps (per-element NF4 indexing is cheap at 16 rows); vocab_argmax streams all V rows
    and takes whole-block NF4 tiles where K allows."""
    if hidden.dim() != 2 or hidden.stride(1) != 1:
        raise ValueError("hidden must be [B, H] with unit stride along H, got "
                         f"{tuple(hidden.shape)}")
    h = hidden.shape[1]
    if isinstance(weight, NF4Weight):
        check_nf4(weight, device)
        if weight.shape[1] != h:
            raise ValueError(f"NF4 weight is {weight.shape}, hidden has H={h}")
        packed, absmax, code, nested_absmax, nested_code, offset = nf4_pointers(weight)
        weight_ptr, stride_wv, weight_dtype = packed, 0, weight.dtype
        aligned = not few_rows and h % weight.blocksize == 0 and weight.blocksize <= 128
        nf4 = dict(BLOCKSIZE=weight.blocksize, NESTED=weight.nested,
                   NESTED_BLOCKSIZE=weight.nested_blocksize)
    else:
        if weight.dim() != 2 or weight.shape[1] != h or weight.stride(1) != 1:
            raise ValueError(f"weight must be [V, {h}] with unit stride along H, got "
                             f"{tuple(weight.shape)}")
        if weight.device != device:
            raise ValueError(f"weight is on {weight.device}, hidden on {device}")
        weight_ptr, stride_wv, weight_dtype = weight, weight.stride(0), weight.dtype
        absmax = code = nested_absmax = nested_code = offset = weight
        aligned = False
        nf4 = dict(BLOCKSIZE=64, NESTED=False, NESTED_BLOCKSIZE=256)
    normed_dtype = hidden.dtype
    if norm_weight is not None:
        if norm_weight.shape != (h,) or not norm_weight.is_contiguous() \
                or norm_weight.device != device:
            raise ValueError(f"norm_weight must be a contiguous [{h}] tensor on {device}")
        normed_dtype = torch.promote_types(hidden.dtype, norm_weight.dtype)
    dot = dot_dtype(normed_dtype, weight_dtype)
    if aligned:
        block_k = weight.blocksize
    else:
        block_k = (256 if few_rows else 128) if on_gpu(device) else 32
    args = (weight_ptr, stride_wv, absmax, code, nested_absmax, nested_code, offset,
            norm_weight if norm_weight is not None else hidden)
    constexprs = dict(
        NF4=isinstance(weight, NF4Weight), ALIGNED=aligned, NORM=norm_weight is not None, **nf4,
        HIDDEN_DTYPE=tl_dtype(hidden.dtype), NORMED_DTYPE=tl_dtype(normed_dtype),
        WEIGHT_DTYPE=tl_dtype(weight_dtype), DOT_DTYPE=tl_dtype(dot), BLOCK_K=block_k,
    )
    return args, constexprs


def _block_b(n_rows: int) -> int:
    return max(16, min(64, triton.next_power_of_2(n_rows)))


def gather_logits(
    hidden: torch.Tensor,
    weight,
    ids: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str = "auto",
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, n] fp32 logits of the lm_head rows ``ids`` for hidden [B, H].

    ``weight`` is a [V, H] fp16/bf16/fp32 tensor or an NF4Weight, of which only the ``ids`` rows
    are read (and dequantized). On CUDA the ids are not range-checked on the host (that would
    sync); a device assert checks them under TRITON_DEBUG=1.
    """
    device = hidden.device
    if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32) or ids.device != device:
        raise ValueError(f"ids must be a 1-D int64/int32 tensor on {device}")
    n_rows = weight.shape[0]
    if device.type != "cuda" and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_rows):
        raise IndexError(f"ids must lie in [0, {n_rows})")
    b, n = hidden.shape[0], ids.numel()
    if out is not None and (out.shape != (b, n) or out.dtype != torch.float32
                            or out.stride(1) != 1):
        raise ValueError(f"out must be a fp32 [{b}, {n}] tensor with unit stride along n")
    if resolve_backend(backend, device) == "torch":
        result = gather_logits_ref(hidden, weight, ids, norm_weight, eps)
        return result if out is None else out.copy_(result)
    args, constexprs = _launch_args(hidden, weight, norm_weight, device, few_rows=True)
    out = torch.empty((b, n), dtype=torch.float32, device=device) if out is None else out
    # B ~ 18 questions x n ~ 8 candidates: one tile of 16..64 x 16 covers it, so a single program
    # reads each candidate row once; a bigger n spreads over programs.
    block_b, block_v = _block_b(b), 16
    grid = (triton.cdiv(n, block_v), triton.cdiv(b, block_b))
    if n and b:
        _gather_logits_kernel[grid](
            hidden, hidden.stride(0), b, hidden.shape[1], eps, ids.contiguous(), n, n_rows, *args,
            out, out.stride(0), BLOCK_B=block_b, BLOCK_V=block_v, **constexprs,
            num_warps=8 if on_gpu(device) else 4, enable_fp_fusion=False,
        )
    return out


def vocab_argmax(
    hidden: torch.Tensor,
    weight,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str = "auto",
    *,
    logits_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B] int64: per row of hidden [B, H], the argmax over all V rows of ``weight`` of the
    fp32-accumulated logits of the (optionally RMS-normed) hidden in its dtype, rounded to
    ``logits_dtype`` first when given (transformers takes the argmax of the model-dtype lm_head
    output, where fp16/bf16 rounding turns near-ties into ties); ties go to the smallest index, as
    torch.argmax. Logits live one [BLOCK_B, BLOCK_V] tile at a time; only the per-tile maxima
    ([B, V / BLOCK_V]) reach memory."""
    device = hidden.device
    b, n_rows = hidden.shape[0], weight.shape[0]
    if out is not None and (out.shape != (b,) or out.dtype != torch.int64):
        raise ValueError(f"out must be an int64 [{b}] tensor")
    if resolve_backend(backend, device) == "torch":
        result = vocab_argmax_ref(hidden, weight, norm_weight, eps, logits_dtype)
        return result if out is None else out.copy_(result)
    args, constexprs = _launch_args(hidden, weight, norm_weight, device, few_rows=False)
    rounding = logits_dtype is not None and logits_dtype != torch.float32
    constexprs.update(ROUND_LOGITS=rounding,
                      LOGITS_DTYPE=tl_dtype(logits_dtype if rounding else torch.float32))
    block_b = _block_b(b)
    block_v = 128 if on_gpu(device) else 32
    n_tiles = triton.cdiv(n_rows, block_v)
    tile_max = torch.empty((b, n_tiles), dtype=torch.float32, device=device)
    tile_index = torch.empty((b, n_tiles), dtype=torch.int64, device=device)
    _vocab_argmax_kernel[(n_tiles, triton.cdiv(b, block_b))](
        hidden, hidden.stride(0), b, hidden.shape[1], eps, n_rows, *args, tile_max, tile_index,
        BLOCK_B=block_b, BLOCK_V=block_v, **constexprs,
        num_warps=4, enable_fp_fusion=False,
    )
    # torch.argmax returns the first maximal tile, whose own argmax is its first maximal column
    best_tile = tile_max.argmax(dim=1, keepdim=True)
    result = tile_index.gather(1, best_tile).squeeze(1)
    return result if out is None else out.copy_(result)
