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

from ..inputs.images import ImageError, checked_fast_path, normalize_table, to_rgb
from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError, load_module, no_init
from ..inputs.plan import PromptLayout
from ..inputs.prompts import ExpandedPromptIds
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family, processor_with_video

IMAGE_PAD = "<|image_pad|>"
MAX_ASPECT = 200  # transformers' smart_resize refuses a longer side over 200 times the shorter

NAME_RULES = [
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?visual\.", "vision."),
    (r"^model\.language_model\.", "lm."),
    (r"^model\.", "lm."),  # Qwen's own layout: model.layers.*, model.embed_tokens, model.norm
]


class Qwen2VLModel(Family):
    """Everything the engine needs from one Qwen2-VL checkpoint."""

    family = "qwen2_vl"
    name = "Qwen2-VL"
    seed_model = "Qwen2-VL-7B-Instruct"
    inner_types = {"text_config": ("qwen2_vl_text",), "vision_config": ("qwen2_vl_vision",)}
    default_template = "qwen2_vl_chat"
    image_marker = "<|vision_start|><|image_pad|><|vision_end|>"
    own_aspect = "keeps each image's own aspect"
    processor_bounds = {"processor_pixels": ("min_pixels", "max_pixels")}

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoImageProcessor, AutoTokenizer

        super().__init__(folder, settings)
        self.config = cfg = self.auto_config()
        self.image_token_id = cfg.image_token_id
        self.merge = cfg.vision_config.spatial_merge_size
        # not AutoProcessor: Qwen2VLProcessor also builds a video processor, which needs torchvision
        self.tokenizer = self.shared(AutoTokenizer, "tokenizer files")
        # made as lmms-eval makes its processor, where asked
        self.image_processor = self.pretrained(AutoImageProcessor, "image processor files",
                                               **self.image_processor_kwargs())
        if self.tokenizer.convert_tokens_to_ids(IMAGE_PAD) != self.image_token_id:
            raise CheckpointError(f"{folder}: the tokenizer has no {IMAGE_PAD} token with id "
                                  f"{self.image_token_id}")
        dims = self.text_dims(cfg.text_config)
        if dims.mrope_section is None:
            raise CheckpointError(f"{folder}/config.json: text_config has no mrope_section "
                                  "(M-RoPE)")
        lm_weights, vision_weights, vision = self._load(dims)
        self.feature_fingerprint = self.fingerprint({f"vision.{k}": v
                                                     for k, v in vision_weights.items()})
        load_module(vision, vision_weights, folder, "vision tower")
        self.vision = self.borrowed(vision)
        self.lm = self.language_model(dims, lm_weights)
        self._expand = ExpandedPromptIds(self.tokenizer, IMAGE_PAD, self.image_token_id)
        self._fast_pixels = checked_fast_path(NativePixels.for_processor(self.image_processor),
                                              self._processor_pixels)

    def text_dims(self, text_config) -> DecoderDims:
        # Qwen2's q/k/v carry biases
        return replace(DecoderDims.from_config(text_config), qkv_bias=True)

    @staticmethod
    def transformers_classes() -> tuple[type, type, type]:
        """transformers' config, model and vision tower classes of the family."""
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel)

        return Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VisionTransformerPretrainedModel

    def _load(self, dims: DecoderDims):
        """The language model's and the tower's tensors, and the empty transformers tower they go
        into; a tied checkpoint (the 2B model) reads its logits off the embedding matrix."""
        with no_init():
            vision = self.transformers_classes()[2]._from_config(self.config.vision_config)
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        expected.update({f"vision.{k}": tuple(v.shape) for k, v in vision.state_dict().items()})
        parts = self.load_parts(NAME_RULES, expected)
        return parts["lm"], parts["vision"], vision

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(),
                "backend": type(self.image_processor).__name__}

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """One image → (its flattened patches [t * h * w, C * 2 * 14 * 14], its patch grid (t, h,
        w)), as the checkpoint's processor makes them."""
        # the processor's smart_resize refuses these
        if max(image.size) > MAX_ASPECT * min(image.size):
            raise ImageError(f"{image.width} x {image.height} pixels: an aspect ratio of "
                             f"{max(image.size) / min(image.size):.0f}:1 is over {self.name}'s "
                             f"limit of {MAX_ASPECT}:1")
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
    def encode_images(self,
                      pixels: list[tuple[np.ndarray, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """preprocess() outputs → merged features [rows, cols, hidden] per image (rows = h /
        2, cols = w / 2); every image's patches run in one tower call (its attention stays
        per image)."""
        device, dtype = self.settings.torch_device, self.settings.torch_dtype
        patches = torch.from_numpy(np.concatenate([p for p, _ in pixels])).to(device, dtype)
        merged = self.tower(patches, [g for _, g in pixels])
        sizes = [h * w // self.merge**2 for _, (_, h, w) in pixels]
        return [f.reshape(h // self.merge, w // self.merge, -1)
                for f, (_, (_, h, w)) in zip(merged.split(sizes), pixels)]

    def tower(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """Every image's patches (concatenated) → their merged features [tokens, hidden], image
        after image."""
        grid = torch.tensor(grids, device=patches.device)
        return self.vision(hidden_states=patches, grid_thw=grid).pooler_output

    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]:
        """The prompt's ids with its one image pad repeated num_image_tokens times, as the processor
        expands it."""
        return self._expand(prompt, num_image_tokens)

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        """Prefix shared up to the last image token, as for LLaVA; positions are M-RoPE streams."""
        ids = self.prompt_ids(prompt, self.image_tokens(features))
        return PromptLayout.of(ids, self.image_token_id, positions=self.positions(ids, features))

    def positions(self, ids: list[int], features: torch.Tensor) -> torch.Tensor:
        """M-RoPE position streams [3, len(ids)] of a prompt holding one image: text before it
        counts 0, 1, ...; the image's tokens take (start, start + row, start + col); the text after
        it continues from start + max(rows, cols)."""
        rows, cols = features.shape[:2]
        start = ids.index(self.image_token_id)
        if ids[start:start + rows * cols] != [self.image_token_id] * (rows * cols) or \
                ids.count(self.image_token_id) != rows * cols:
            raise ValueError(f"the prompt's image tokens are not one run of {rows * cols}")
        before = torch.arange(start).expand(3, -1)
        row, col = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        image = torch.stack([torch.zeros(rows * cols, dtype=torch.long), row.flatten(),
                             col.flatten()]) + start
        after = torch.arange(len(ids) - start - rows * cols).expand(3, -1) + start + max(rows, cols)
        return torch.cat([before, image, after], dim=1)

    def vision_flops(self, counts: Counts) -> float:
        """Per patch (14 x 14 x 2 frames x 3 channels in) the tower's blocks and patch embedding,
        and the merger, whose MLP runs once per four patches."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d, merged = vc.embed_dim, vc.spatial_merge_size**2
        per_patch = (2 * vc.depth * (4 * d * d + 2 * d * vc.mlp_ratio * d)
                     + 2 * 3 * vc.temporal_patch_size * vc.patch_size**2 * d
                     + 2 * ((merged * d) ** 2 + merged * d * h) / merged)
        return per_patch * counts.vision_tokens


    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """The checkpoint's processor; where transformers cannot build it (Qwen2VLProcessor also
        builds a video processor, which needs torchvision), a stand-in that does what it does
        for one image: the image processor, the prompt's image pad repeated once per merged
        token, mm_token_type_ids."""
        from transformers import AutoImageProcessor, AutoTokenizer

        if (processor := processor_with_video(checkpoint)) is not None:
            return processor
        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        image_processor = AutoImageProcessor.from_pretrained(str(checkpoint))
        pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)

        def process(images, text: str, return_tensors: str):
            pixels = image_processor(images=images, return_tensors=return_tensors)
            tokens = int(pixels["image_grid_thw"].prod()) // image_processor.merge_size**2
            encoded = tokenizer(text.replace(IMAGE_PAD, IMAGE_PAD * tokens),
                                return_tensors=return_tensors)
            return {**encoded, **pixels,
                    "mm_token_type_ids": (encoded["input_ids"] == pad_id).int()}

        process.tokenizer = tokenizer  # what the reference's batching pads with
        return process


class NativePixels:
    """transformers' PIL-backend Qwen2-VL processor (resized to multiples of patch x merge within
    its pixel budget, rescaled, normalized, cut into flattened patches of two identical frames) with
    the same values, faster (bench/RESULTS.md): the same PIL resize, then the uint8 pixels laid out
    in the processor's patch order (merge groups of patches, channel, frame, row, column) and one
    table lookup per value written straight into that layout, instead of float passes over the image
    and a float copy per layout step."""

    def __init__(self, processor):
        # A private transformers module: imported where a Qwen2-VL processor is in use, not by
        # every family.
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        self.processor, self.smart_resize = processor, smart_resize
        self.lookup = normalize_table(processor.rescale_factor, processor.image_mean,
                                      processor.image_std)

    @classmethod
    def for_processor(cls, processor) -> "NativePixels | None":
        if (type(processor).__name__ != "Qwen2VLImageProcessorPil"
                or np.size(processor.image_mean) != 3):
            return None
        flags = (processor.do_resize, processor.do_rescale, processor.do_normalize,
                 processor.do_convert_rgb)
        if not all(flags) or not (processor.size.shortest_edge and processor.size.longest_edge):
            return None
        return cls(processor)

    def __call__(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """An image → (patches [h * w, 3 * frames * patch * patch] float32, its patch grid (1,
        h, w))."""
        p = self.processor
        size, merge, frames = p.patch_size, p.merge_size, p.temporal_patch_size
        image = to_rgb(image)
        height, width = self.smart_resize(image.height, image.width, factor=size * merge,
                                          min_pixels=p.size.shortest_edge,
                                          max_pixels=p.size.longest_edge)
        resized = image.resize((width, height), resample=int(p.resample))
        pixels = np.asarray(resized).transpose(2, 0, 1)

        rows, cols = height // size, width // size
        # [C, H, W] → [row groups, col groups, merge rows, merge cols, C, patch rows, patch cols]
        grouped = pixels.reshape(3, rows // merge, merge, size, cols // merge, merge, size)
        grouped = grouped.transpose(1, 4, 2, 5, 0, 3, 6).reshape(rows * cols, 3, 1, size * size)
        out = np.empty((rows * cols, 3, frames, size * size), dtype=np.float32)
        for c in range(3):  # the frames are the same image: one lookup, broadcast over them
            out[:, c] = np.take(self.lookup[c], grouped[:, c])
        return out.reshape(rows * cols, 3 * frames * size * size), (1, rows, cols)


