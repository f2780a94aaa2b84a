"""LLaVA-OneVision (llava-hf `model_type: llava_onevision`;
llava-onevision-qwen2-7b-ov-hf, -0.5b-ov-hf).

LLaVA-NeXT's anyres packing (best pinpoint resolution, crops, unpad, `image_newline` closing every
row, the base view first) over a SigLIP tower and a Qwen2 language model (biased q/k/v, plain
RoPE). SigLIP has no class token, so the "full" select strategy keeps a square grid of patch
features per crop.

What OneVision adds is "anyres_max_9" (config `vision_aspect_ratio`): where the unpadded grid holds
more than 1.1² times the features of 9 crops, it is bilinearly interpolated down by that ratio
before the newlines join it. A 640 x 480 COCO image takes a 2 x 2 grid of 384-px crops, unpadded to
40 x 54 features, under the limit: 729 + 40 x 55 = 2,929 image tokens. The tower is transformers'
own SigLIP module; the rest is LLaVA-NeXT's.

transformers' LlavaOnevisionProcessor also builds a video processor, which needs torchvision; the
checkpoints written here keep the image processor and tokenizer apart, and the reference pipeline
expands the image token with the processor's own counting where the processor cannot be built.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError
from ..utils.settings import Settings
from .base import processor_with_video
from .llava_next import AnyresPixels, LlavaNextModel

IMAGE = "<image>"


class LlavaOnevisionModel(LlavaNextModel):
    """Everything the engine needs from one LLaVA-OneVision checkpoint."""

    family = "llava_onevision"
    name = "LLaVA-OneVision"
    seed_model = "LLaVA-OneVision-Qwen2-7B-OV"
    inner_types = {"text_config": ("qwen2",), "vision_config": ("siglip_vision_model",)}
    default_template = "llava_onevision_chat"
    own_aspect = "tiles every image its own way"
    tower_class = "SiglipVisionModel"
    packed_strategy = "full"  # SigLIP has no class token to drop

    @classmethod
    def protocol_variants(cls) -> dict[str, dict]:
        return {cls.name: {}}  # one language model (Qwen2): not LLaVA-NeXT's two kinds

    def __init__(self, folder: Path, settings: Settings):
        super().__init__(folder, settings)
        aspect = getattr(self.config, "vision_aspect_ratio", "anyres_max_9")
        if not re.fullmatch(r"anyres_max_\d+", str(aspect)):
            raise CheckpointError(f"{folder}/config.json: vision_aspect_ratio {aspect!r} is not "
                                  "supported (anyres_max_<crops> only)")
        self.max_crops = int(aspect[len("anyres_max_"):])
        if any(h % self.crop_size or w % self.crop_size for h, w in self.pinpoints):
            raise CheckpointError(f"{folder}/config.json: image_grid_pinpoints {self.pinpoints} "
                                  f"are not multiples of the tower's {self.crop_size}-px crops")

        self.feature_fingerprint = self.fingerprint({}, packing=self.feature_fingerprint,
                                                    vision_aspect_ratio=aspect)
        self._processor_chat_template(folder / "chat_template.json")

    def _processor_chat_template(self, path: Path) -> None:
        """The processor's chat template (chat_template.json) renders OneVision's prompt where
        there is one: a hub checkpoint's tokenizer_config may hold Qwen2-Instruct's text-only
        template instead."""
        if not path.is_file():
            return
        try:
            template = json.loads(path.read_text(encoding="utf-8"))["chat_template"]
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{path}: no chat_template string "
                                  f"({type(err).__name__})") from None
        if not isinstance(template, str):
            raise CheckpointError(f"{path}: chat_template is not a string")
        # the folder's own: every engine sharing the tokenizer sets it so
        self.tokenizer.chat_template = template

    def text_dims(self, text_config) -> DecoderDims:
        # Qwen2's q/k/v carry biases
        return replace(DecoderDims.from_config(text_config), qkv_bias=True)

    def _reduce(self, grid: torch.Tensor) -> torch.Tensor:
        """anyres_max_N: a grid [hidden, H, W] of more than 1.1² times N crops' features,
        interpolated bilinearly down to [hidden, int(H // ratio), int(W // ratio)], as
        transformers does."""
        _, height, width = grid.shape
        ratio = math.sqrt(height * width / (self.max_crops * self.side**2))
        if ratio <= 1.1:
            return grid
        return F.interpolate(grid[None], [int(height // ratio), int(width // ratio)],
                             mode="bilinear")[0]

    def _fast_pixel_path(self):
        """transformers' PIL-backend OneVision processor computes what LLaVA-NeXT's does without the
        centre crop: the base view resized straight to one crop, the fitted and zero-padded image
        cut into crops."""
        p = self.image_processor
        if type(p).__name__ != "LlavaOnevisionImageProcessorPil" or np.size(p.image_mean) != 3:
            return None
        if (not all((p.do_resize, p.do_rescale, p.do_normalize, p.do_convert_rgb))
                or p.do_center_crop):
            return None
        side = p.size.height
        if (not side or side != p.size.width
                or any(h % side or w % side for h, w in p.image_grid_pinpoints)):
            return None
        return AnyresPixels([tuple(q) for q in p.image_grid_pinpoints], side, int(p.resample),
                            p.rescale_factor, p.image_mean, p.image_std)

    def _processor_pixels(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        out = self.image_processor(images=image, return_tensors="np")
        height, width = (int(v) for v in out["image_sizes"][0])
        return np.asarray(out["pixel_values"][0]), (height, width)

    def vision_tokens(self, pixels) -> int:
        """Patches per crop (SigLIP has no class token), over every crop."""
        return self.crops(pixels) * self.side**2


    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """The checkpoint's processor; where transformers cannot build it (its video processor needs
        torchvision), a stand-in that does what it does for one image: the image processor, and the
        image token repeated as LlavaOnevisionProcessor.replace_image_token counts (its own code, on
        its fields)."""
        from transformers import (AutoConfig, AutoImageProcessor, AutoTokenizer,
                                  LlavaOnevisionProcessor)

        if (processor := processor_with_video(checkpoint)) is not None:
            return processor
        config = AutoConfig.from_pretrained(str(checkpoint))
        counter = LlavaOnevisionProcessor.__new__(LlavaOnevisionProcessor)
        counter.tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        counter.image_processor = AutoImageProcessor.from_pretrained(str(checkpoint))
        vision = config.vision_config
        counter.num_image_tokens = (vision.image_size // vision.patch_size) ** 2
        counter.vision_feature_select_strategy = config.vision_feature_select_strategy
        counter.vision_aspect_ratio, counter.image_token = config.vision_aspect_ratio, IMAGE

        def process(images, text: str, return_tensors: str):
            pixels = counter.image_processor(images=images, return_tensors=return_tensors)
            expanded = text.replace(IMAGE, counter.replace_image_token(pixels, 0))
            encoded = counter.tokenizer(expanded, return_tensors=return_tensors)
            return {**encoded, "pixel_values": pixels["pixel_values"],
                    "image_sizes": pixels["image_sizes"]}


        process.tokenizer = counter.tokenizer
        return process
