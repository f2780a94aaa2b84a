"""bitsandbytes NF4 weights: the layout, its dequantization kernel and the fp32 torch reference.

Layout (bitsandbytes 0.50, ``quantize_4bit(quant_type="nf4")``) of a row-major [N, K] weight, all
indices flat over its N*K elements (element (r, k) is r*K + k):
- ``packed``: uint8, ceil(N*K / 2) bytes; element 2j is the HIGH nibble of byte j, 2j+1 the low.
- one scale per ``blocksize`` consecutive elements (blocks straddle rows when K % blocksize != 0);
  double quantization stores it as uint8 ``absmax`` into the 256-entry ``nested_code``, one fp32
  ``nested_absmax`` per 256 blocks, plus the fp32 ``offset`` (the mean absmax). The real scale is
  ``nested_code[absmax[b]] * nested_absmax[b // 256] + offset``: a fp32 product, then a fp32 sum.
- value = ``code[nibble] * scale`` in fp32, then one rounding to the output dtype.
Following those roundings exactly is what makes the kernel and the reference bit-identical to
``bitsandbytes.functional.dequantize_4bit`` (and to its CUDA kernel). bitsandbytes 0.50.2's own
CPU extension disagrees with its quantizer for some K % 64 != 0 (e.g. [37, 96]); we follow the flat
layout above, which quantize_4bit writes and its torch and CUDA paths read.
"""
from dataclasses import dataclass, replace

import torch

from .common import on_gpu, resolve_backend, round_to, tl, tl_dtype, triton

OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class NF4Weight:
    """One NF4-quantized [N, K] weight in bitsandbytes' layout (see the module docstring)."""

    packed: torch.Tensor  # uint8, ceil(N*K/2) bytes, any shape (bnb keeps [N*K/2, 1]); read flat
    absmax: torch.Tensor  # [ceil(N*K/blocksize)]: uint8 when nested, else fp32
    code: torch.Tensor  # fp32 [16], the NF4 values
    shape: tuple[int, int]  # (N, K) = (out_features, in_features)
    dtype: torch.dtype  # dtype of the quantized weight: the default output dtype
    blocksize: int = 64
    nested_absmax: torch.Tensor | None = None  # fp32 [ceil(blocks/nested_blocksize)]
    nested_code: torch.Tensor | None = None  # fp32 [256], bnb's dynamic 8-bit map
    nested_blocksize: int = 256
    offset: torch.Tensor | None = None  # fp32 0-d

    def __post_init__(self):
        self.shape = tuple(int(s) for s in self.shape)
        if len(self.shape) != 2:
            raise ValueError(f"NF4Weight holds a 2-D [N, K] weight, got shape {self.shape}")
        n_elements = self.shape[0] * self.shape[1]
        n_blocks = -(-n_elements // self.blocksize)
        if self.packed.dtype != torch.uint8 or self.packed.numel() != (n_elements + 1) // 2:
            raise ValueError(
                f"packed must hold {(n_elements + 1) // 2} uint8 bytes for shape {self.shape}, "
                f"got {self.packed.numel()} {self.packed.dtype}"
            )
        if self.absmax.numel() != n_blocks:
            raise ValueError(f"absmax must hold {n_blocks} blocks, got {self.absmax.numel()}")
        if self.code.dtype != torch.float32 or self.code.numel() != 16:
            raise ValueError(f"code must be 16 fp32 values, got {self.code.numel()} "
                             f"{self.code.dtype}")
        if self.blocksize & (self.blocksize - 1) or self.blocksize < 16:
            raise ValueError(f"blocksize must be a power of two >= 16, got {self.blocksize}")
        nested_parts = (self.nested_absmax, self.nested_code, self.offset)
        if any(p is None for p in nested_parts) != all(p is None for p in nested_parts):
            raise ValueError("nested_absmax, nested_code and offset come together or not at all")
        expected = torch.uint8 if self.nested else torch.float32
        if self.absmax.dtype != expected:
            raise ValueError(f"absmax must be {expected} (nested={self.nested}), got "
                             f"{self.absmax.dtype}")
        if self.nested and self.nested_absmax.numel() != -(-n_blocks // self.nested_blocksize):
            raise ValueError("nested_absmax must hold one fp32 scale per nested_blocksize blocks")

    @property
    def nested(self) -> bool:
        return self.nested_absmax is not None

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @classmethod
    def from_bnb(cls, packed: torch.Tensor, quant_state=None) -> "NF4Weight":
        """From ``quantize_4bit(..., quant_type="nf4")``'s output, or a ``bnb.nn.Params4bit``
        (its ``.data`` and ``.quant_state``; the parameter alone also works)."""
        if quant_state is None:
            quant_state = getattr(packed, "quant_state", None)
            if quant_state is None:
                raise ValueError("from_bnb needs a quant_state (or a Params4bit that carries one)")
        if quant_state.quant_type != "nf4":
            raise ValueError(f"expected an nf4 quant_state, got {quant_state.quant_type!r}")
        packed = packed.detach()
        if packed.dtype != torch.uint8:  # bnb's quant_storage may pack the bytes into wider ints
            packed = packed.view(torch.uint8)
        nested = {}
        absmax = quant_state.absmax
        if quant_state.nested:
            state2 = quant_state.state2
            nested = dict(
                nested_absmax=state2.absmax.float(),
                nested_code=state2.code.float(),
                nested_blocksize=state2.blocksize,
                offset=quant_state.offset.float().reshape(()),
            )
        else:
            absmax = absmax.float()  # bnb widens a half-precision absmax the same way
        return cls(
            packed=packed,
            absmax=absmax,
            code=quant_state.code.float(),
            shape=tuple(quant_state.shape),
            dtype=quant_state.dtype,
            blocksize=quant_state.blocksize,
            **nested,
        )

    def to(self, device) -> "NF4Weight":
        moved = {
            name: getattr(self, name).to(device)
            for name in ("packed", "absmax", "code", "nested_absmax", "nested_code", "offset")
            if getattr(self, name) is not None
        }
        return replace(self, **moved)

    def take_rows(self, rows: torch.Tensor) -> "NF4Weight":
        """The weight of ``rows`` only, when K % blocksize == 0 (each row owns whole blocks):
        row r is bytes [r*K/2, (r+1)*K/2) and blocks [r*K/blocksize, (r+1)*K/blocksize).

        Nested scales are resolved to fp32 for the taken blocks (the same two roundings), so the
        result dequantizes bit for bit to the taken rows of the whole weight.
        """
        n, k = self.shape
        if k % self.blocksize:
            raise ValueError(f"take_rows needs K % blocksize == 0, got K={k}, "
                             f"blocksize={self.blocksize}")
        rows = torch.as_tensor(rows, device=self.device).long().reshape(-1)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n):
            raise IndexError(f"rows must lie in [0, {n})")
        blocks_per_row = k // self.blocksize
        blocks = rows[:, None] * blocks_per_row + torch.arange(blocks_per_row, device=self.device)
        return NF4Weight(
            packed=self.packed.reshape(n, k // 2)[rows].reshape(-1),
            absmax=block_scales_ref(self, blocks.reshape(-1)),
            code=self.code,
            shape=(rows.numel(), k),
            dtype=self.dtype,
            blocksize=self.blocksize,
        )


def quantize_nf4(weight: torch.Tensor, blocksize: int = 64, double_quant: bool = True) -> NF4Weight:
    """Quantize a [N, K] weight with bitsandbytes itself, so the values are those the paper used."""
    import bitsandbytes.functional as bnb_functional

    if weight.dim() != 2:
        raise ValueError(f"quantize_nf4 takes a 2-D [N, K] weight, got shape {tuple(weight.shape)}")
    packed, quant_state = bnb_functional.quantize_4bit(
        weight.contiguous(), blocksize=blocksize, compress_statistics=double_quant, quant_type="nf4"
    )
    return NF4Weight.from_bnb(packed, quant_state)


def block_scales_ref(w: NF4Weight, blocks: torch.Tensor) -> torch.Tensor:
    """fp32 scale of each block index in ``blocks`` (any shape)."""
    if not w.nested:
        return w.absmax[blocks]
    scale = w.nested_code[w.absmax[blocks].long()] * w.nested_absmax[blocks // w.nested_blocksize]
    return scale + w.offset


def dequantize_rows_ref(w: NF4Weight, rows: torch.Tensor,
                        dtype: torch.dtype | None = None) -> torch.Tensor:
    """[len(rows), K] values of the weight's ``rows`` in ``dtype`` (default ``w.dtype``), by flat
    index arithmetic, so any K works and only those rows are touched."""
    _, k = w.shape
    element = rows.long().reshape(-1, 1) * k + torch.arange(k, device=w.device)  # [n, K]
    packed = w.packed.reshape(-1)[element // 2].int()
    nibble = (packed >> (4 - 4 * (element % 2)).int()) & 0xF
    values = w.code[nibble] * block_scales_ref(w, element // w.blocksize)
    return values.to(dtype or w.dtype)


def dequantize_nf4_ref(w: NF4Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole [N, K] weight in ``dtype`` (default ``w.dtype``): fp32 products, one rounding."""
    dtype = dtype or w.dtype
    n, k = w.shape
    n_elements = n * k
    packed = w.packed.reshape(-1)
    nibble = torch.stack((packed >> 4, packed & 0xF), dim=1).reshape(-1)[:n_elements].long()
    blocks = torch.arange(w.absmax.numel(), device=w.device)
    scale = block_scales_ref(w, blocks).repeat_interleave(w.blocksize)[:n_elements]
    return (w.code[nibble] * scale).to(dtype).reshape(n, k)


@triton.jit
def block_scales(
    block, mask, absmax_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr,
    NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
):
    """fp32 scale of each block index in ``block`` (any shape); 0 where ``mask`` is off."""
    if NESTED:
        quantized = tl.load(absmax_ptr + block, mask=mask, other=0).to(tl.int32)
        scale = tl.load(nested_code_ptr + quantized) * tl.load(
            nested_absmax_ptr + block // NESTED_BLOCKSIZE, mask=mask, other=0.0
        )
        # two roundings, like bnb: kernels that call this launch with enable_fp_fusion=False
        scale = scale + tl.load(offset_ptr)
        scale = tl.where(mask, scale, 0.0)
    else:
        scale = tl.load(absmax_ptr + block, mask=mask, other=0.0)
    return scale


@triton.jit
def nf4_values(
    element, mask, packed_ptr, absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr,
    BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
):
    """fp32 values of the elements at flat indices ``element`` (any shape, any K); 0 off
    ``mask``."""
    packed = tl.load(packed_ptr + element // 2, mask=mask, other=0).to(tl.int32)
    nibble = (packed >> (4 - 4 * (element % 2)).to(tl.int32)) & 0xF
    scale = block_scales(
        element // BLOCKSIZE, mask, absmax_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr,
        NESTED, NESTED_BLOCKSIZE,
    )
    return tl.load(code_ptr + nibble) * scale


@triton.jit
def nf4_row_block(
    row, k0, row_mask, K, packed_ptr, absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr,
    offset_ptr, BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
):
    """fp32 [len(row), BLOCKSIZE] values of columns k0 .. k0+BLOCKSIZE of ``row`` when K and k0
    are multiples of BLOCKSIZE: one scale per row, whole bytes, no per-element index arithmetic."""
    byte = row[:, None] * (K // 2) + k0 // 2 + tl.arange(0, BLOCKSIZE // 2)[None, :]
    packed = tl.load(packed_ptr + byte, mask=row_mask[:, None], other=0)
    nibble = tl.interleave(packed >> 4, packed & 0xF).to(tl.int32)  # element 2j = high nibble
    scale = block_scales(
        (row * K + k0) // BLOCKSIZE, row_mask, absmax_ptr, nested_absmax_ptr, nested_code_ptr,
        offset_ptr, NESTED, NESTED_BLOCKSIZE,
    )
    return tl.load(code_ptr + nibble) * scale[:, None]


@triton.jit
def _dequantize_nf4_kernel(
    packed_ptr, absmax_ptr, code_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr, out_ptr,
    n_elements,
    BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    # tile [BLOCKS_PER_PROGRAM, BLOCKSIZE]: one quantization block per tile row, one scale each
    block = tl.program_id(0).to(tl.int64) * BLOCKS_PER_PROGRAM + tl.arange(0, BLOCKS_PER_PROGRAM)
    byte = block[:, None] * (BLOCKSIZE // 2) + tl.arange(0, BLOCKSIZE // 2)[None, :]
    packed = tl.load(packed_ptr + byte, mask=byte < (n_elements + 1) // 2, other=0)
    nibble = tl.interleave(packed >> 4, packed & 0xF).to(tl.int32)
    element = block[:, None] * BLOCKSIZE + tl.arange(0, BLOCKSIZE)[None, :]
    scale = block_scales(
        block, block * BLOCKSIZE < n_elements, absmax_ptr, nested_absmax_ptr, nested_code_ptr,
        offset_ptr, NESTED, NESTED_BLOCKSIZE,
    )
    value = tl.load(code_ptr + nibble) * scale[:, None]
    tl.store(out_ptr + element, round_to(value, OUT_DTYPE), mask=element < n_elements)


def nf4_pointers(w: NF4Weight) -> tuple:
    """The six tensors a kernel reads an NF4 weight from; unused nested slots repeat ``absmax``."""
    if w.nested:
        return (w.packed, w.absmax, w.code, w.nested_absmax, w.nested_code, w.offset)
    return (w.packed, w.absmax, w.code, w.absmax, w.absmax, w.absmax)


def check_nf4(w: NF4Weight, device: torch.device) -> None:
    """The layout facts a kernel relies on beyond NF4Weight's own checks."""
    tensors = [t for t in nf4_pointers(w)]
    if any(t.device != device for t in tensors):
        raise ValueError(f"every NF4Weight tensor must be on {device}")
    if any(not t.is_contiguous() for t in tensors):
        raise ValueError("NF4Weight tensors must be contiguous (packed is read flat)")


def dequantize_nf4(
    w: NF4Weight, dtype: torch.dtype | None = None, backend: str = "auto", *,
    out: torch.Tensor | None = None
) -> torch.Tensor:
    """The whole [N, K] weight in ``dtype`` (default ``w.dtype``), bit-identical to
    ``bitsandbytes.functional.dequantize_4bit`` for the same dtype."""
    dtype = dtype or w.dtype
    if dtype not in OUTPUT_DTYPES:
        raise TypeError(f"dequantize_nf4 writes fp16, bf16 or fp32, got {dtype}")
    if out is not None and (out.shape != w.shape or out.dtype != dtype or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {w.shape}")
    if resolve_backend(backend, w.device) == "torch":
        result = dequantize_nf4_ref(w, dtype)
        return result if out is None else out.copy_(result)
    check_nf4(w, w.device)
    out = torch.empty(w.shape, dtype=dtype, device=w.device) if out is None else out
    n_elements = w.shape[0] * w.shape[1]
    # 2048 elements (1 KiB packed) per program keeps every SM streaming; the interpreter takes
    # small tiles so that the tests' few-thousand-element weights cross several programs.
    elements_per_program = 2048 if on_gpu(w.device) else 256
    blocks_per_program = max(1, elements_per_program // w.blocksize)
    grid = (triton.cdiv(w.absmax.numel(), blocks_per_program),)
    _dequantize_nf4_kernel[grid](
        *nf4_pointers(w), out, n_elements,
        BLOCKSIZE=w.blocksize, NESTED=w.nested, NESTED_BLOCKSIZE=w.nested_blocksize,
        BLOCKS_PER_PROGRAM=blocks_per_program, OUT_DTYPE=tl_dtype(dtype),
        num_warps=4, enable_fp_fusion=False,
    )
    return out
