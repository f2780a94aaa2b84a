"""Qwen3.5 (transformers `model_type: qwen3_5`; Qwen3.5-9B, the dense models of the 2026 tables).

Qwen3-VL's pixel path without DeepStack (the processor is Qwen2-VL's with 16-px patches; the tower
is transformers' Qwen3_5VisionModel, whose merger's output is the whole feature) and Qwen2-VL's
M-RoPE positions, interleaved as Qwen3-VL interleaves them. The language model is a hybrid
(transformers' models/qwen3_5/modeling_qwen3_5.py, engine/layers/deltanet.py and hybrid.py): three
of every four layers Gated DeltaNet linear attention with a short causal conv, the fourth full
attention whose query projection also makes a sigmoid output gate and whose RoPE turns only the
first partial_rotary_factor of each head's dims; every RMSNorm scales by (1 + w). The prefix is
reused by saving what each layer carries past it (KV, or the recurrent state and conv tail).

The default prompt renders the chat template with enable_thinking=False (template qwen3_5_chat: its
empty think block, or one closed after a block the template opens even then), so the prompt ends
where the answer begins: the thinking checkpoint's `off` mode, its default here; `--thinking decode`
reads the answer after its reasoning. The published checkpoints' multi-token-prediction head (mtp.*)
is not read, as transformers does not read it.
"""
from __future__ import annotations

from dataclasses import replace

from ..layers.decoder import DecoderDims
from ..layers.deltanet import HybridDims
from ..layers.hybrid import HybridLM
from ..utils.loader import CheckpointError, no_init
from ..utils.stats import Counts
from .qwen2_vl import NAME_RULES, Qwen2VLModel


class Qwen3_5Model(Qwen2VLModel):
    """Everything the engine needs from one Qwen3.5 checkpoint."""

    family = "qwen3_5"
    name = "Qwen3.5"
    seed_model = "Qwen3.5-9B"
    inner_types = {"text_config": ("qwen3_5_text",), "vision_config": ("qwen3_5_vision",)}
    default_template = "qwen3_5_chat"

    def text_dims(self, text_config) -> HybridDims:
        """Qwen3's q/k norms, (1 + w) norms, partial interleaved M-RoPE, and which layers
        are DeltaNet."""
        rope = text_config.rope_parameters or {}
        kinds = list(text_config.layer_types or ())
        if (len(kinds) != text_config.num_hidden_layers
                or set(kinds) - {"linear_attention", "full_attention"}):
            raise CheckpointError(f"{self.folder}/config.json: text_config.layer_types {kinds} is "
                                  "not one of linear_attention / full_attention for each of "
                                  f"{text_config.num_hidden_layers} layers")
        if "full_attention" not in kinds:
            raise CheckpointError(f"{self.folder}/config.json: no full_attention layer among "
                                  f"{kinds}")
        # transformers' Qwen3_5TextRotaryEmbedding interleaves whatever mrope_interleaved says,
        # sections [11, 11, 10] where none are given
        base = replace(DecoderDims.from_config(text_config), qk_norm=True, norm_unit_offset=True,
                       partial_rotary=float(rope.get("partial_rotary_factor", 1.0)),
                       mrope_interleaved=True,
                       mrope_section=tuple(rope.get("mrope_section") or (11, 11, 10)))
        return HybridDims.of(base, text_config)

    @staticmethod
    def transformers_classes() -> tuple[type, type, type]:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

        return Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5VisionModel

    def language_model(self, dims: HybridDims, weights) -> HybridLM:
        return HybridLM(dims, weights, dtype=self.dtype, device=self.device, quantize=self.quantize,
                        keep_packed=self.packed, quantize_lm_head=self.settings.quantize_lm_head,
                        kernels=self.settings.kernels)

    def _load(self, dims: HybridDims):
        with no_init():
            vision = self.transformers_classes()[2]._from_config(self.config.vision_config)
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        expected.update({f"vision.{k}": tuple(v.shape) for k, v in vision.state_dict().items()})
        parts = self.load_parts(NAME_RULES, expected, ignore=(r"^mtp\.",))
        return parts["lm"], parts["vision"], vision

    def vision_flops(self, counts: Counts) -> float:
        """Per patch (16 x 16 x 2 frames x 3 channels in) the blocks, the patch embedding and the
        merger, whose MLP runs once per four patches."""
        vc = self.config.vision_config
        d, merged = vc.hidden_size, vc.spatial_merge_size**2
        per_patch = (2 * vc.depth * (4 * d * d + 2 * d * vc.intermediate_size)
                     + 2 * 3 * vc.temporal_patch_size * vc.patch_size**2 * d
                     + 2 * ((merged * d) ** 2 + merged * d * vc.out_hidden_size) / merged)
        return per_patch * counts.vision_tokens

    def matmul_flops(self, counts: Counts) -> float:
        """Family.matmul_flops with each layer's own token mixer (DeltaNet's projections or the
        gated attention's)."""
        lm = self.lm.dims
        per_token = sum(lm.mixer_flops(i) + 6 * lm.hidden_size * lm.mlp_width(i)
                        for i in range(lm.num_layers))
        return (self.vision_flops(counts)
                + per_token * (counts.prefix_tokens + counts.suffix_tokens)
                + 2 * counts.prompts * lm.hidden_size * lm.vocab_size)

