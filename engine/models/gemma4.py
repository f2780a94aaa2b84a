"""Gemma 4 (transformers `model_type: gemma4`, Gemma4ForConditionalGeneration; gemma-4-E4B-it),
image and text.

The vision side is transformers' own modules: Gemma4VisionModel (patches of an aspect-preserving
resize within max_soft_tokens x pooling_kernel_size² patches, 2-D positions, pooled k x k, its
padding stripped) and Gemma4MultimodalEmbedder (an unscaled RMSNorm and a projection); the cache
keeps the projected [n, hidden] features per image, n the image's own soft-token count. The prompt's
`<|image|>` becomes `<|image>` + n x `<|image|>` + `<image|>` (Gemma4Processor.replace_image_token).
The audio tower and its embedder, where a checkpoint has them (the E2B/E4B), are not loaded:
image-text prompts never reach them (Gemma4Model.forward runs the audio tower only for
input_features), and video is not run.

The language model, and how it differs from Gemma 3's: gemma4_text.py.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError, load_module, no_init
from ..inputs.plan import PromptLayout
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family
from .gemma4_text import MOE_NORMS, Gemma4DecoderLayer, PerLayerInputs, rotaries, text_dims

BOI, EOI, IMAGE = "<|image>", "<image|>", "<|image|>"
NAME_RULES = [
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?language_model\.(?:model\.)?", "lm."),
    (r"^(?:model\.)?vision_tower\.", "vision."),
    (r"^(?:model\.)?embed_vision\.", "embedder."),
]
# the audio side: image-text prompts never run it
IGNORED = (r"^(?:model\.)?(?:audio_tower|embed_audio)\.",)
SIDE_TENSORS = ("embed_tokens_per_layer.weight", "per_layer_model_projection.weight",
                "per_layer_projection_norm.weight")


class Gemma4Model(Family):
    """Everything the engine needs from one Gemma 4 checkpoint (image and text)."""

    family = "gemma4"
    name = "Gemma 4"
    seed_model = "Gemma-4-E4B-it"
    inner_types = {"text_config": ("gemma4_text",), "vision_config": ("gemma4_vision",)}
    default_template = "gemma4_chat"
    image_marker = IMAGE
    own_aspect = "resizes every image within its patch budget, keeping its aspect"

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoImageProcessor, AutoTokenizer

        super().__init__(folder, settings)
        self.config = cfg = self.auto_config()
        if cfg.vision_config is None:
            raise CheckpointError(f"{folder}/config.json: no vision_config (a text-only Gemma 4)")
        dims, heads = text_dims(cfg.text_config, folder)  # its refusals before anything is read
        self.tokenizer = self.shared(AutoTokenizer, "tokenizer files")
        self.image_token_id = cfg.image_token_id
        for token, wanted in ((BOI, cfg.boi_token_id), (EOI, cfg.eoi_token_id),
                              (IMAGE, cfg.image_token_id)):
            got = self.tokenizer.encode(token, add_special_tokens=False)
            if got != [wanted]:
                raise CheckpointError(f"{folder}: the tokenizer encodes {token} as {got}, "
                                      f"config.json says {wanted}")
        self.image_processor = self.pretrained(AutoImageProcessor, "image processor config")
        text = cfg.text_config
        parts = self._load(dims, heads)
        self.feature_fingerprint = self.fingerprint(
            {f"{group}.{k}": v for group in ("vision", "embedder")
             for k, v in parts.get(group, {}).items()})
        load_module(self.vision, parts.get("vision", {}), folder, "vision tower")
        load_module(self.embedder, parts.get("embedder", {}), folder, "vision embedder")
        self.vision, self.embedder = self.borrowed(self.vision), self.borrowed(self.embedder)
        side = {name: parts["lm"].pop(name) for name in SIDE_TENSORS if name in parts["lm"]}
        order = iter(range(dims.num_layers))  # DecoderLM builds the layers in order

        def layer(d, weights, linear):
            i = next(order)
            return Gemma4DecoderLayer(d, weights, linear, index=i, head_dim=heads[i][0],
                                      kv_heads=heads[i][1], device=self.device, dtype=self.dtype)

        self.lm = self.language_model(dims, parts["lm"], layer_class=layer)
        self.lm.layer_rotary = rotaries(text, heads, self.device)
        self.lm.rotary = self.lm.layer_rotary[0]
        if side:
            self.lm.layer_inputs = PerLayerInputs(side, text, self.linear, cfg.image_token_id,
                                                  self.device, self.dtype)
        self._ids: dict[str, list[int]] = {}

    def _load(self, dims: DecoderDims,
              heads: list[tuple[int, int]]) -> dict[str, dict[str, torch.Tensor]]:
        """Every tensor, grouped lm / vision / embedder (tied: the published checkpoints store
        no lm_head)."""
        from transformers import AutoModel
        from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder

        cfg, text = self.config, self.config.text_config
        with no_init():
            self.vision = AutoModel.from_config(cfg.vision_config)
            self.embedder = Gemma4MultimodalEmbedder(cfg.vision_config, text)
        h, v = dims.hidden_size, dims.vocab_size
        expected = {"lm.embed_tokens.weight": (v, h), "lm.norm.weight": (h,),
                    "lm.lm_head.weight": (v, h)}
        width = text.hidden_size_per_layer_input
        if width:
            expected |= {"lm.embed_tokens_per_layer.weight": (text.vocab_size_per_layer_input,
                                                              dims.num_layers * width),
                         "lm.per_layer_model_projection.weight": (dims.num_layers * width, h),
                         "lm.per_layer_projection_norm.weight": (width,)}
        for i, (d, kv) in enumerate(heads):
            p = f"lm.layers.{i}."
            wide = dims.intermediate_size * (2 if text.use_double_wide_mlp and dims.kv_of(i) != i
                                             else 1)
            expected |= {p + f"{n}_layernorm.weight": (h,) for n in (
                "input", "post_attention", "pre_feedforward", "post_feedforward")}
            expected |= {p + "self_attn.q_proj.weight": (dims.num_heads * d, h),
                         p + "self_attn.q_norm.weight": (d,),
                         p + "self_attn.o_proj.weight": (h, dims.num_heads * d),
                         p + "layer_scalar": (1,),
                         p + "mlp.gate_proj.weight": (wide, h), p + "mlp.up_proj.weight": (wide, h),
                         p + "mlp.down_proj.weight": (h, wide)}
            if dims.kv_of(i) == i:
                expected |= {p + "self_attn.k_proj.weight": (kv * d, h),
                             p + "self_attn.k_norm.weight": (d,)}
                if not (text.attention_k_eq_v and not dims.slides(i)):
                    expected[p + "self_attn.v_proj.weight"] = (kv * d, h)
            if dims.experts:
                e, w = dims.experts, dims.expert_size
                expected |= {p + f"{n}.weight": (h,) for n in MOE_NORMS}
                expected |= {p + "router.proj.weight": (e, h), p + "router.scale": (h,),
                             p + "router.per_expert_scale": (e,),
                             p + "experts.gate_up_proj": (e, 2 * w, h),
                             p + "experts.down_proj": (e, h, w)}
            if width:
                expected |= {p + "per_layer_input_gate.weight": (width, h),
                             p + "per_layer_projection.weight": (h, width),
                             p + "post_per_layer_input_norm.weight": (h,)}
        expected.update({f"vision.{k}": tuple(t.shape)
                         for k, t in self.vision.state_dict().items()})
        expected.update({f"embedder.{k}": tuple(t.shape)
                         for k, t in self.embedder.state_dict().items()})
        shared = tuple(rf"^(?:model\.)?language_model\.(?:model\.)?layers\.{i}\."
                       r"self_attn\.[kv]_(?:proj|norm)\."
                       for i in range(dims.num_layers) if dims.kv_of(i) != i)  # stored, never read
        return self.load_parts(NAME_RULES, expected, ignore=IGNORED + shared)

    def tied(self) -> bool:
        """Tied unless an lm_head is stored all the same (as Gemma 3's)."""
        stored = self.stores_lm_head(NAME_RULES)
        return bool(getattr(self.config, "tie_word_embeddings", True)) and not stored

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(),
                "backend": type(self.image_processor).__name__}

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """One image → [max_patches, patch pixels + 2]: Gemma4ImageProcessor's patches (padding
        rows zero) with each patch's (x, y) position beside it (-1, -1 on padding), one array for
        the cache."""
        out = self.image_processor(images=image, return_tensors="np")
        return np.concatenate([out["pixel_values"][0],
                               out["image_position_ids"][0].astype(np.float32)], axis=1)

    def vision_tokens(self, pixels: np.ndarray) -> int:
        return int((pixels[:, -1] >= 0).sum())

    @torch.inference_mode()
    def encode_images(self, pixels: list[np.ndarray]) -> list[torch.Tensor]:
        """preprocess() outputs → per image its projected soft tokens [n, hidden]
        (Gemma4Model.get_image_features)."""
        x = torch.from_numpy(np.stack(pixels))
        positions = x[..., -2:].long().to(self.device)
        values = x[..., :-2].to(self.device, self.dtype)
        hidden = self.vision(pixel_values=values, pixel_position_ids=positions).last_hidden_state
        features = self.embedder(hidden)
        pooled = self.config.vision_config.pooling_kernel_size**2
        return list(features.split([self.vision_tokens(p) // pooled for p in pixels]))

    def prompt_ids(self, prompt: str, tokens: int) -> list[int]:
        """The prompt's ids as Gemma4Processor makes them, without added specials (the chat template
        writes <bos>): its `<|image|>` expanded to the image's `tokens` soft tokens between <|image>
        and <image|>."""
        if prompt.count(IMAGE) != 1:
            raise ValueError(f"prompt must hold exactly one {IMAGE}: {prompt!r}")
        before, after = prompt.split(IMAGE)
        ids = [self._ids.setdefault(part, self.tokenizer.encode(part, add_special_tokens=False))
               for part in (before, after)]
        cfg = self.config
        return (ids[0] + [cfg.boi_token_id] + [cfg.image_token_id] * tokens + [cfg.eoi_token_id]
                + ids[1])

    def text_ids(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        return PromptLayout.of(self.prompt_ids(prompt, features.shape[0]), self.image_token_id)

    def vision_flops(self, counts: Counts) -> float:
        """Per patch the vision layers and patch embedding; per soft token the projection."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d = vc.hidden_size
        per_patch = (2 * vc.num_hidden_layers * (4 * d * d + 3 * d * vc.intermediate_size)
                     + 2 * 3 * vc.patch_size**2 * d)
        return (per_patch + 2 * d * h / vc.pooling_kernel_size**2) * counts.vision_tokens

    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """What Gemma4Processor makes of one image and prompt (transformers cannot build it here:
        its video half needs torchvision): the image processor's patches and positions, the prompt's
        `<|image|>` expanded (replace_image_token), tokenized without added specials,
        mm_token_type_ids 1 on the soft tokens."""
        from transformers import AutoImageProcessor, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        image_processor = AutoImageProcessor.from_pretrained(str(checkpoint))
        image_id = tokenizer.convert_tokens_to_ids(IMAGE)

        def process(images, text: str, return_tensors: str):
            pixels = image_processor(images=images, return_tensors=return_tensors)
            tokens = int(pixels.pop("num_soft_tokens_per_image")[0])
            encoded = tokenizer(text.replace(IMAGE, BOI + IMAGE * tokens + EOI),
                                return_tensors=return_tensors, add_special_tokens=False)
            return {**encoded, **pixels,
                    "mm_token_type_ids": (encoded["input_ids"] == image_id).int()}


        process.tokenizer = tokenizer
        return process
