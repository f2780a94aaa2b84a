"""Qwen3-VL-MoE's random checkpoints (Qwen3-VL-30B-A3B-Instruct's shape and a tiny one), written
as Qwen2-VL's."""
from __future__ import annotations

from pathlib import Path

from ..models.qwen3_vl_moe import Qwen3VLMoeModel
from .qwen2_vl import write_family_checkpoint
from .qwen3_vl import PROCESSOR, SIZES as DENSE

# Qwen3-VL-30B-A3B-Instruct ("7b" is the table's name for the seed size; this one has 31B
# parameters, 62 GB in fp16): Qwen3-VL-8B's tower projecting to 2048, and 48 layers of 128 experts,
# 8 a token, each 768 wide (its published config.json: hidden 2048, 32 heads of 128, 4 kv heads,
# every layer sparse).
SIZES = {
    "7b": dict(vision=dict(DENSE["7b"]["vision"], out_hidden_size=2048),
               text=dict(DENSE["7b"]["text"], hidden_size=2048, intermediate_size=6144,
                         num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                         head_dim=128, moe_intermediate_size=768, num_experts=128,
                         num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[]),
               processor=PROCESSOR),
    "tiny": dict(vision=DENSE["tiny"]["vision"],
                 text=dict(DENSE["tiny"]["text"], moe_intermediate_size=64, num_experts=8,
                           num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1]),
                 processor=DENSE["tiny"]["processor"]),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", **kwargs) -> Path:
    """A random-weight Qwen3-VL-MoE checkpoint (qwen2_vl.write_family_checkpoint)."""
    return write_family_checkpoint(Qwen3VLMoeModel, SIZES, folder, dims, **kwargs)
