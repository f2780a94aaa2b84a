"""Qwen2.5-VL's random checkpoints (Qwen2.5-VL-7B-Instruct's shape and the tiny one), written
as Qwen2-VL's."""
from __future__ import annotations

from pathlib import Path

from ..models.qwen2_5_vl import Qwen2_5_VLModel
from .qwen2_vl import write_family_checkpoint

# Qwen2.5-VL-7B-Instruct: a 32-block, 1280-wide ViT (windows of 112 px = 4 x 4 merged tokens,
# whole-image attention in blocks 7, 15, 23, 31) merging 2 x 2 patches into Qwen2-7B's width,
# Qwen2-7B with M-RoPE.
SIZES = {
    "7b": dict(vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                           out_hidden_size=3584, window_size=112,
                           fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2,
                           hidden_act="silu"),
               text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                         rms_norm_eps=1e-6, max_position_embeddings=128000, rope_theta=1e6,
                         rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})),
    "tiny": dict(vision=dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4,
                             out_hidden_size=128, window_size=112, fullatt_block_indexes=[1, 3],
                             tokens_per_second=2, hidden_act="silu"),
                 text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=152064,
                           rms_norm_eps=1e-6, max_position_embeddings=32768, rope_theta=1e6,
                           rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", **kwargs) -> Path:
    """A random-weight Qwen2.5-VL checkpoint (qwen2_vl.write_family_checkpoint)."""
    return write_family_checkpoint(Qwen2_5_VLModel, SIZES, folder, dims, **kwargs)
