"""Qwen3-VL (transformers `model_type: qwen3_vl`; Qwen3-VL-8B-Instruct).

Qwen2-VL's pipeline with four changes, each transformers' (models/qwen3_vl/modeling_qwen3_vl.py):
- the processor is Qwen2-VL's with 16-px patches (images resized to multiples of 32 px within its
  pixel budget, mean and std 0.5; a 640 x 480 image: 20 x 15 = 300 merged tokens); the tower
  (transformers' own module) adds learned position embeddings, bilinearly resampled to each grid, to
  2-D rotary ones;
- M-RoPE is interleaved (`mrope_interleaved`): frequency j takes the height stream where j % 3 == 1,
  the width stream where j % 3 == 2 (within 3 x mrope_section of each), the temporal one elsewhere;
  the positions themselves are Qwen2-VL's (get_rope_index gives a still image the same streams);
- the language model is Qwen3: no q/k/v biases, an RMSNorm over each head of q and k before RoPE;
- DeepStack: the tower's blocks in deepstack_visual_indexes each feed a merger of their own, whose
  output is added to the image positions' hidden states after language-model layers 0, 1, ... . The
  features the cache keeps are [rows, cols, (1 + deepstack) x hidden]: the merged features, then
  each DeepStack block (DecoderDims.deepstack). Image positions lie in the prefix, so its prefill
  adds them.
A thinking checkpoint (Qwen3-VL-*-Thinking: its chat template opens a <think> block after the
assistant turn) runs under a named mode (engine/thinking.py, `--thinking`), as any family's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError
from ..utils.stats import Counts
from .qwen2_vl import Qwen2VLModel


class Qwen3VLModel(Qwen2VLModel):
    """Everything the engine needs from one Qwen3-VL checkpoint."""

    family = "qwen3_vl"
    name = "Qwen3-VL"
    seed_model = "Qwen3-VL-8B-Instruct"
    inner_types = {"text_config": ("qwen3_vl_text",), "vision_config": ("qwen3_vl_vision",)}

    def text_dims(self, text_config) -> DecoderDims:
        """Qwen3: q_norm and k_norm, no q/k/v biases; one DeepStack block per
        deepstack_visual_indexes entry."""
        vision = self.config.vision_config
        deepstack = len(vision.deepstack_visual_indexes)
        outside = [i for i in vision.deepstack_visual_indexes
                   if not (isinstance(i, int) and 0 <= i < vision.depth)]
        if outside:  # a DeepStack block is one of the tower's: an index past its depth names none
            raise CheckpointError(f"{self.folder}/config.json: "
                                  "vision_config.deepstack_visual_indexes "
                                  f"{vision.deepstack_visual_indexes} names blocks outside the "
                                  f"tower's {vision.depth}")

        if deepstack > text_config.num_hidden_layers:
            raise CheckpointError(f"{self.folder}/config.json: {deepstack} DeepStack blocks for "
                                  f"{text_config.num_hidden_layers} language-model layers")
        return replace(DecoderDims.from_config(text_config), qk_norm=True, deepstack=deepstack)

    @staticmethod
    def transformers_classes() -> tuple[type, type, type]:
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

        return Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLVisionModel

    @torch.inference_mode()
    def encode_images(self,
                      pixels: list[tuple[np.ndarray, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """preprocess() outputs → per image [rows, cols, (1 + deepstack) x hidden]: the merger's
        features, then each DeepStack merger's, in deepstack_visual_indexes order."""
        device, dtype = self.settings.torch_device, self.settings.torch_dtype
        patches = torch.from_numpy(np.concatenate([p for p, _ in pixels])).to(device, dtype)
        grid = torch.tensor([g for _, g in pixels], device=device)
        out = self.vision(hidden_states=patches, grid_thw=grid)
        merged = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)
        sizes = [h * w // self.merge**2 for _, (_, h, w) in pixels]
        return [f.reshape(h // self.merge, w // self.merge, -1)
                for f, (_, (_, h, w)) in zip(merged.split(sizes), pixels)]

    def vision_flops(self, counts: Counts) -> float:
        """Per patch (16 x 16 x 2 frames x 3 channels in) the blocks (q/k/v and output
        projections, the two-matrix MLP), the patch embedding, and the merger and each DeepStack
        merger, whose MLPs run once per four patches (the learned position embeddings are a
        lookup, not a matmul)."""
        vc = self.config.vision_config
        d, merged = vc.hidden_size, vc.spatial_merge_size**2
        mergers = 1 + len(vc.deepstack_visual_indexes)
        per_patch = (2 * vc.depth * (4 * d * d + 2 * d * vc.intermediate_size)
                     + 2 * 3 * vc.temporal_patch_size * vc.patch_size**2 * d
                     + 2 * mergers * ((merged * d) ** 2 + merged * d * vc.out_hidden_size) / merged)

        return per_patch * counts.vision_tokens
