"""Qwen3.5's decoder layers (transformers' models/qwen3_5/modeling_qwen3_5.py): three of every four
are Gated DeltaNet linear attention, the fourth full attention with a sigmoid output gate; every
RMSNorm scales by (1 + w) in fp32.

A linear layer carries two things past a token, in place of keys and values: the recurrent state
[B, Hv, Dk, Dv] (fp32) and the conv tail, its last `conv_kernel - 1` inputs to the short causal conv
[B, C, K - 1]. Prefix reuse saves both after the prefix and starts every question from them
(hybrid.py).

The gated delta rule, per value head, with q and k L2-normalised and q scaled by Dk^-0.5:
    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   o_t = q_t^T S_t,
    u_t = beta_t (v_t - exp(g_t) k_t^T S_{t-1}).
`delta_chunks` runs it a chunk of CHUNK tokens at a time: within a chunk, with G the cumulative log
decay, (I + M) U = beta V - beta exp(G) K S_0 where M[i, j] = beta_i exp(G_i - G_j) k_i.k_j for j <
i, solved as one unit lower-triangular system per chunk; then o = exp(G) Q S_0 + tril(exp(G_i - G_j)
q_i.k_j) U and S_C = exp(G_C) S_0 + sum_j exp(G_C - G_j) k_j u_j^T. A position with beta = 0 and g =
0 (right padding) leaves the state as it is, so each row's state is its own length's. `delta_step`
is the recurrence for one token.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from .decoder_layer import DecoderLayer
from .dims import DecoderDims
from .moe import ExpertMLP, has_experts
from .ops import apply_rotary, offset_rms_norm

# tokens per chunk of the delta rule, as transformers' torch_chunk_gated_delta_rule takes them
CHUNK = 64


@dataclass(frozen=True)
class HybridDims(DecoderDims):
    """DecoderDims with which layers are linear attention (the rest full attention with a gated
    query) and the linear layers' sizes (transformers' linear_* config fields)."""

    linear_layers: tuple[bool, ...] = ()
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    conv_kernel: int = 4

    @classmethod
    def of(cls, base: DecoderDims, cfg) -> "HybridDims":
        kinds = list(cfg.layer_types)
        return cls(**{f.name: getattr(base, f.name) for f in fields(DecoderDims)},
                   linear_layers=tuple(k == "linear_attention" for k in kinds),
                   linear_k_heads=cfg.linear_num_key_heads,
                   linear_v_heads=cfg.linear_num_value_heads,
                   linear_k_dim=cfg.linear_key_head_dim, linear_v_dim=cfg.linear_value_head_dim,
                   conv_kernel=cfg.linear_conv_kernel_dim)

    @property
    def conv_dim(self) -> int:  # the conv's channels: q, k and v side by side
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    @property
    def row_state_bytes(self) -> int:
        """Each DeltaNet layer's fp32 state [v heads, k dim, v dim] and its conv tail
        [conv_dim, kernel - 1] (counted at 4 bytes), which a question row keeps past its suffix for
        its continuation."""
        per_layer = self.linear_v_heads * self.linear_k_dim * self.linear_v_dim \
            + self.conv_dim * (self.conv_kernel - 1)
        return 4 * per_layer * sum(self.linear_layers)

    def expected_shapes(self) -> dict[str, tuple[int, ...] | list[tuple[int, ...]]]:
        shapes = super().expected_shapes()
        h, d = self.hidden_size, self.head_dim
        for i, linear in enumerate(self.linear_layers):
            p = f"layers.{i}."
            if not linear:  # the query projection also makes the output gate
                shapes[p + "self_attn.q_proj.weight"] = (2 * self.num_heads * d, h)
                continue
            for name in [k for k in shapes if k.startswith(p + "self_attn.")]:
                del shapes[name]
            v = self.linear_v_heads * self.linear_v_dim
            a = p + "linear_attn."
            shapes.update({a + "in_proj_qkv.weight": (self.conv_dim, h),
                           a + "in_proj_z.weight": (v, h),
                           a + "in_proj_b.weight": (self.linear_v_heads, h),
                           a + "in_proj_a.weight": (self.linear_v_heads, h),
                           a + "conv1d.weight": (self.conv_dim, 1, self.conv_kernel),
                           a + "dt_bias": (self.linear_v_heads,),
                           a + "A_log": (self.linear_v_heads,),
                           a + "norm.weight": (self.linear_v_dim,), a + "out_proj.weight": (h, v)})
        return shapes

    def mixer_flops(self, layer: int) -> int:
        """Weight-matmul FLOPs per token of `layer`'s token mixer (its attention's or DeltaNet's
        projections)."""
        h = self.hidden_size
        if not self.linear_layers[layer]:
            return 2 * h * self.head_dim * (3 * self.num_heads + 2 * self.num_kv_heads)
        v = self.linear_v_heads * self.linear_v_dim
        return 2 * h * (self.conv_dim + 2 * v + 2 * self.linear_v_heads)


def l2_normalized(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last axis, as flash-linear-attention's kernels (and
    transformers) take it."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def prepared(q, k, v, g, beta):
    """[B, S, H*, D*] heads (q, k with Hk heads, each serving Hv / Hk value heads in turn) → fp32
    [B, Hv, S, D*] with q and k normalised and q scaled, g and beta [B, Hv, S]."""
    groups = v.shape[2] // k.shape[2]
    q, k = (x.repeat_interleave(groups, dim=2) if groups > 1 else x for x in (q, k))
    q, k, v, g, beta = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, g, beta))
    return l2_normalized(q) * q.shape[-1] ** -0.5, l2_normalized(k), v, g, beta


def delta_chunks(q, k, v, g, beta, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a sequence: q, k [B, S, Hk, Dk], v [B, S, Hv, Dv], g (log decay, <=
    0) and beta [B, S, Hv], state [B, Hv, Dk, Dv] or None (zeros) → output [B, S, Hv, Dv] in v's
    dtype, the state after."""
    dtype, length = v.dtype, v.shape[1]
    q, k, v, g, beta = prepared(q, k, v, g, beta)
    b, heads, _, dk = k.shape
    pad = (-length) % CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    # [B, Hv, chunks, C, D]
    q, k, v = (x.reshape(b, heads, -1, CHUNK, x.shape[-1]) for x in (q, k, v))
    cum = g.reshape(b, heads, -1, CHUNK).cumsum(dim=-1)
    beta = beta.reshape(b, heads, -1, CHUNK)[..., None]
    later = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    # exp(G_i - G_j), j <= i
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(later, float("-inf")).exp()
    # below the diagonal: M; the diagonal is read as 1
    system = ((beta * k) @ k.transpose(-1, -2)) * decay
    corrections = torch.linalg.solve_triangular(system, beta * v, upper=False, unitriangular=True)
    from_state = torch.linalg.solve_triangular(system, beta * k * cum.exp()[..., None], upper=False,
                                               unitriangular=True)
    within = (q @ k.transpose(-1, -2)) * decay
    q_read = q * cum.exp()[..., None]
    k_write = k * (cum[..., -1:] - cum).exp()[..., None]
    span = cum[..., -1].exp()[..., None, None]
    state = torch.zeros(b, heads, dk, v.shape[-1], device=q.device) if state is None \
        else state.float()
    out = torch.empty_like(v)
    for c in range(q.shape[2]):
        u = corrections[:, :, c] - from_state[:, :, c] @ state
        out[:, :, c] = q_read[:, :, c] @ state + within[:, :, c] @ u
        state = state * span[:, :, c] + k_write[:, :, c].transpose(-1, -2) @ u
    out = out.reshape(b, heads, -1, v.shape[-1])[:, :, :length]
    return out.transpose(1, 2).to(dtype), state


