"""Building blocks shared by the model files: a Linear whose weight is dense or NF4-packed, and
rotary embeddings written to round exactly as transformers' LLaMA does (RMSNorm is the kernels'
`rms_norm`, the same op the fused final norm is checked against)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import (NF4Weight, dequantize_nf4, fused_rms_norm, nf4_matmul, quantize_nf4,
                        resolve_backend, rotary)


class Linear(nn.Module):
    """y = x Wᵀ + b, W dense [out, in] or NF4-packed (bitsandbytes layout).

    A packed weight runs the fused NF4 GEMM where Triton runs, and elsewhere dequantizes to the
    input dtype and calls F.linear, which is exactly what bitsandbytes' matmul_4bit does for
    prompts of more than one token, so both paths give transformers' values.
    """

    def __init__(self, weight: torch.Tensor | NF4Weight, bias: torch.Tensor | None = None,
                 kernels: str = "auto"):
        super().__init__()
        if isinstance(weight, NF4Weight):
            self.packed = weight
            self.register_parameter("weight", None)
        else:
            self.packed = None
            self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.kernels = kernels

    @property
    def matrix(self) -> torch.Tensor | NF4Weight:
        """The weight as the kernels take it: the NF4 packing when there is one, else the dense
        tensor."""
        return self.packed if self.packed is not None else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        if resolve_backend(self.kernels, x.device) == "triton":
            y = nf4_matmul(x.reshape(-1, x.shape[-1]), self.packed, backend="triton")
            y = y.reshape(*x.shape[:-1], y.shape[-1])
            return y if self.bias is None else y + self.bias
        return F.linear(x, dequantize_nf4(self.packed, x.dtype, backend="torch"), self.bias)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, *, dtype: torch.dtype,
                device: torch.device, quantize: bool, keep_packed: bool, kernels: str) -> Linear:
    """A Linear from a checkpoint tensor: cast to the compute dtype first, then (optionally) NF4.

    transformers casts to the compute dtype before bitsandbytes quantizes, so quantizing the cast
    tensor reproduces its packed bytes; dequantizing once gives the weights its matmul uses.
    """
    weight = weight.to(device=device, dtype=dtype)
    bias = None if bias is None else bias.to(device=device, dtype=dtype)
    if not quantize:
        return Linear(weight, bias, kernels)
    packed = quantize_nf4(weight)
    if keep_packed:
        return Linear(packed, bias, kernels)
    dense = dequantize_nf4(packed, dtype, backend=resolve_backend(kernels, device))
    return Linear(dense, bias, kernels)


def replace_linears(module: nn.Module, *, dtype: torch.dtype, device: torch.device,
                    keep_packed: bool, kernels: str) -> int:
    """NF4-quantize every nn.Linear inside a borrowed transformers module (the vision tower,
    say)."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            bias = None if child.bias is None else child.bias.data
            setattr(module, name, make_linear(child.weight.data, bias, dtype=dtype, device=device,
                                              quantize=True, keep_packed=keep_packed,
                                              kernels=kernels))
            count += 1
        else:
            count += replace_linears(child, dtype=dtype, device=device, keep_packed=keep_packed,
                                     kernels=kernels)
    return count


class Rotary:
    """Default RoPE, computed as transformers does: fp32 frequencies, cos/sin cast to the model
    dtype. With mrope_section (Qwen2-VL's M-RoPE), image tokens carry three position streams
    (temporal, height, width) and each section of the frequencies takes its own stream; text tokens
    carry three equal streams, which is plain RoPE, so only positions that hold an image need
    cos_sin_3d. Interleaved (Qwen3-VL's), frequency j takes stream j % 3 within the first 3 x
    section[1] (height) and 3 x section[2] (width) frequencies, temporal elsewhere, instead of one
    chunk of frequencies per stream."""

    def __init__(self, head_dim: int, theta: float, device: torch.device,
                 mrope_section: tuple[int, ...] | None = None, interleaved: bool = False,
                 factor: float = 1.0, llama3: tuple[float, float, float, int] | None = None):
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device,
                                                                      dtype=torch.float) / head_dim
        self.inv_freq = 1.0 / (theta**exponent)
        if factor != 1.0:
            # linear RoPE scaling (transformers' _compute_linear_scaling_rope_parameters)
            self.inv_freq = self.inv_freq / factor
        if llama3 is not None:
            self.inv_freq = llama3_frequencies(self.inv_freq, *llama3)
        self.mrope_section, self.interleaved = mrope_section, interleaved
        if mrope_section is not None and sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section {mrope_section} does not cover {head_dim // 2} "
                             "frequencies")

    def cos_sin(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [..., S] → cos, sin [..., S, head_dim]."""
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def cos_sin_3d(self, positions: torch.Tensor,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [3, ..., S] (M-RoPE streams) → cos, sin [..., S, head_dim]."""
        if self.mrope_section is None:
            raise ValueError("three position streams need an M-RoPE model (mrope_section)")
        # [3, ..., S, D/2]
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)
        if self.interleaved:  # transformers' Qwen3VLTextRotaryEmbedding.recomposition_frequencies
            out = freqs[0].clone()
            for stream in (1, 2):
                every = slice(stream, 3 * self.mrope_section[stream], 3)
                out[..., every] = freqs[stream, ..., every]
            freqs = out
        else:
            parts = freqs.split(list(self.mrope_section), dim=-1)
            freqs = torch.cat([part[i % 3] for i, part in enumerate(parts)], dim=-1)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, scale: float = 1.0,
                    kernels: str = "torch") -> torch.Tensor:
    """transformers' Gemma3RMSNorm: normalise and scale by (1 + w) in fp32, then cast once (LLaMA's
    casts before scaling); `scale`, where not 1, folds a constant into the output in fp32 too. One
    fused kernel where `kernels` picks Triton, the torch ops elsewhere: the same bits
    (kernels/norm.py)."""
    return fused_rms_norm(x, weight, eps, kernels, offset=True, scale=scale)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 kernels: str = "torch") -> torch.Tensor:
    """x [B, H, S, D]; cos/sin [B, S, D] (or [S, D]) broadcast over heads. One fused kernel where
    `kernels` picks Triton, transformers' five torch ops elsewhere: the same bits
    (kernels/rotary.py)."""
    return rotary(x, cos, sin, backend=kernels)


def llama3_frequencies(inv_freq: torch.Tensor, factor: float, low_freq_factor: float,
                       high_freq_factor: float, original_max_positions: int) -> torch.Tensor:
    """Llama 3.1's RoPE scaling ("llama3"): frequencies whose wavelength is longer than
    original_max_positions / low_freq_factor divided by `factor`, those shorter than
    original_max_positions / high_freq_factor kept, those between blended linearly in
    original_max_positions / wavelength (attention unscaled)."""
    wavelength = 2 * math.pi / inv_freq
    long_waves = wavelength > original_max_positions / low_freq_factor
    scaled = torch.where(long_waves, inv_freq / factor, inv_freq)
    smooth = ((original_max_positions / wavelength - low_freq_factor)
              / (high_freq_factor - low_freq_factor))
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    between = (wavelength >= original_max_positions / high_freq_factor) & \
        (wavelength <= original_max_positions / low_freq_factor)
    return torch.where(between, blended, scaled)
