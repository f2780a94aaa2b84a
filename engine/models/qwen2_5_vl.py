"""Qwen2.5-VL (transformers `model_type: qwen2_5_vl`; Qwen2.5-VL-7B-Instruct).

Qwen2-VL's pipeline with a new vision tower: the same processor (14-px patches of two frames, 2 x 2
merging, images resized to multiples of 28 px within a pixel budget), the same Qwen2 language model
with M-RoPE and the same positions for a still image (transformers spaces the temporal stream by
tokens_per_second * second_per_grid_ts for videos only; an image has one frame at temporal 0). The
tower differs: RMSNorm, a gated SiLU MLP, 2-D rotary embeddings, and attention within windows of
window_size px (merge groups permuted window by window, the merger's output put back in raster order)
except in the fullatt_block_indexes blocks, which attend over the whole image. The tower is
transformers' own module, as for Qwen2-VL; everything else is Qwen2VLModel's.
"""
from __future__ import annotations

from ..stats import Counts
from .qwen2_vl import Qwen2VLModel


class Qwen2_5_VLModel(Qwen2VLModel):
    """Everything the engine needs from one Qwen2.5-VL checkpoint."""

    family = "qwen2_5_vl"
    name = "Qwen2.5-VL"
    seed_model = "Qwen2.5-VL-7B-Instruct"
    inner_types = {"text_config": ("qwen2_5_vl_text",), "vision_config": ("qwen2_5_vl_vision",)}

    @staticmethod
    def transformers_classes() -> tuple[type, type, type]:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

        return Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VisionTransformerPretrainedModel

    def vision_flops(self, counts: Counts) -> float:
        """Per patch (14 x 14 x 2 frames x 3 channels in) the blocks (q/k/v and output projections, the
        gated MLP's three matrices; windows change the attention scores only), the patch embedding, and
        the merger, whose MLP runs once per four patches."""
        vc = self.config.vision_config
        d, merged = vc.hidden_size, vc.spatial_merge_size**2
        per_patch = 2 * vc.depth * (4 * d * d + 3 * d * vc.intermediate_size) + 2 * 3 * vc.temporal_patch_size \
            * vc.patch_size**2 * d + 2 * ((merged * d) ** 2 + merged * d * vc.out_hidden_size) / merged
        return per_patch * counts.vision_tokens
