"""mPLUG-Owl2 (X-PLUG's `model_type: mplug_owl2`; MAGAer13/mplug-owl2-llama2-7b).

A ViT-L/14 at 448 px (fused `query_key_value`, pre- and post-layernorm) whose 1,025 outputs a
visual abstractor reduces to 64 queries (cross-attention over [queries; ViT tokens] with fixed
sin-cos position tables, a SwiGLU MLP with `ffn_ln`), projected by `visual_fc` and followed by
`vit_eos`: 65 image tokens. The language model is LLaMA-2 made modality-adaptive: image
positions use their own (`multiway.1`) k_proj, v_proj, input_layernorm and
post_attention_layernorm, text positions `multiway.0`; q_proj, o_proj and the MLP are shared.
transformers has no class for it, so every module here is ours, checked against the upstream
code's outputs (tests/families/test_mplug_owl2.py).

The prompt: upstream's `tokenizer_image_token` splits at `<|image|>`, tokenizes each chunk with BOS
under the slow (sentencepiece) LlamaTokenizer of transformers 4.31 and drops the BOS of later
chunks; the image sits at the sentinel id -200, which is not a vocabulary id.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..inputs.coded_pixels import CodedPixels, pixels_on_device
from ..inputs.images import ClipPixels, checked_fast_path
from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError, load_grouped, read_config
from ..inputs.plan import PromptLayout
from ..inputs.prompts import PromptMemo
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family
from .mplug_owl2_nets import (ACTIVATIONS, AbstractorDims, MultiwayDecoderLayer, VisionDims,
                              VisionTower, VisualAbstractor, config_dims, lm_expected_shapes)

MODEL_TYPE = "mplug_owl2"
IMAGE_MARKER = "<|image|>"
IMAGE_TOKEN_INDEX = -200  # upstream's IMAGE_TOKEN_INDEX: a sentinel, spliced before embedding

NAME_RULES = [
    (r"^lm_head\.", "lm.lm_head."),
    (r"^model\.vision_model\.", "vision."),
    (r"^model\.visual_abstractor\.", "abstractor."),
    (r"^model\.", "lm."),
]
# Buffers upstream saves that are recomputed here.
IGNORED = (r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$",)
TOP_LEVEL = ("visual_config", "model_type", "architectures")  # config keys that are not LLaMA's


def parse_config(folder: Path) -> tuple[dict, DecoderDims, VisionDims, AbstractorDims]:
    """config.json → (the raw config, the language model's, the ViT's and the abstractor's
    dims)."""
    from transformers import LlamaConfig

    raw = read_config(folder)
    if raw.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"{folder}/config.json: model_type {raw.get('model_type')!r} is not "
                              f"{MODEL_TYPE!r}")
    visual = raw.get("visual_config") or {}
    if not isinstance(visual, dict):
        raise CheckpointError(f"{folder}/config.json: visual_config is not an object")
    text = {k: v for k, v in raw.items() if k not in TOP_LEVEL}
    text.setdefault("rms_norm_eps", 1e-6)  # upstream's LlamaConfig default
    if text.get("rope_scaling") is None:
        text.pop("rope_scaling", None)
    dims = DecoderDims.from_config(LlamaConfig(**text))
    vision = config_dims(VisionDims, visual.get("visual_model"),
                         f"{folder}/config.json visual_config.visual_model")
    abstractor = config_dims(AbstractorDims, visual.get("visual_abstractor"),
                       f"{folder}/config.json visual_config.visual_abstractor")
    if vision.hidden_act not in ACTIVATIONS:
        raise CheckpointError(f"{folder}/config.json: visual_model.hidden_act "
                              f"{vision.hidden_act!r} is not supported")
    if abstractor.encoder_hidden_size != vision.hidden_size:
        raise CheckpointError(f"{folder}/config.json: visual_abstractor.encoder_hidden_size "
                              f"{abstractor.encoder_hidden_size} differs from the ViT's "
                              f"{vision.hidden_size}")
    if (abstractor.grid_size ** 2 + 1) != vision.tokens:
        raise CheckpointError(f"{folder}/config.json: visual_abstractor.grid_size "
                              f"{abstractor.grid_size} does not cover the ViT's "
                              f"{vision.tokens - 1} patches")
    return raw, dims, vision, abstractor


def legacy_llama_tokenizer(tokenizer):
    """The checkpoint's LLaMA tokenizer with the encoding of the slow sentencepiece
    LlamaTokenizer that upstream loads (transformers 4.31, `use_fast=False`): every text gets
    the "▁" prefix and its spaces become "▁" before the BPE, so " Yes" is [▁, Yes] and "USER:
    " ends in the lone "▁" (29871). transformers 5 builds a Metaspace pre-tokenizer instead,
    which prefixes no "▁" to a text that starts with a space and so gives other ids there."""
    from tokenizers import Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise CheckpointError(f"tokenizer {type(tokenizer).__name__} has no tokenizers backend "
                              "to rebuild")
    # not sentencepiece's (a built-in word-level one)
    if json.loads(backend.to_str())["model"]["type"] != "BPE":
        return tokenizer
    backend = Tokenizer.from_str(backend.to_str())
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tokenizer.bos_token,
                                   eos_token=tokenizer.eos_token, unk_token=tokenizer.unk_token,
                                   pad_token=tokenizer.pad_token,
                                   clean_up_tokenization_spaces=False)


def tokenizer_image_token(tokenizer, prompt: str) -> list[int]:
    """Upstream's prompt ids: the prompt split at <|image|>, each non-empty chunk tokenized with
    BOS; when the first chunk starts with BOS it is kept once and every chunk's first id is dropped;
    IMAGE_TOKEN_INDEX between the chunks."""
    chunks = [list(tokenizer(c)["input_ids"]) if c else [] for c in prompt.split(IMAGE_MARKER)]
    offset = 1 if chunks[0] and chunks[0][0] == tokenizer.bos_token_id else 0
    ids = chunks[0][:offset]
    for i, chunk in enumerate(chunks):
        ids += ([IMAGE_TOKEN_INDEX] if i else []) + chunk[offset:]
    return ids


class MplugOwl2Model(Family):
    """Everything the engine needs from one mPLUG-Owl2 checkpoint: its language model is a DecoderLM
    of MultiwayDecoderLayers, which route each position by the image mask of the prompt's layout."""

    family = MODEL_TYPE
    name = "mPLUG-Owl2"
    seed_model = "mPLUG-Owl2-LLaMA2-7B"
    default_template = "mplug_owl2"
    image_marker = IMAGE_MARKER
    image_token_id = IMAGE_TOKEN_INDEX
    own_aspect = "stretches each image to a square"
    # Its agreement with the upstream implementation is what the tests prove, on the upstream
    # code's outputs.
    reference_unavailable = ("no transformers class (upstream X-PLUG code, transformers 4.31, "
                             "not installed)")

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoImageProcessor, AutoTokenizer, PretrainedConfig

        super().__init__(folder, settings)
        self.config, self.dims, vision_dims, abstractor_dims = parse_config(folder)
        # a config of no model_type: left to itself, AutoTokenizer reads config.json, whose
        # mplug_owl2 transformers does not know, and warns of it on every load; the tokenizer's
        # class is tokenizer_config.json's either way
        self.tokenizer = legacy_llama_tokenizer(self.pretrained(AutoTokenizer, "tokenizer files",
                                                                config=PretrainedConfig()))
        self.image_processor = self.pretrained(AutoImageProcessor, "image processor files")
        expected = {f"lm.{k}": v for k, v in lm_expected_shapes(self.dims).items()}
        expected.update({f"vision.{k}": v for k, v in vision_dims.expected_shapes().items()})
        abstractor_shapes = abstractor_dims.expected_shapes(self.dims.hidden_size)
        expected.update({f"abstractor.{k}": v for k, v in abstractor_shapes.items()})

        parts = load_grouped(folder, NAME_RULES, expected, ignore=IGNORED)
        self.feature_fingerprint = self.fingerprint(
            {f"{g}.{k}": v for g in ("vision", "abstractor") for k, v in parts[g].items()})
        self.vision = VisionTower(vision_dims, parts["vision"], self.linear, self.dtype,
                                  self.device).eval()
        self.abstractor = VisualAbstractor(abstractor_dims, parts["abstractor"], self.linear,
                                           self.dtype, self.device).eval()
        self.lm = self.language_model(self.dims, parts["lm"], layer_class=MultiwayDecoderLayer)
        self._ids = PromptMemo(lambda prompt: tokenizer_image_token(self.tokenizer, prompt))
        self._fast_pixels = checked_fast_path(ClipPixels.for_processor(self.image_processor),
                                              self._processor_pixels)

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(),
                "backend": type(self.image_processor).__name__,
                "square": "stretch to the longer side, PIL default filter", "rgb": "convert"}

    def preprocess(self, image: Image.Image) -> np.ndarray | CodedPixels:
        """One image → pixel values [3, 448, 448] as upstream's evaluation makes them: RGB by a
        plain convert, stretched to a square of its longer side (Image.resize's default filter),
        then the checkpoint's CLIP processor (on the fast path as uint8 codes and their table,
        normalized on the device)."""
        image = image.convert("RGB")
        side = max(image.size)
        square = image.resize((side, side))
        if self._fast_pixels is None:
            return self._processor_pixels(square)
        return CodedPixels(self._fast_pixels.codes(square), self._fast_pixels.table)

    def _processor_pixels(self, image: Image.Image) -> np.ndarray:
        out = self.image_processor(images=image, return_tensors="np")
        return np.asarray(out["pixel_values"][0])

    def vision_tokens(self, pixels: np.ndarray) -> int:
        return self.vision.dims.tokens

    @torch.inference_mode()
    def encode_images(self, pixels: list[np.ndarray]) -> list[torch.Tensor]:
        """preprocess() outputs of N images → image features [65, lm hidden] per image, in the
        model dtype; the images run as one batch."""
        x = pixels_on_device(pixels, self.settings.torch_device, self.settings.torch_dtype)
        return list(self.abstractor(self.vision(x)))

    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]:
        """Upstream's ids for a prompt holding one <|image|>, its sentinel repeated num_image_tokens
        times (one position per image feature, as upstream splices them)."""
        if prompt.count(IMAGE_MARKER) != 1:
            raise ValueError(f"prompt must hold exactly one {IMAGE_MARKER}: {prompt!r}")
        ids = self._ids(prompt)
        at = ids.index(IMAGE_TOKEN_INDEX)
        return ids[:at] + [IMAGE_TOKEN_INDEX] * num_image_tokens + ids[at + 1:]

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        """The image's 65 features are the same for every question: the prefix up to them
        is shared."""
        return PromptLayout.of(self.prompt_ids(prompt, self.image_tokens(features)),
                               IMAGE_TOKEN_INDEX)

    def vision_flops(self, counts: Counts) -> float:
        """The ViT over its 1,025 tokens per image, then per image the abstractor: 64 queries
        cross-attending to [ViT tokens; queries] (q from the queries, k and v from all), its output
        projection and SwiGLU MLP per query, and visual_fc."""
        v, a, h = self.vision.dims, self.abstractor.dims, self.lm.dims.hidden_size
        per_token = (2 * v.num_hidden_layers
                     * (4 * v.hidden_size**2 + 2 * v.hidden_size * v.intermediate_size)
                     + 2 * 3 * v.patch_size**2 * v.hidden_size)
        images = counts.vision_tokens / v.tokens
        q, d = a.num_learnable_queries, a.hidden_size
        e, m = a.encoder_hidden_size, a.intermediate_size
        per_layer = 2 * (q * d * d + 2 * (v.tokens + q) * e * d + q * e * e + 3 * q * d * m)
        return (per_token * counts.vision_tokens
                + images * (a.num_hidden_layers * per_layer + 2 * q * d * h))


