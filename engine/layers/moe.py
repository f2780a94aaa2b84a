"""The mixture-of-experts MLP of Qwen3-VL-MoE's decoder layers, as transformers computes it by default
(models/qwen3_vl_moe/modeling_qwen3_vl_moe.py: Qwen3VLMoeTextTopKRouter; integrations/moe.py: the "grouped_mm"
experts its configs select): the router's logits in the model's dtype, their softmax in fp32, each token's top-k
experts with those probabilities renormalised to sum to 1 and cast back; each chosen expert's gated MLP
(SiLU(gate) x up, then down) scaled by its weight, and a token's k outputs summed in one reduction over its
top-k slots (fp32 accumulation, one rounding; the class's eager loop adds in the model's dtype expert by expert,
which differs in fp16 by a rounding step).

Routing is batch-invariant: the router's matmul always runs on blocks of ROUTER_ROWS tokens (the last padded), one
GEMM shape whatever the batch, so a token's logits, experts and weights are the same bits alone or among any others
(tests/families/test_qwen3_vl_moe.py). bitsandbytes quantizes Linear
modules only, so under NF4 transformers keeps the router and the fused expert tensors in the compute dtype: so do
we.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .dims import DecoderDims


# Tokens per router matmul. A GEMM's kernel (and so its order of sums) follows its shape; with one shape, a row's
# result cannot depend on how many rows came with it.
ROUTER_ROWS = 64


class ExpertMLP(nn.Module):
    def __init__(self, dims: DecoderDims, weights: dict[str, torch.Tensor]):
        super().__init__()
        e, w, h = dims.experts, dims.expert_size, dims.hidden_size
        gate_up, down = weights["mlp.experts.gate_up_proj"], weights["mlp.experts.down_proj"]
        # transformers' own layout, else the published checkpoints' (last two axes swapped), as its loader decides:
        # a tensor already in its shape is kept
        if tuple(gate_up.shape) != (e, 2 * w, h):
            gate_up = gate_up.transpose(1, 2)
        if tuple(down.shape) != (e, h, w):
            down = down.transpose(1, 2)
        self.router = nn.Parameter(weights["mlp.gate.weight"], requires_grad=False)
        self.gate_up = nn.Parameter(gate_up.contiguous(), requires_grad=False)
        self.down = nn.Parameter(down.contiguous(), requires_grad=False)
        self.top_k = dims.experts_per_token

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] → (weights [N, k] in x's dtype, experts [N, k])."""
        padded = F.pad(x, (0, 0, 0, (-x.shape[0]) % ROUTER_ROWS))
        logits = torch.cat([F.linear(block, self.router) for block in padded.split(ROUTER_ROWS)])[:x.shape[0]]
        top, experts = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
        return (top / top.sum(dim=-1, keepdim=True)).to(logits.dtype), experts

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.reshape(-1, h.shape[-1])
        weights, experts = self.route(x)
        slots = x.new_empty((*experts.shape, x.shape[-1]))  # [N, k, H]: each token's weighted expert outputs
        for expert in torch.unique(experts).tolist():
            rows, slot = torch.where(experts == expert)
            gate, up = F.linear(x[rows], self.gate_up[expert]).chunk(2, dim=-1)
            slots[rows, slot] = F.linear(F.silu(gate) * up, self.down[expert]) * weights[rows, slot, None]
        return slots.sum(dim=1).reshape(h.shape)
