"""Qwen3-VL-MoE (transformers `model_type: qwen3_vl_moe`; Qwen3-VL-30B-A3B-Instruct, the size many
2026 POPE tables start from).

Qwen3-VL's pipeline (qwen3_vl.py: processor, tower, DeepStack, interleaved M-RoPE, Qwen3's q/k
norms) with a mixture of experts in place of the MLP on the layers its config makes sparse: every
`decoder_sparse_step`-th layer but those in `mlp_only_layers` (modeling_qwen3_vl_moe.py,
Qwen3VLMoeTextDecoderLayer), each token through its top `num_experts_per_tok` of `num_experts` gated
MLPs `moe_intermediate_size` wide (engine/layers/moe.py).
"""
from __future__ import annotations

from dataclasses import replace

from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError
from .qwen3_vl import Qwen3VLModel


class Qwen3VLMoeModel(Qwen3VLModel):
    """Everything the engine needs from one Qwen3-VL-MoE checkpoint."""

    family = "qwen3_vl_moe"
    name = "Qwen3-VL-MoE"
    seed_model = "Qwen3-VL-30B-A3B-Instruct"
    inner_types = {"text_config": ("qwen3_vl_moe_text",), "vision_config": ("qwen3_vl_moe_vision",)}

    def text_dims(self, text_config) -> DecoderDims:
        """Qwen3-VL's, with the experts and which layers hold them."""
        layers, step = text_config.num_hidden_layers, text_config.decoder_sparse_step
        dense = set(text_config.mlp_only_layers or ())
        if text_config.num_experts_per_tok > text_config.num_experts or step < 1:
            raise CheckpointError(f"{self.folder}/config.json: {text_config.num_experts_per_tok} "
                                  f"experts per token of {text_config.num_experts}, "
                                  f"decoder_sparse_step {step}: no such routing")

        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
        return replace(super().text_dims(text_config), experts=text_config.num_experts,
                       experts_per_token=text_config.num_experts_per_tok,
                       expert_size=text_config.moe_intermediate_size, sparse_layers=sparse)

    @staticmethod
    def transformers_classes() -> tuple[type, type, type]:
        from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
        from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeVisionModel

        return Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration, Qwen3VLMoeVisionModel
