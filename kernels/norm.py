"""LLaMA's RMSNorm (and Gemma's) in one kernel, bit for bit the torch op's fp32 arithmetic
(`rms_norm`: 8 kernels).

`rms_norm` rounds at each of its ops: the squares, their mean (a sum, then a division by H),
``+ eps``, ``rsqrt`` (a square root, then 1 / it), the product, the cast back, and the product with
the weight. Every step but the sum rounds one IEEE operation, which the kernel repeats with
``sqrt_rn`` / ``div_rn`` (triton's plain ``/`` and ``rsqrt`` are approximate on a GPU) and no fused
multiply-adds. The sum decides the bits too, so the kernel adds the squares in the order torch's CPU
sum does (ATen's ``cascade_sum`` over a contiguous row, `_sum_plan`):

- the row is read as vectors of LANES floats (8 on AVX2 and default builds, 16 on AVX512; 1 when H <
  LANES); the vectors go four at a time into four vector accumulators, summed in a cascade of four
  levels: every 2**P groups of four the first level is added into the second, every 2**(2P) the
  second into the third, and so on;
- the vectors left over after the last whole group of four are added to the first accumulator, then
  the second, third and fourth accumulators into the first;
- a scalar total starts from the elements after the last whole vector, in order, then adds the first
  accumulator's lanes, in order.

So on a CPU under the interpreter the kernel's bits are torch's, and on a GPU it computes the same
function (torch's own CUDA reduction sums in another order). A single row of 32,768 or more elements
is an exception: torch splits that sum over its threads.
"""
import torch

from .common import on_gpu, resolve_backend, rounded, tl, tl_dtype, triton

ILP = 4  # vectors per group: ATen's ilp_factor
LEVELS = 4  # cascade levels: ATen's num_levels


def rms_norm(hidden: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, op for op: normalise in fp32, cast back, then scale (this order
    decides the rounding). The engine's norm, and the reference of `fused_rms_norm` and the lm_head
    kernels' fused one."""
    x = hidden.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return norm_weight * x.to(hidden.dtype)


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    scale: float = 1.0) -> torch.Tensor:
    """transformers' Gemma3RMSNorm: normalise and scale by (1 + w) in fp32, then cast once (LLaMA's
    casts before scaling); `scale` (applied in fp32 too, where not 1) folds a constant into the
    output."""
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return (y if scale == 1.0 else y * scale).to(x.dtype)


def sum_lanes() -> int:
    """The floats in one of torch's CPU vectors (Vectorized<float>::size()): 16 on AVX512 builds,
    else 8."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def _sum_plan(h: int, lanes: int) -> dict:
    """The constexprs that fix the kernel's summation order to torch's for rows of h floats."""
    # a row shorter than a vector is summed as scalars, the same way
    lanes = lanes if h >= lanes else 1
    groups = (h // lanes) // ILP
    ceil_log2 = 1 if groups <= 2 else (groups - 1).bit_length()  # ATen's CeilLog2
    power = max(4, ceil_log2 // LEVELS)
    step = 1 << power
    return dict(LANES=lanes, GROUPS=groups, STEP=step, FULL=groups // step * step,
                MASK2=(step - 1) << power, MASK3=(step - 1) << (2 * power))


@triton.jit
def _sum_of_squares(row_ptr, row_mask, H, LANES: tl.constexpr, GROUPS: tl.constexpr,
                    STEP: tl.constexpr, FULL: tl.constexpr, MASK2: tl.constexpr,
                    MASK3: tl.constexpr, BLOCK_R: tl.constexpr):
    """[BLOCK_R] fp32 sums of x**2 over each row, in torch's CPU order (the module docstring)."""
    group = tl.arange(0, 4 * LANES)[None, :]  # one group: four vectors side by side
    mask = row_mask[:, None] & (group < 4 * LANES)
    acc0 = tl.zeros((BLOCK_R, 4 * LANES), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_R, 4 * LANES), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_R, 4 * LANES), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_R, 4 * LANES), dtype=tl.float32)
    for start in range(0, FULL, STEP):
        for g in tl.static_range(STEP):  # unrolled: the loads of a level go out together
            x = tl.load(row_ptr + (start + g) * 4 * LANES + group, mask=mask,
                        other=0.0).to(tl.float32)
            acc0 += x * x
        done = start + STEP  # the groups summed so far: which levels carry, as ATen's loop decides
        acc1 += acc0
        acc0 = tl.zeros((BLOCK_R, 4 * LANES), dtype=tl.float32)
        up2 = (done & MASK2) == 0
        acc2 = tl.where(up2, acc2 + acc1, acc2)
        acc1 = tl.where(up2, 0.0, acc1)
        up3 = up2 & ((done & MASK3) == 0)
        acc3 = tl.where(up3, acc3 + acc2, acc3)
        acc2 = tl.where(up3, 0.0, acc2)
    for g in range(FULL, GROUPS):
        x = tl.load(row_ptr + g * 4 * LANES + group, mask=mask, other=0.0).to(tl.float32)
        acc0 += x * x
    acc0 = acc0 + acc1 + acc2 + acc3
    n_vectors = H // LANES
    first = row_mask[:, None] & (group < LANES)
    for v in range(GROUPS * 4, n_vectors):
        # the vectors after the last whole group, into the first vector
        x = tl.load(row_ptr + v * LANES + group, mask=first, other=0.0).to(tl.float32)
        acc0 += x * x
    # vector k of the group, then lane k of a vector, one at a time, in ATen's order
    vectors = tl.reshape(acc0, (BLOCK_R, 4, LANES))
    vector = tl.reshape(tl.gather(vectors, tl.zeros((BLOCK_R, 1, LANES), tl.int32), axis=1),
                        (BLOCK_R, LANES))
    for k in tl.static_range(1, 4):
        which = tl.full((BLOCK_R, 1, LANES), k, tl.int32)
        vector += tl.reshape(tl.gather(vectors, which, axis=1), (BLOCK_R, LANES))
    total = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for e in range(n_vectors * LANES, H):  # the elements after the last whole vector, one by one
        x = tl.load(row_ptr + e + tl.zeros((1, 1), tl.int32), mask=row_mask[:, None],
                    other=0.0).to(tl.float32)
        total += tl.reshape(x * x, (BLOCK_R,))
    for k in tl.static_range(LANES):
        total += tl.reshape(tl.gather(vector, tl.full((BLOCK_R, 1), k, tl.int32), axis=1),
                            (BLOCK_R,))
    return total


