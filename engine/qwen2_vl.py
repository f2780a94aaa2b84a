"""Qwen2-VL (transformers `model_type: qwen2_vl`; Qwen2-VL-7B-Instruct, -2B).

A native-resolution ViT: the processor resizes each image to multiples of 28 px within a pixel
budget and cuts it into 14-px patches (two frames each, an image repeated); the tower merges 2 x 2
patches into one language-model token (a COCO image: ~391). The language model is Qwen2 (biased
q/k/v, grouped KV heads) with M-RoPE: an image token's position is three numbers (temporal, height,
width within the image's token grid, offset by the text before it), and the text after the image
continues from there plus the longer side of the grid, not from the number of image tokens. The
tower is transformers' own module; the language model is ours.

Features are kept as the token grid [rows, cols, hidden], since the positions need its shape.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .images import ImageError, NativePixels, checked_fast_path
from .layers import replace_linears
from .llama import LlamaDims, LlamaLM
from .loader import CheckpointError, load_grouped, load_module, no_init, stop_ids
from .plan import PromptLayout
from .prompts import ExpandedPromptIds
from .settings import Settings
from .vision_cache import tensor_fingerprint

MODEL_TYPE = "qwen2_vl"
IMAGE_PAD = "<|image_pad|>"
MAX_ASPECT = 200  # transformers' smart_resize refuses a longer side over 200 times the shorter

NAME_RULES = [
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?visual\.", "vision."),
    (r"^model\.language_model\.", "lm."),
    (r"^model\.", "lm."),  # Qwen's own layout: model.layers.*, model.embed_tokens, model.norm
]


class Qwen2VLModel:
    """Everything the engine needs from one Qwen2-VL checkpoint."""

    family = MODEL_TYPE
    default_template = "qwen2_vl_chat"
    image_marker = "<|vision_start|><|image_pad|><|vision_end|>"
    features_per_prompt = False

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        if settings.image_aspect != "processor":
            raise ValueError("image_aspect 'pad' is LLaVA-1.5's; Qwen2-VL keeps each image's own aspect")
        self.folder, self.settings = folder, settings
        device, dtype = settings.torch_device, settings.torch_dtype
        quantize, packed = settings.quant == "nf4", settings.nf4_weights == "packed"
        self.config = cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        self.image_token_id = cfg.image_token_id
        self.merge = cfg.vision_config.spatial_merge_size
        try:  # not AutoProcessor: Qwen2VLProcessor also builds a video processor, which needs torchvision
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self.image_processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{folder}: no usable tokenizer or image processor files: {err}") from None
        if self.tokenizer.convert_tokens_to_ids(IMAGE_PAD) != self.image_token_id:
            raise CheckpointError(f"{folder}: the tokenizer has no {IMAGE_PAD} token with id {self.image_token_id}")

        dims = replace(LlamaDims.from_config(cfg.text_config), qkv_bias=True)  # Qwen2's q/k/v carry biases
        if dims.mrope_section is None:
            raise CheckpointError(f"{folder}/config.json: text_config has no mrope_section (M-RoPE)")
        with no_init():
            vision = Qwen2VisionTransformerPretrainedModel._from_config(cfg.vision_config)
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        if tied:  # the 2B model reads its logits off the embedding matrix
            expected.pop("lm.lm_head.weight")
        expected.update({f"vision.{k}": tuple(v.shape) for k, v in vision.state_dict().items()})
        parts = load_grouped(folder, NAME_RULES, expected)
        lm_weights, vision_weights = parts["lm"], parts["vision"]
        if tied:
            lm_weights["lm_head.weight"] = lm_weights["embed_tokens.weight"]
        self.feature_fingerprint = tensor_fingerprint({f"vision.{k}": v for k, v in vision_weights.items()},
                                                      extra=settings.feature_settings())
        load_module(vision, vision_weights, folder, "vision tower")
        self.vision = vision.to(device=device, dtype=dtype).eval()
        if quantize:  # transformers quantizes every Linear but lm_head under load_in_4bit, the tower's too
            replace_linears(self.vision, dtype=dtype, device=device, keep_packed=packed, kernels=settings.kernels)
        self.lm = LlamaLM(dims, lm_weights, dtype=dtype, device=device, quantize=quantize, keep_packed=packed,
                          quantize_lm_head=settings.quantize_lm_head, kernels=settings.kernels)
        self.stop_ids = stop_ids(folder, self.tokenizer)
        self._expand = ExpandedPromptIds(self.tokenizer, IMAGE_PAD, self.image_token_id)
        self._fast_pixels = checked_fast_path(NativePixels.for_processor(self.image_processor), self._processor_pixels)

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(), "backend": type(self.image_processor).__name__}

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """One image → (its flattened patches [t * h * w, C * 2 * 14 * 14], its patch grid (t, h, w)),
        as the checkpoint's processor makes them (NumPy: see LlavaModel.preprocess)."""
        if max(image.size) > MAX_ASPECT * min(image.size):  # the processor's smart_resize refuses these
            raise ImageError(f"{image.width} x {image.height} pixels: an aspect ratio of "
                             f"{max(image.size) / min(image.size):.0f}:1 is over Qwen2-VL's limit of {MAX_ASPECT}:1")
        if self._fast_pixels is not None:
            return self._fast_pixels(image)
        return self._processor_pixels(image)

    def _processor_pixels(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        out = self.image_processor(images=image, return_tensors="np")
        t, h, w = (int(v) for v in out["image_grid_thw"][0])
        if t != 1:
            raise ValueError(f"an image became {t} frames; only still images are supported")
        return np.asarray(out["pixel_values"]), (t, h, w)

    def vision_tokens(self, pixels: tuple[np.ndarray, tuple[int, int, int]]) -> int:
        t, h, w = pixels[1]
        return t * h * w  # patches; the merger turns four into one language-model token

    def image_tokens(self, features: torch.Tensor) -> int:
        return features.shape[0] * features.shape[1]

    @torch.inference_mode()
    def encode_images(self, pixels: list[tuple[np.ndarray, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """preprocess() outputs → merged features [rows, cols, hidden] per image (rows = h / 2,
        cols = w / 2); every image's patches run in one tower call (its attention stays per image)."""
        device, dtype = self.settings.torch_device, self.settings.torch_dtype
        patches = torch.from_numpy(np.concatenate([p for p, _ in pixels])).to(device, dtype)
        grid = torch.tensor([g for _, g in pixels], device=device)
        merged = self.vision(hidden_states=patches, grid_thw=grid).pooler_output
        sizes = [h * w // self.merge**2 for _, (_, h, w) in pixels]
        return [f.reshape(h // self.merge, w // self.merge, -1)
                for f, (_, (_, h, w)) in zip(merged.split(sizes), pixels)]

    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]:
        """The prompt's ids with its one image pad repeated num_image_tokens times, as the processor
        expands it."""
        return self._expand(prompt, num_image_tokens)

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        """Prefix shared up to the last image token, as for LLaVA; positions are M-RoPE streams."""
        ids = self.prompt_ids(prompt, self.image_tokens(features))
        return PromptLayout.of(ids, self.image_token_id, positions=self.positions(ids, features))

    def positions(self, ids: list[int], features: torch.Tensor) -> torch.Tensor:
        """M-RoPE position streams [3, len(ids)] of a prompt holding one image: text before it counts
        0, 1, ...; the image's tokens take (start, start + row, start + col); the text after it
        continues from start + max(rows, cols)."""
        rows, cols = features.shape[:2]
        start = ids.index(self.image_token_id)
        if ids[start:start + rows * cols] != [self.image_token_id] * (rows * cols) or \
                ids.count(self.image_token_id) != rows * cols:
            raise ValueError(f"the prompt's image tokens are not one run of {rows * cols}")
        before = torch.arange(start).expand(3, -1)
        row, col = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        image = torch.stack([torch.zeros(rows * cols, dtype=torch.long), row.flatten(), col.flatten()]) + start
        after = torch.arange(len(ids) - start - rows * cols).expand(3, -1) + start + max(rows, cols)
        return torch.cat([before, image, after], dim=1)
