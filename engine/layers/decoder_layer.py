"""One layer of the decoder (decoder.py): LLaMA's pre-norm block of grouped-query attention's
projections and a gated MLP (or a mixture of experts, moe.py), with the norms and RoPE the dims
switch on. The attention itself runs in attention.py, so each pass picks its variant."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import fused_rms_norm
from .dims import DecoderDims
from .moe import ExpertMLP, has_experts
from .ops import apply_rotary


class DecoderLayer(nn.Module):
    # where the norms and RoPE run: DecoderLM gives each layer its own `kernels` setting
    kernels = "torch"

    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor], linear):
        super().__init__()
        self.dims = dims
        self.input_norm = nn.Parameter(weights["input_layernorm.weight"], requires_grad=False)
        self.post_norm = nn.Parameter(weights["post_attention_layernorm.weight"],
                                      requires_grad=False)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            linear(weights[f"self_attn.{n}_proj.weight"], weights.get(f"self_attn.{n}_proj.bias"))
            for n in "qkvo")
        self.experts = ExpertMLP(dims, weights, linear) if has_experts(weights) else None  # moe.py
        if self.experts is None:
            self.gate_proj, self.up_proj, self.down_proj = (
                linear(weights[f"mlp.{n}_proj.weight"]) for n in ("gate", "up", "down"))
        if dims.qk_norm:
            self.q_norm, self.k_norm = (nn.Parameter(weights[f"self_attn.{n}_norm.weight"],
                                                     requires_grad=False)
                                        for n in "qk")

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, need_q: bool = True,
            image: torch.Tensor | None = None):
        """x [B, S, H] → q [B, Hq, S, D] (None without need_q), k, v [B, Hkv, S, D] with RoPE
        applied to q and k. image [B, S] marks image positions, for layers that treat them apart
        (mPLUG-Owl2's); a plain LLaMA layer does not."""
        b, s, _ = x.shape
        d = self.dims
        h = fused_rms_norm(x, self.input_norm, d.rms_eps, self.kernels)
        k = self.head_norm(self.k_proj(h).view(b, s, d.num_kv_heads, d.head_dim), "k")
        k = k.transpose(1, 2)
        v = self.v_proj(h).view(b, s, d.num_kv_heads, d.head_dim).transpose(1, 2)
        if not need_q:
            return None, apply_rotary(k, cos, sin, self.kernels), v
        q = self.head_norm(self.q_proj(h).view(b, s, d.num_heads, d.head_dim), "q").transpose(1, 2)
        return apply_rotary(q, cos, sin, self.kernels), apply_rotary(k, cos, sin, self.kernels), v

    def norm(self, x: torch.Tensor, which: str) -> torch.Tensor:
        """x [.., H] through the layer's input ("input") or post-attention ("post") RMSNorm (ONLY's,
        MemVR's steps)."""
        return fused_rms_norm(x, self.input_norm if which == "input" else self.post_norm,
                              self.dims.rms_eps, self.kernels)

    def head_norm(self, x: torch.Tensor, which: str) -> torch.Tensor:
        """x [B, S, heads, D] through q_norm or k_norm (which: "q", "k") where the dims ask for them
        (qk_norm)."""
        if not self.dims.qk_norm:
            return x
        return fused_rms_norm(x, getattr(self, f"{which}_norm"), self.dims.rms_eps, self.kernels)

    def finish(self, x: torch.Tensor, attn: torch.Tensor, image: torch.Tensor | None = None,
               mlp: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Residual + o_proj, then the MLP block, its output through `mlp` where given (an
        intervention's interventions.mlp_hook). attn [B, Hq, S, D]."""
        b, _, s, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        h = fused_rms_norm(x, self.post_norm, self.dims.rms_eps, self.kernels)
        out = self.experts(h) if self.experts is not None else \
            self.down_proj(F.silu(self.gate_proj(h), inplace=True).mul_(self.up_proj(h)))
        return x + (out if mlp is None else mlp(out))
