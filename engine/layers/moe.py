"""The mixture-of-experts MLP of Qwen3-VL-MoE's and Qwen3.5-MoE's decoder layers, as transformers
computes it by default (models/qwen3_vl_moe/modeling_qwen3_vl_moe.py: Qwen3VLMoeTextTopKRouter;
integrations/moe.py: the "grouped_mm" experts its configs select): the router's logits in the
model's dtype, their softmax in fp32, each token's top-k experts with those probabilities
renormalised to sum to 1 and cast back; each chosen expert's gated MLP (SiLU(gate) x up, then down)
scaled by its weight, and a token's k outputs summed in one reduction over its top-k slots (fp32
accumulation, one rounding; the class's eager loop adds in the model's dtype expert by expert, which
differs in fp16 by a rounding step). Qwen3.5-MoE adds a shared expert (modeling_qwen3_5_moe.py,
Qwen3_5MoeSparseMoeBlock): a gated MLP every token goes through, scaled by the sigmoid of a one-row
gate and added to the routed experts' sum.

Routing is batch-invariant: the router's matmul always runs on blocks of ROUTER_ROWS tokens (the
last padded), one GEMM shape whatever the batch, so a token's logits, experts and weights are the
same bits alone or among any others (tests/families/test_qwen3_vl_moe.py). bitsandbytes quantizes
Linear modules only, so under NF4 transformers keeps the router and the fused expert tensors in the
compute dtype: so do we (the shared expert and its gate are Linears, quantized as the dense MLPs
are).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .dims import DecoderDims


# Tokens per router matmul. A GEMM's kernel (and so its order of sums) follows its shape; with one
# shape, a row's result cannot depend on how many rows came with it.
ROUTER_ROWS = 64


def has_experts(weights: dict[str, torch.Tensor]) -> bool:
    """Whether a layer's tensors make a mixture of experts (a router) rather than one gated MLP."""
    return "mlp.gate.weight" in weights


def fused(weights: dict[str, torch.Tensor], experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts' gate_up [E, 2 x width, hidden] and down [E, hidden, width] as stored fused, or
    stacked from one tensor an expert (gate rows above up rows, as transformers' qwen2_moe
    conversion concatenates them)."""
    if "mlp.experts.gate_up_proj" in weights:
        return weights["mlp.experts.gate_up_proj"], weights["mlp.experts.down_proj"]
    one = [f"mlp.experts.{j}." for j in range(experts)]
    gate_up = torch.stack([torch.cat([weights[p + "gate_proj.weight"],
                                      weights[p + "up_proj.weight"]]) for p in one])
    return gate_up, torch.stack([weights[p + "down_proj.weight"] for p in one])


class ExpertMLP(nn.Module):
    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor], linear):
        super().__init__()
        e, w, h = dims.experts, dims.expert_size, dims.hidden_size
        gate_up, down = fused(weights, e)
        # transformers' own layout, else the published checkpoints' (last two axes swapped), as its
        # loader decides: a tensor already in its shape is kept
        if tuple(gate_up.shape) != (e, 2 * w, h):
            gate_up = gate_up.transpose(1, 2)
        if tuple(down.shape) != (e, h, w):
            down = down.transpose(1, 2)
        self.router = nn.Parameter(weights["mlp.gate.weight"], requires_grad=False)
        self.gate_up = nn.Parameter(gate_up.contiguous(), requires_grad=False)
        self.down = nn.Parameter(down.contiguous(), requires_grad=False)
        self.top_k = dims.experts_per_token
        self.shared = dims.shared_expert_size > 0
        if self.shared:
            self.shared_gate_proj, self.shared_up_proj, self.shared_down_proj = (
                linear(weights[f"mlp.shared_expert.{n}_proj.weight"])
                for n in ("gate", "up", "down"))
            self.shared_gate = linear(weights["mlp.shared_expert_gate.weight"])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] → (weights [N, k] in x's dtype, experts [N, k])."""
        logits = router_logits(x, lambda block: F.linear(block, self.router))
        top, experts = top_k(logits, self.top_k)
        return top.to(logits.dtype), experts

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.reshape(-1, h.shape[-1])
        out = expert_sum(x, *self.route(x), self.gate_up, self.down, F.silu)
        if self.shared:
            shared = self.shared_down_proj(F.silu(self.shared_gate_proj(x))
                                           * self.shared_up_proj(x))
            out = out + torch.sigmoid(self.shared_gate(x)) * shared
        return out.reshape(h.shape)


def router_logits(x: torch.Tensor, project) -> torch.Tensor:
    """x [N, H] through the router's projection on blocks of ROUTER_ROWS rows (the last padded): one
    GEMM shape."""
    padded = F.pad(x, (0, 0, 0, (-x.shape[0]) % ROUTER_ROWS))
    return torch.cat([project(block) for block in padded.split(ROUTER_ROWS)])[:x.shape[0]]


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's softmax in fp32, each token's top k experts and their probabilities renormalised
    to sum to 1."""
    top, experts = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), k, dim=-1)
    return top / top.sum(dim=-1, keepdim=True), experts


def expert_sum(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor,
               down: torch.Tensor, act) -> torch.Tensor:
    """x [N, H] through each token's experts [N, k] (gated MLPs act(gate) x up, then down), each
    output scaled by its weight and a token's k summed in one reduction."""
    # [N, k, H]: each token's weighted expert outputs
    slots = x.new_empty((*experts.shape, x.shape[-1]))
    for expert in torch.unique(experts).tolist():
        rows, slot = torch.where(experts == expert)
        gate, up = F.linear(x[rows], gate_up[expert]).chunk(2, dim=-1)
        slots[rows, slot] = F.linear(act(gate) * up, down[expert]) * weights[rows, slot, None]
    return slots.sum(dim=1)


class ScaledRouterExperts(nn.Module):
    """Gemma 4's mixture of experts (modeling_gemma4.py Gemma4TextRouter, Gemma4TextExperts), beside
    its dense MLP: the router reads the layer's input RMS-normed without a weight, times `scale` and
    hidden**-0.5; its softmax in fp32, each token's top k renormalised and times its expert's
    per_expert_scale; the experts, GELU (tanh) gated MLPs, read their own normed input. `norm`: the
    family's RMSNorm (x, weight or None) → x's dtype."""

    def __init__(self, weights: dict[str, torch.Tensor], linear, top: int, norm):
        super().__init__()
        self.proj = linear(weights["router.proj.weight"])
        self.scale, self.per_expert, self.gate_up, self.down = (
            nn.Parameter(weights[name], requires_grad=False)
            for name in ("router.scale", "router.per_expert_scale", "experts.gate_up_proj",
                         "experts.down_proj"))
        self.top, self.norm = top, norm

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x [N, H] (the router's input) and h [N, H] (the experts') → [N, H]."""
        logits = router_logits(self.norm(x, None) * self.scale * x.shape[-1] ** -0.5, self.proj)
        weights, experts = top_k(logits, self.top)
        weights = weights * self.per_expert[experts]
        return expert_sum(h, weights, experts, self.gate_up, self.down,
                          lambda g: F.gelu(g, approximate="tanh")).to(h.dtype)
