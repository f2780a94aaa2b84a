"""Qwen3.5-MoE (transformers `model_type: qwen3_5_moe`; Qwen3.5-35B-A3B, and the 122B-A10B
and 397B-A17B).

Qwen3.5's pipeline (qwen3_5.py: the processor, the tower, the hybrid of Gated DeltaNet and gated
full attention, the thinking template run off by default) with a mixture of experts as every layer's
MLP (modeling_qwen3_5_moe.py, Qwen3_5MoeSparseMoeBlock): each token through its top
`num_experts_per_tok` of `num_experts` gated MLPs `moe_intermediate_size` wide, routed as
Qwen3-VL-MoE's are, plus a shared expert `shared_expert_intermediate_size` wide scaled by the
sigmoid of its one-row gate (engine/layers/moe.py). The experts are read fused, as the published
checkpoints hold them, or one tensor each, as transformers' save_pretrained writes them.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ..layers.deltanet import HybridDims
from ..utils.loader import CheckpointError, tensor_files
from .qwen3_5 import Qwen3_5Model

# a tensor of one expert (transformers' save_pretrained layout)
SPLIT = re.compile(r"\.mlp\.experts\.\d+\.")


class Qwen3_5MoeModel(Qwen3_5Model):
    """Everything the engine needs from one Qwen3.5-MoE checkpoint."""

    family = "qwen3_5_moe"
    name = "Qwen3.5-MoE"
    seed_model = "Qwen3.5-35B-A3B"
    inner_types = {"text_config": ("qwen3_5_moe_text",), "vision_config": ("qwen3_5_moe_vision",)}

    def text_dims(self, text_config) -> HybridDims:
        """Qwen3.5's, with every layer's experts, the shared expert, and how the checkpoint stores
        the experts."""
        if not 0 < text_config.num_experts_per_tok <= text_config.num_experts:
            raise CheckpointError(f"{self.folder}/config.json: {text_config.num_experts_per_tok} "
                                  f"experts per token of {text_config.num_experts}: no such "
                                  "routing")

        split = any(SPLIT.search(name) for name in tensor_files(self.folder))
        return replace(super().text_dims(text_config), experts=text_config.num_experts,
                       experts_per_token=text_config.num_experts_per_tok,
                       expert_size=text_config.moe_intermediate_size,
                       shared_expert_size=text_config.shared_expert_intermediate_size,
                       experts_split=split)


    @staticmethod
    def transformers_classes() -> tuple[type, type, type]:
        from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeVisionModel

        return Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeVisionModel
