"""Gemma 4's language model (Gemma4TextModel, its decoder layer and per-layer inputs, the
engine's DecoderDims of its config, its RoPE per layer kind); the family is gemma4.py.

Against transformers models/gemma4/modeling_gemma4.py, it differs from Gemma 3's:
- RMSNorm scales by w (not 1 + w) in fp32 and casts once (Gemma4RMSNorm); v is RMS-normed without a
  weight; attention is unscaled (scaling 1.0), folded here into q's norm as sqrt(head_dim) so every
  attention path applies it with its own head_dim**-0.5;
- full-attention layers have their own head_dim (global_head_dim) and, with attention_k_eq_v, their
  own KV heads whose V is the K projection (v_proj absent); their RoPE is "proportional" (the first
  partial_rotary_factor of the frequencies rotate, the rest are zero: cos 1, sin 0), the sliding
  layers' default RoPE;
- the last num_kv_shared_layers layers compute no K/V: each attends with the K/V of the last earlier
  layer of its kind (config.kv_sharing_modes; DecoderDims.kv_source), and with use_double_wide_mlp
  their MLP is twice as wide;
- per-layer input embeddings (hidden_size_per_layer_input > 0): per token and layer a P-vector,
  (RMSNorm of the input embedding's projection / sqrt(hidden) + the token's own scaled embedding) /
  sqrt(2), the image slots' own embedding the pad token's (Gemma4Model.forward); each layer ends
  with gelu(gate(x)) * that, projected, normed and added (Gemma4TextDecoderLayer), then everything
  times layer_scalar;
- the sliding window on prompts (AND(q - k < window, OR(causal, image run)) on the sliding layers),
  and with use_bidirectional_attention "vision" an image's tokens see each other both ways on the
  sliding layers only, the full ones causal (create_masks_for_vision_model);
- logits read through final_logit_softcapping (cap * tanh(logits / cap)).
- the 26B-A4B's mixture of experts (enable_moe_block) beside each layer's dense MLP: the router
  reads the layer's input, the experts their own normed copy of it, and the two outputs are
  normed apart and added before the post-feedforward norm (Gemma4TextDecoderLayer;
  engine/layers/moe.py ScaledRouterExperts).
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.moe import ScaledRouterExperts
from ..layers.ops import Rotary, apply_rotary
from ..layers.decoder import DecoderDims, DecoderLayer
from ..utils.loader import CheckpointError


# the experts' norms: of the dense MLP's output, of the experts' input, of their output
MOE_NORMS = ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
             "post_feedforward_layernorm_2")


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             scale: float = 1.0) -> torch.Tensor:
    """Gemma4RMSNorm: normalise in fp32, scale by w (none: with_scale False) and `scale` in fp32,
    cast once."""
    y = x.float()
    y = y * torch.pow(y.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    y = y if weight is None else y * weight.float()
    return (y if scale == 1.0 else y * scale).to(x.dtype)


class Gemma4DecoderLayer(DecoderLayer):
    """Gemma4TextDecoderLayer (see the module docstring)."""

    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor], linear, *, index: int,
                 head_dim: int, kv_heads: int, device: torch.device, dtype: torch.dtype):
        nn.Module.__init__(self)
        self.dims, self.head_dim, self.kv_heads = dims, head_dim, kv_heads
        self.shared = dims.kv_of(index) != index

        def param(name):  # the tensors no Linear holds, never quantized
            return nn.Parameter(weights[name].to(device, dtype), requires_grad=False)

        self.input_norm, self.post_norm, self.pre_ff_norm, self.post_ff_norm = (
            param(f"{n}_layernorm.weight")
            for n in ("input", "post_attention", "pre_feedforward", "post_feedforward"))
        self.q_norm = param("self_attn.q_norm.weight")
        self.q_proj, self.o_proj = (linear(weights[f"self_attn.{n}_proj.weight"]) for n in "qo")
        if not self.shared:
            self.k_norm = param("self_attn.k_norm.weight")
            self.k_proj = linear(weights["self_attn.k_proj.weight"])
            self.v_proj = (linear(weights["self_attn.v_proj.weight"])
                           if "self_attn.v_proj.weight" in weights else None)
        self.gate_proj, self.up_proj, self.down_proj = (linear(weights[f"mlp.{n}_proj.weight"])
                                                         for n in ("gate", "up", "down"))
        self.side = "per_layer_input_gate.weight" in weights
        if self.side:
            self.side_gate, self.side_proj = (linear(weights[f"per_layer_{n}.weight"])
                                              for n in ("input_gate", "projection"))
            self.side_norm = param("post_per_layer_input_norm.weight")
        self.register_buffer("layer_scalar", weights["layer_scalar"].to(device, dtype))
        self.moe = None
        if "router.proj.weight" in weights:  # the 26B-A4B's experts beside the dense MLP
            self.moe_norms = nn.ParameterList(param(f"{n}.weight") for n in MOE_NORMS)
            self.moe = ScaledRouterExperts(
                {k: v.to(device, dtype) if not k.startswith("router.proj") else v
                 for k, v in weights.items() if k.startswith(("router.", "experts."))},
                linear, dims.experts_per_token, lambda x, w: rms_norm(x, w, dims.rms_eps))

    def qkv(self, x, cos, sin, need_q: bool = True, image=None):
        """A KV-shared layer computes q only (k, v None: the decoder takes its source layer's)."""
        b, s, _ = x.shape
        eps, d = self.dims.rms_eps, self.head_dim
        h = rms_norm(x, self.input_norm, eps)
        k = v = None
        if not self.shared:
            raw = self.k_proj(h).view(b, s, self.kv_heads, d)
            k = apply_rotary(rms_norm(raw, self.k_norm, eps).transpose(1, 2), cos, sin)
            v = raw if self.v_proj is None else self.v_proj(h).view(b, s, self.kv_heads, d)
            v = rms_norm(v, None, eps).transpose(1, 2)
        if not need_q:
            return None, k, v
        # scaling 1.0, folded in
        q = rms_norm(self.q_proj(h).view(b, s, -1, d), self.q_norm, eps, math.sqrt(d))
        return apply_rotary(q.transpose(1, 2), cos, sin), k, v

    def finish(self, x, attn, image=None, mlp=None, side=None):
        b, _, s, _ = attn.shape
        eps = self.dims.rms_eps
        x = x + rms_norm(self.o_proj(attn.transpose(1, 2).reshape(b, s, -1)), self.post_norm, eps)
        h = rms_norm(x, self.pre_ff_norm, eps)
        h = self.down_proj(F.gelu(self.gate_proj(h), approximate="tanh") * self.up_proj(h))
        if self.moe is not None:  # the experts read the residual before the dense MLP's norm
            after, before, out = self.moe_norms
            flat = x.reshape(-1, x.shape[-1])
            experts = self.moe(flat, rms_norm(flat, before, eps)).view(x.shape)
            h = rms_norm(h, after, eps) + rms_norm(experts, out, eps)
        x = x + rms_norm(h if mlp is None else mlp(h), self.post_ff_norm, eps)
        if side is not None:
            g = F.gelu(self.side_gate(x), approximate="tanh") * side
            x = x + rms_norm(self.side_proj(g), self.side_norm, eps)
        return x * self.layer_scalar


class PerLayerInputs(nn.Module):
    """Gemma4TextModel.get_per_layer_inputs + project_per_layer_inputs: (ids, input embeddings [...,
    H]) → [..., L, P], the image slots' token part the pad token's."""

    def __init__(self, weights: dict[str, torch.Tensor], cfg, linear, image_id: int, device, dtype):
        super().__init__()
        self.layers, self.width = cfg.num_hidden_layers, cfg.hidden_size_per_layer_input
        self.hidden = cfg.hidden_size
        self.eps, self.pad, self.image_id = cfg.rms_norm_eps, cfg.pad_token_id, image_id
        self.embed = nn.Parameter(weights["embed_tokens_per_layer.weight"].to(device, dtype),
                                  requires_grad=False)
        self.norm = nn.Parameter(weights["per_layer_projection_norm.weight"].to(device, dtype),
                                 requires_grad=False)
        self.proj = linear(weights["per_layer_model_projection.weight"])
        self.scale = torch.tensor(self.width**0.5).to(dtype)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ids = torch.where(ids == self.image_id, self.pad, ids)
        own = (F.embedding(ids, self.embed) * self.scale.to(x.device)).view(*ids.shape, self.layers,
                                                                             self.width)
        mixed = (self.proj(x) * self.hidden**-0.5).view(*x.shape[:-1], self.layers, self.width)
        return (rms_norm(mixed, self.norm, self.eps) + own) * 2.0**-0.5


def text_dims(cfg, where: Path) -> tuple[DecoderDims, list[tuple[int, int]]]:
    """DecoderDims of a Gemma4TextConfig and each layer's (head_dim, KV heads); a one-line
    CheckpointError for what the engine does not implement."""
    moe = bool(getattr(cfg, "enable_moe_block", False))
    if moe and not 0 < cfg.top_k_experts <= cfg.num_experts:
        raise CheckpointError(f"{where}/config.json: {cfg.top_k_experts} experts per token of "
                              f"{cfg.num_experts}: no such routing")
    if cfg.use_bidirectional_attention not in (None, "vision"):
        raise CheckpointError(f"{where}/config.json: use_bidirectional_attention "
                              f"{cfg.use_bidirectional_attention!r} (an encoder) is not supported")
    if cfg.hidden_activation != "gelu_pytorch_tanh":
        raise CheckpointError(f"{where}/config.json: hidden_activation {cfg.hidden_activation!r} "
                              "is not supported (gelu_pytorch_tanh only)")
    kinds = list(cfg.layer_types)
    for kind in set(kinds):
        rope_type = cfg.rope_parameters[kind].get("rope_type", "default")
        if rope_type not in ("default", "proportional"):
            raise CheckpointError(f"{where}/config.json: {kind} rope_type {rope_type!r} is not "
                                  "supported (default and proportional only)")
    modes = cfg.kv_sharing_modes
    first = cfg.num_hidden_layers - cfg.num_kv_shared_layers
    if first <= 0:
        raise CheckpointError(f"{where}/config.json: num_kv_shared_layers "
                              f"{cfg.num_kv_shared_layers} leaves no layer computing K/V")
    source = tuple(i if modes[i] != "reuse"
                   else max(j for j in range(first) if kinds[j] == kinds[i])
                   for i in range(cfg.num_hidden_layers))
    heads = [(cfg.per_layer_config[i].head_dim, cfg.per_layer_config[i].num_key_value_heads)
             for i in range(cfg.num_hidden_layers)]
    dims = DecoderDims(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size,
                       num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                       num_kv_heads=heads[0][1], head_dim=heads[0][0],  # layer 0's
                       rms_eps=cfg.rms_norm_eps,
                       rope_theta=float(cfg.rope_parameters[kinds[0]]["rope_theta"]),
                       sliding_window=cfg.sliding_window if "sliding_attention" in kinds else None,
                       layer_sliding=tuple(kind == "sliding_attention" for kind in kinds),
                       embed_scale=cfg.hidden_size**0.5,
                       image_bidirectional=cfg.use_bidirectional_attention == "vision",
                       image_blocks_full=False, kv_source=source,
                       logit_softcap=cfg.final_logit_softcapping,
                       max_positions=cfg.max_position_embeddings)
    # the dense MLP runs beside the experts for every token: FLOPs count it as a shared
    # expert's width
    if moe:
        dims = replace(dims, experts=cfg.num_experts, experts_per_token=cfg.top_k_experts,
                       expert_size=cfg.moe_intermediate_size,
                       shared_expert_size=cfg.intermediate_size)

    return dims, heads


def rotaries(cfg, heads: list[tuple[int, int]], device) -> list[Rotary]:
    """Each layer's RoPE: default on the sliding layers, proportional on the full ones (the first
    partial_rotary_factor x head_dim / 2 frequencies, the rest zero), one object per kind."""
    made = {}
    for kind, (head_dim, _) in zip(cfg.layer_types, heads):
        if kind in made:
            continue
        params = cfg.rope_parameters[kind]
        rotary = Rotary(head_dim, float(params["rope_theta"]), device)
        if params.get("rope_type", "default") == "proportional":
            angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
            rotary.inv_freq = torch.cat([rotary.inv_freq[:angles],
                                         rotary.inv_freq.new_zeros(head_dim // 2 - angles)])

            rotary.inv_freq = rotary.inv_freq / params.get("factor", 1.0)
        made[kind] = rotary
    return [made[kind] for kind in cfg.layer_types]
