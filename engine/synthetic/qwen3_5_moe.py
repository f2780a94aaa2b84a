"""Qwen3.5-MoE's random checkpoints (Qwen3.5-35B-A3B's shape and a tiny one), written as Qwen3.5's
(its stand-in tokenizer and processor)."""
from __future__ import annotations

from pathlib import Path

from ..models.qwen3_5_moe import Qwen3_5MoeModel
from .qwen3_5 import SIZES as DENSE
from .qwen3_5 import write_family_checkpoint

# Qwen3.5-35B-A3B ("7b" is the tables' name for the seed size; 36B parameters): transformers'
# Qwen3_5MoeConfig defaults, as a public copy of its config.json gives them too (40 layers, three
# DeltaNet to one full attention; 16 query and 2 KV heads of 256; 256 experts, 8 a token, 512 wide,
# and a shared expert 512 wide), the tower projecting to its hidden size 2048.
MOE_7B = dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
              head_dim=256, moe_intermediate_size=512, shared_expert_intermediate_size=512,
              num_experts=256, num_experts_per_tok=8)
SIZES = {
    "7b": dict(vision=dict(DENSE["7b"]["vision"], out_hidden_size=2048),
               text={**{k: v for k, v in DENSE["7b"]["text"].items() if k != "intermediate_size"},
                     **MOE_7B},
               processor=DENSE["7b"]["processor"]),
    # 4 experts, 2 a token, on each of the dense tiny's three layers (a DeltaNet layer first and
    # last)
    "tiny": dict(vision=DENSE["tiny"]["vision"],
                 text={**{k: v for k, v in DENSE["tiny"]["text"].items()
                          if k != "intermediate_size"},
                       "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                       "num_experts": 4, "num_experts_per_tok": 2},
                 processor=DENSE["tiny"]["processor"]),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", **kwargs) -> Path:
    """A random-weight Qwen3.5-MoE checkpoint (qwen3_5.write_family_checkpoint)."""
    return write_family_checkpoint(Qwen3_5MoeModel, SIZES, folder, dims, **kwargs)