@triton.jit
def _rms_norm_kernel(
    x_ptr, stride_x, weight_ptr, out_ptr, stride_o, R, H, eps, scale,
    OFFSET: tl.constexpr, SCALED: tl.constexpr, X_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr,
    LANES: tl.constexpr, GROUPS: tl.constexpr, STEP: tl.constexpr, FULL: tl.constexpr,
    MASK2: tl.constexpr, MASK3: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < R
    row_ptr = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    total = _sum_of_squares(row_ptr, row_mask, H, LANES, GROUPS, STEP, FULL, MASK2, MASK3, BLOCK_R)
    mean = tl.div_rn(total, tl.zeros((BLOCK_R,), dtype=tl.float32) + H)  # H < 2**24: exact in fp32
    rstd = tl.div_rn(tl.full((BLOCK_R,), 1.0, tl.float32), tl.sqrt_rn(mean + eps))
    out_row = out_ptr + rows.to(tl.int64)[:, None] * stride_o
    for k0 in range(0, H, BLOCK_H):
        k = k0 + tl.arange(0, BLOCK_H)
        mask = row_mask[:, None] & (k < H)[None, :]
        x = tl.load(row_ptr + k[None, :], mask=mask, other=0.0).to(tl.float32)
        gamma = tl.load(weight_ptr + k, mask=k < H, other=0.0).to(tl.float32)
        if OFFSET:  # Gemma's: scaled by (1 + w) in fp32, cast once
            y = (x * rstd[:, None]) * (1.0 + gamma)[None, :]
            if SCALED:
                y = y * scale
        else:  # LLaMA's: cast, then scaled (a 16-bit product is exact in fp32: one rounding)
            y = rounded(x * rstd[:, None], X_DTYPE) * gamma[None, :]
        tl.store(out_row + k[None, :], rounded(y, OUT_DTYPE), mask=mask)


def fused_rms_norm(hidden: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                   backend: str = "auto", *, offset: bool = False,
                   scale: float = 1.0) -> torch.Tensor:
    """`rms_norm` (with offset, `offset_rms_norm` and its scale) of hidden [..., H] by norm_weight
    [H] in one kernel where kernels run (`resolve_backend`), the reference elsewhere: the same bits
    either way on a CPU (module docstring). A new contiguous tensor of the reference's dtype."""
    if resolve_backend(backend, hidden.device) == "torch":
        return (offset_rms_norm(hidden, norm_weight, eps, scale) if offset
                else rms_norm(hidden, norm_weight, eps))
    h = hidden.shape[-1]
    if norm_weight.shape != (h,) or norm_weight.device != hidden.device:
        raise ValueError(f"norm_weight must be a [{h}] tensor on {hidden.device}, got "
                         f"{tuple(norm_weight.shape)} on {norm_weight.device}")
    x = hidden.reshape(-1, h)
    if h and x.stride(1) != 1:
        x = x.contiguous()
    out_dtype = hidden.dtype if offset else torch.promote_types(hidden.dtype, norm_weight.dtype)
    out = torch.empty(hidden.shape, dtype=out_dtype, device=hidden.device)
    rows = x.shape[0]
    if rows == 0 or h == 0:
        # nothing to sum
        return fused_rms_norm(hidden, norm_weight, eps, "torch", offset=offset, scale=scale)
    # the interpreter's cost is per program, not per element: few programs of many rows off the GPU
    block_r = 16 if on_gpu(hidden.device) else min(1024, triton.next_power_of_2(rows))
    block_h = min(triton.next_power_of_2(h), 1024 if on_gpu(hidden.device) else 128)
    _rms_norm_kernel[(triton.cdiv(rows, block_r),)](
        x, x.stride(0), norm_weight.contiguous(), out, h, rows, h, eps, scale,
        OFFSET=offset, SCALED=scale != 1.0,
        X_DTYPE=tl_dtype(hidden.dtype), OUT_DTYPE=tl_dtype(out_dtype), **_sum_plan(h, sum_lanes()),
        BLOCK_R=block_r, BLOCK_H=block_h, num_warps=4, enable_fp_fusion=False,
    )
    return out
