"""The rotary embedding of queries or keys in one kernel, bit for bit the torch op (`rotary_ref`,
five kernels).

transformers' rotate-half RoPE, ``x * cos + cat(-x2, x1) * sin``, rounds three times in x's dtype:
each product, then their sum (computed in fp32 and rounded, as torch computes fp16/bf16 on a CPU). A
product of two 16-bit floats is exact in fp32, so rounding it once gives torch's bits; the kernel
keeps the three roundings in that order, with no fused multiply-add, so it matches torch on any
device where torch computes these ops as IEEE does.
"""
import torch

from .common import on_gpu, resolve_backend, rounded, tl, tl_dtype, triton


def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D]; cos/sin [B, S, D] (or [S, D]) broadcast over heads."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@triton.jit
def _rotary_kernel(
    x_ptr, sxb, sxh, sxs, cos_ptr, sin_ptr, scb, scs, out_ptr, sob, soh, sos, R, HEADS, S,
    HALF: tl.constexpr, DTYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    b, h, s = rows // (HEADS * S), (rows // S) % HEADS, rows % S
    # [rows, half, d]: element half * HALF + d of each row, beside the element of the other
    # half it turns with
    half = tl.arange(0, 2)[None, :, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    mask = (rows < R)[:, None, None] & (d < HALF) & (half < 2)
    x_row = x_ptr + (b * sxb + h * sxh + s * sxs)[:, None, None]
    c_row = (b * scb + s * scs)[:, None, None]
    x = tl.load(x_row + half * HALF + d, mask=mask, other=0.0).to(tl.float32)
    other = tl.load(x_row + (1 - half) * HALF + d, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + c_row + half * HALF + d, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + c_row + half * HALF + d, mask=mask, other=0.0).to(tl.float32)
    turned = tl.where(half == 0, -other, other)  # cat(-x2, x1): a sign change, exact
    y = rounded(rounded(x * cos, DTYPE) + rounded(turned * sin, DTYPE), DTYPE)
    tl.store(out_ptr + (b * sob + h * soh + s * sos)[:, None, None] + half * HALF + d, y, mask=mask)


def _table(t: torch.Tensor, name: str, b: int, s: int, d: int) -> tuple[torch.Tensor, int, int]:
    """cos or sin as [B or 1, S, D] with unit stride along D: the tensor and its batch and position
    strides."""
    shape = tuple(t.shape)
    t = t[None] if t.dim() == 2 else t
    if t.dim() != 3 or t.shape[0] not in (1, b) or tuple(t.shape[1:]) != (s, d):
        raise ValueError(f"{name} must be [S, D] or [B, S, D] = [{s}, {d}] or [{b}, {s}, "
                         f"{d}], got {shape}")
    if t.stride(2) != 1:
        t = t.contiguous()
    return t, (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           backend: str = "auto") -> torch.Tensor:
    """`rotary_ref` of x [B, H, S, D] by cos/sin [S, D] or [B, S, D] in one kernel where kernels run
    (`resolve_backend`), the reference elsewhere: the same bits, in a tensor laid out as the
    reference's."""
    if resolve_backend(backend, x.device) == "torch":
        return rotary_ref(x, cos, sin)
    if x.dim() != 4 or x.shape[-1] % 2 or x.stride(-1) != 1:
        raise ValueError("x must be [B, H, S, D] with an even D of unit stride, got "
                         f"{tuple(x.shape)}")
    b, heads, s, d = x.shape
    if cos.dtype != x.dtype or sin.dtype != x.dtype \
            or cos.device != x.device or sin.device != x.device:
        raise ValueError(f"cos and sin must be {x.dtype} on {x.device} as x is, got "
                         f"{cos.dtype}, {sin.dtype}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have one shape, got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    if cos.stride() != sin.stride():  # the kernel reads both with one set of strides
        cos, sin = cos.contiguous(), sin.contiguous()
    (cos, scb, scs), (sin, _, _) = _table(cos, "cos", b, s, d), _table(sin, "sin", b, s, d)
    out = torch.empty_like(x)  # x's layout, as torch's elementwise ops give theirs
    rows = b * heads * s
    if rows == 0:
        return out
    # interpreted: few programs
    block_r = 32 if on_gpu(x.device) else min(1024, triton.next_power_of_2(rows))
    _rotary_kernel[(triton.cdiv(rows, block_r),)](
        x, x.stride(0), x.stride(1), x.stride(2), cos, sin, scb, scs, out, out.stride(0),
        out.stride(1), out.stride(2), rows, heads, s, HALF=d // 2, DTYPE=tl_dtype(x.dtype),
        BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(d // 2), num_warps=4,
        enable_fp_fusion=False,
    )
    return out