def delta_step(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule (delta_chunks' shapes with S = 1) → output [B, 1, Hv, Dv],
    the state."""
    dtype = v.dtype
    q, k, v, g, beta = (x[:, :, 0] for x in prepared(q, k, v, g, beta))  # [B, Hv, D*], [B, Hv]
    state = state * g.exp()[..., None, None]
    u = (v - (state * k[..., None]).sum(dim=-2)) * beta[..., None]
    state = state + k[..., None] * u[..., None, :]
    return (state * q[..., None]).sum(dim=-2)[:, None].to(dtype), state


class GatedAttentionLayer(DecoderLayer):
    """A full-attention layer: q_proj makes each head's query and its output gate side by side, RoPE
    turns only the first rotary_dim of each head's dims, the attention output is scaled by
    sigmoid(gate) before o_proj."""

    def qkv_gate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, S, H] → q [B, Hq, S, D], k, v [B, Hkv, S, D] (RoPE applied), the gate
        [B, S, Hq * D]."""
        b, s, _ = x.shape
        d = self.dims
        h = offset_rms_norm(x, self.input_norm, d.rms_eps, kernels=self.kernels)
        q, gate = self.q_proj(h).view(b, s, d.num_heads, 2 * d.head_dim).chunk(2, dim=-1)
        q = offset_rms_norm(q, self.q_norm, d.rms_eps, kernels=self.kernels).transpose(1, 2)
        k = offset_rms_norm(self.k_proj(h).view(b, s, d.num_kv_heads, d.head_dim), self.k_norm,
                            d.rms_eps, kernels=self.kernels).transpose(1, 2)
        v = self.v_proj(h).view(b, s, d.num_kv_heads, d.head_dim).transpose(1, 2)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin), v, gate.reshape(b, s, -1)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.dims.rotary_dim
        turned = apply_rotary(x[..., :r].contiguous(), cos, sin, self.kernels)
        return turned if r == x.shape[-1] else torch.cat([turned, x[..., r:]], dim=-1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = attn.shape
        gated = attn.transpose(1, 2).reshape(b, s, -1) * torch.sigmoid(gate)
        return mlp_block(self, x + self.o_proj(gated))


def mlp_block(layer, x: torch.Tensor) -> torch.Tensor:
    """x + the layer's gated MLP (or mixture of experts) of its (1 + w)-normed x."""
    h = offset_rms_norm(x, layer.post_norm, layer.dims.rms_eps, kernels=layer.kernels)
    if layer.experts is not None:
        return x + layer.experts(h)
    return x + layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))


class DeltaNetLayer(nn.Module):
    """A Gated DeltaNet layer (transformers' Qwen3_5GatedDeltaNet and the MLP after it)."""

    kernels = "torch"

    def __init__(self, dims: HybridDims, weights: dict[str, torch.Tensor], linear):
        super().__init__()
        self.dims = dims
        like = weights["input_layernorm.weight"]  # already in the model's device and dtype

        def dense(name):
            return nn.Parameter(weights[name].to(like), requires_grad=False)

        self.input_norm = dense("input_layernorm.weight")
        self.post_norm = dense("post_attention_layernorm.weight")
        self.in_qkv, self.in_z, self.in_b, self.in_a, self.out_proj = (
            linear(weights[f"linear_attn.{n}.weight"])
            for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"))
        self.conv = dense("linear_attn.conv1d.weight")  # [C, 1, K]
        self.dt_bias, self.a_log, self.norm = (dense(f"linear_attn.{n}")
                                               for n in ("dt_bias", "A_log", "norm.weight"))
        # Qwen3.5-MoE's
        self.experts = ExpertMLP(dims, weights, linear) if has_experts(weights) else None
        if self.experts is None:
            self.gate_proj, self.up_proj, self.down_proj = (linear(weights[f"mlp.{n}_proj.weight"])
                                                            for n in ("gate", "up", "down"))

    def empty_carry(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The state and conv tail before any token: zeros."""
        d = self.dims
        return (torch.zeros(rows, d.linear_v_heads, d.linear_k_dim, d.linear_v_dim,
                            device=self.conv.device),
                self.conv.new_zeros(rows, d.conv_dim, d.conv_kernel - 1))

    def mix(self, x: torch.Tensor, state: torch.Tensor, tail: torch.Tensor,
            lengths: torch.Tensor | None = None):
        """x [B, S, H] after `state` and `tail` (each row's carry) → (DeltaNet's output [B, S, H],
        the state and conv tail after each row's `lengths` tokens (all S where None))."""
        h = offset_rms_norm(x, self.input_norm, self.dims.rms_eps, kernels=self.kernels)
        seen = torch.cat([tail, self.in_qkv(h).transpose(1, 2)], dim=-1)  # [B, C, K - 1 + S]
        mixed = F.silu(F.conv1d(seen, self.conv, groups=seen.shape[1])).transpose(1, 2)
        g, beta = self.gates(h)
        if lengths is not None:  # right padding: beta = g = 0 leaves the state as it is
            valid = (torch.arange(x.shape[1], device=x.device)[None] < lengths[:, None])[..., None]
            g, beta = g * valid, beta * valid
        out, state = delta_chunks(*self.heads(mixed), g, beta, state)
        if lengths is None:
            tail = seen[..., seen.shape[-1] - tail.shape[-1]:]
        else:  # columns length .. length + K - 2 of `seen`: the last K - 1 inputs of each row
            at = lengths[:, None, None] + torch.arange(tail.shape[-1], device=x.device)
            tail = seen.gather(2, at.expand(-1, seen.shape[1], -1))
        return self.output(out, h), state, tail

    def step(self, x: torch.Tensor, state: torch.Tensor, tail: torch.Tensor):
        """One token x [B, 1, H] → (DeltaNet's output [B, 1, H], the state and conv tail after
        it)."""
        h = offset_rms_norm(x, self.input_norm, self.dims.rms_eps, kernels=self.kernels)
        seen = torch.cat([tail, self.in_qkv(h).transpose(1, 2)], dim=-1)
        mixed = F.silu(F.conv1d(seen, self.conv, groups=seen.shape[1])).transpose(1, 2)
        out, state = delta_step(*self.heads(mixed), *self.gates(h), state)
        return self.output(out, h), state, seen[..., 1:]

    def gates(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The log decay g (fp32) and the write strength beta [B, S, Hv]."""
        g = -self.a_log.float().exp() * F.softplus(self.in_a(h).float() + self.dt_bias)
        return g, torch.sigmoid(self.in_b(h))

    def heads(self, mixed: torch.Tensor):
        """The conv's output [B, S, C] → q, k [B, S, Hk, Dk], v [B, S, Hv, Dv]."""
        d = self.dims
        b, s, _ = mixed.shape
        key = d.linear_k_heads * d.linear_k_dim
        q, k, v = mixed.split([key, key, d.linear_v_heads * d.linear_v_dim], dim=-1)
        return (q.reshape(b, s, -1, d.linear_k_dim), k.reshape(b, s, -1, d.linear_k_dim),
                v.reshape(b, s, -1, d.linear_v_dim))

    def output(self, out: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """out [B, S, Hv, Dv] through the gated RMSNorm (normed in fp32, scaled in the model's
        dtype, times SiLU(z) in fp32) and out_proj."""
        b, s = out.shape[:2]
        z = self.in_z(h).reshape(b, s, -1, self.dims.linear_v_dim)
        x = out.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.dims.rms_eps)
        x = self.norm * x.to(out.dtype)
        return self.out_proj((x * F.silu(z.float())).to(out.dtype).reshape(b, s, -1))

    def finish(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        return mlp_block(self, x + mixed)


def hybrid_layer(dims: HybridDims, weights: dict[str, torch.Tensor], linear):
    """The layer the checkpoint's tensors make: DeltaNet where they hold linear_attn, gated
    attention elsewhere."""
    if "linear_attn.in_proj_qkv.weight" in weights:
        return DeltaNetLayer(dims, weights, linear)
    return GatedAttentionLayer(dims, weights, linear)
