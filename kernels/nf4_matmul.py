"""x @ W.T for an NF4 weight W: for a few rows, dequantizing [BLOCK_N, BLOCK_K] tiles on the fly
into tl.dot; for many (a prefill), the weight dequantized once and cuBLAS's product, as bitsandbytes
does.

This is the mode that keeps a 7B model packed (~4 GB). The rule it follows is bitsandbytes 0.50's
``gemm_4bit`` for prompts of more than one token (what transformers runs): dequantize W straight to
x's dtype (fp32 product, one rounding, bit-identical to ``dequantize_4bit(..., x.dtype)``), then an
fp32-accumulated matmul rounded once to x's dtype. When W was quantized from x's dtype (the usual
case) this is also ``dequantize_4bit(W).to(x.dtype)`` then F.linear. Only the order of the fp32 sums
differs from cuBLAS.
"""
import torch

from .common import dot_dtype, on_gpu, resolve_backend, round_to, tl, tl_dtype, triton
from .nf4 import (NF4Weight, check_nf4, dequantize_nf4, dequantize_nf4_ref, nf4_pointers,
                  nf4_row_block, nf4_values)

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Rows past which the weight is dequantized once (one streaming pass: 42 us for 11008 x 4096 on an
# H200) and cuBLAS multiplies (277 us at M=2048): the fused kernel dequantizes each weight tile
# again for every row tile, and at M=2048 took 7.6 ms, 28x cuBLAS (bench/RESULTS.md, first GPU run).
# One row tile (M <= 64) reads the packed weight once, which is where fusing pays. This is also
# transformers' own path for more than one token, so the product is the same cuBLAS call it makes.
FUSED_MAX_ROWS = 64


def nf4_matmul_ref(x: torch.Tensor, w: NF4Weight) -> torch.Tensor:
    """[M, N] in x's dtype: ``x.float() @ dequantize_nf4_ref(w, x.dtype).float().T``, rounded
    once."""
    return (x.float() @ dequantize_nf4_ref(w, x.dtype).float().T).to(x.dtype)


@triton.jit
def _nf4_matmul_kernel(
    x_ptr, packed_ptr, absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr,
    out_ptr, M, N, K, stride_xm, stride_om,
    BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
    ALIGNED: tl.constexpr, X_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # programs walk GROUP_M row-tiles down one column of tiles before moving right, so a group
    # shares each dequantized weight tile through L2
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % group_m
    pid_n = (pid % (GROUP_M * tiles_n)) // group_m

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < M
    n_mask = n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :],
                    mask=m_mask[:, None] & (k < K)[None, :], other=0.0)
        if ALIGNED:  # BLOCK_K == BLOCKSIZE divides K: whole bytes, one scale per tile row
            w = nf4_row_block(
                n, k0, n_mask, K, packed_ptr, absmax_ptr, code_ptr, nested_absmax_ptr,
                nested_code_ptr, offset_ptr, BLOCKSIZE, NESTED, NESTED_BLOCKSIZE,
            )
        else:  # any K: blocks and bytes straddle rows, so index every element
            w = nf4_values(
                n[:, None] * K + k[None, :], n_mask[:, None] & (k < K)[None, :], packed_ptr,
                absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, BLOCKSIZE,
                NESTED, NESTED_BLOCKSIZE,
            )
        w = round_to(w, X_DTYPE)
        acc = tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision="ieee")
    tl.store(
        out_ptr + m[:, None] * stride_om + n[None, :], round_to(acc, X_DTYPE),
        mask=m_mask[:, None] & n_mask[None, :]
    )


def _blocks(m: int, gpu: bool) -> dict:
    """Tile sizes. GPU: 128x128x64 with 8 warps is the usual Hopper fp16 GEMM tile; skinny M
    takes a short tile so few rows are wasted. Interpreter: small tiles so test shapes cross
    several of them. Not yet tuned on a GPU (see bench/RESULTS.md)."""
    if not gpu:
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)
    block_m = 128 if m > 64 else max(16, triton.next_power_of_2(m))
    return dict(BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                num_warps=8 if block_m == 128 else 4, num_stages=3)


def nf4_matmul(
    x: torch.Tensor, w: NF4Weight, backend: str = "auto", *, out: torch.Tensor | None = None,
    fused_max_rows: int = FUSED_MAX_ROWS,
) -> torch.Tensor:
    """[M, N] = x [M, K] @ W.T for an NF4 weight W [N, K], in x's dtype (fp16/bf16; fp32 too): the
    fused kernel up to `fused_max_rows` rows, else dequantize_nf4 then F.linear."""
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x must be [M, {w.shape[1]}], got {tuple(x.shape)}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if x.device != w.device:
        raise ValueError(f"x is on {x.device}, the weight on {w.device}")
    m, k = x.shape
    n = w.shape[0]
    if out is not None and (out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1):
        raise ValueError(f"out must be a {x.dtype} [{m}, {n}] tensor with unit stride along N")
    if resolve_backend(backend, x.device) == "torch":
        result = nf4_matmul_ref(x, w)
        return result if out is None else out.copy_(result)
    if m > fused_max_rows:
        result = torch.nn.functional.linear(x, dequantize_nf4(w, x.dtype, backend))
        return result if out is None else out.copy_(result)
    check_nf4(w, x.device)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    blocks = _blocks(m, on_gpu(x.device))
    aligned = k % w.blocksize == 0 and 16 <= w.blocksize <= 128
    if aligned:
        blocks["BLOCK_K"] = w.blocksize
    elif on_gpu(x.device):
        # per-element dequant tiles: 3 stages need ~224 KiB of shared memory on sm_90
        blocks["num_stages"] = 2
    grid = (triton.cdiv(m, blocks["BLOCK_M"]) * triton.cdiv(n, blocks["BLOCK_N"]),)
    if m:
        _nf4_matmul_kernel[grid](
            x, *nf4_pointers(w), out, m, n, k, x.stride(0), out.stride(0),
            BLOCKSIZE=w.blocksize, NESTED=w.nested, NESTED_BLOCKSIZE=w.nested_blocksize,
            ALIGNED=aligned, X_DTYPE=tl_dtype(x.dtype), DOT_DTYPE=tl_dtype(dot_dtype(x.dtype)),
            enable_fp_fusion=False, **blocks,
        )
    return out
