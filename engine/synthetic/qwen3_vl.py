"""Qwen3-VL's random checkpoints (Qwen3-VL-8B-Instruct's shape and the tiny one), written
as Qwen2-VL's."""
from __future__ import annotations

from pathlib import Path

from ..models.qwen3_vl import Qwen3VLModel
from .qwen2_vl import write_family_checkpoint

# The processor of Qwen3-VL-8B-Instruct's preprocessor_config.json: 16-px patches, 2 x 2 merging,
# 2 frames.
PROCESSOR = dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                 image_std=[0.5] * 3, min_pixels=65536, max_pixels=16777216)

# Qwen3-VL-8B-Instruct ("7b" is the table's name for the seed size): a 27-block, 1152-wide ViT with
# DeepStack from blocks 8, 16, 24, merging 2 x 2 patches into Qwen3-8B's width; Qwen3-8B with
# interleaved M-RoPE (field for field the published config.json as public copies of it give it, e.g.
# TensorRT-LLM's Qwen3-VL-8B-Instruct test config; its lm_head is not tied).
SIZES = {
    "7b": dict(vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                           out_hidden_size=4096, patch_size=16, num_position_embeddings=2304,
                           deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh"),
               text=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         vocab_size=151936, rms_norm_eps=1e-6, max_position_embeddings=262144,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                          "mrope_section": [24, 20, 20],
                                          "mrope_interleaved": True}),
               processor=PROCESSOR),
    "tiny": dict(vision=dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4,
                             out_hidden_size=128, patch_size=16, num_position_embeddings=64,
                             deepstack_visual_indexes=[1, 2], hidden_act="gelu_pytorch_tanh"),
                 text=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           vocab_size=151936, rms_norm_eps=1e-6, max_position_embeddings=32768,
                           rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                            "mrope_section": [6, 5, 5], "mrope_interleaved": True}),
                 processor=dict(PROCESSOR, max_pixels=1024 * 32 * 32)),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", **kwargs) -> Path:
    """A random-weight Qwen3-VL checkpoint (qwen2_vl.write_family_checkpoint)."""
    return write_family_checkpoint(Qwen3VLModel, SIZES, folder, dims, **kwargs)
