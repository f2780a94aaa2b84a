"""InternVL3 (OpenGVLab's `-hf` checkpoints, `model_type: internvl`; InternVL3-8B-hf,
-2B-hf, -1B-hf).

InternViT (a ViT with layer scale) over dynamic tiles: the image processor (GotOcr2ImageProcessor
with crop_to_patches, which InternVLProcessor turns on) picks the grid of up to `max_patches` 448-px
tiles whose aspect is closest to the image's, resizes the image to it and cuts it, then adds a
thumbnail of the whole image where there is more than one tile. Per tile, the tower's patch features
(class token dropped, 32 x 32 at 448 px) are pixel-shuffled by 0.5 (2 x 2 neighbours into one
feature of 4x the width: 256 per tile) and projected by LayerNorm + a two-layer MLP. The prompt's
`<IMG_CONTEXT>` becomes `<img>`, 256 context tokens per tile, `</img>`, as InternVLProcessor writes
it; a 640 x 480 COCO image is 4 x 3 tiles + the thumbnail, 3,328 image tokens. The language model is
Qwen2.5 (Qwen2's architecture: biased q/k/v, plain RoPE).

The tower is transformers' own InternVLVisionModel; pixel shuffle and projector are ours (the same
math). InternVLProcessor also builds a video processor, which needs torchvision; the reference
pipeline repeats the context token with the processor's own replace_image_token where the processor
cannot be built.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..inputs.images import normalize_table, to_rgb
from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError, load_module, no_init, tensor_files
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import processor_with_video
from .llava import NAME_RULES, LlavaModel

CONTEXT, START, END = "<IMG_CONTEXT>", "<img>", "</img>"
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class InternVLModel(LlavaModel):
    """Everything the engine needs from one InternVL3 `-hf` checkpoint."""

    family = "internvl"
    name = "InternVL3"
    seed_model = "InternVL3-8B"
    # Qwen2.5, InternViT
    inner_types = {"text_config": ("qwen2",), "vision_config": ("internvl_vision",)}
    default_template = "internvl_chat"
    image_marker = CONTEXT
    own_aspect = "tiles every image its own way"
    name_rules = NAME_RULES
    tower_class = "InternVLVisionModel"
    # lmms-eval's internvl_hf passes min_patches/max_patches with every call (images_kwargs): the
    # same tiles as a processor made with them
    processor_bounds = {"processor_patches": ("min_patches", "max_patches")}

    def __init__(self, folder: Path, settings: Settings):
        super().__init__(folder, settings)
        cfg = self.config
        if not isinstance(self.feature_layer, int) or self.select_strategy != "default":
            raise CheckpointError(f"{folder}/config.json: {self.name} reads one tower layer "
                                  "without its class token (vision_feature_layer an int, "

                                  "vision_feature_select_strategy 'default'), not "
                                  f"{self.feature_layer!r} / {self.select_strategy!r}")
        vision = cfg.vision_config
        self.side = vision.image_size[0] // vision.patch_size[0]  # patch features per tile side
        self.scale = cfg.downsample_ratio
        if vision.image_size[0] != vision.image_size[1] or (self.side * self.scale) % 1:
            raise CheckpointError(f"{folder}/config.json: tiles of {vision.image_size} px with "
                                  f"patches of {vision.patch_size} do not pixel-shuffle by "
                                  f"{self.scale}")
        self.tokens_per_tile = int(self.side * self.scale) ** 2
        self.feature_fingerprint = self.fingerprint({}, tiling=self.feature_fingerprint,
                                                    downsample_ratio=self.scale)

    def text_dims(self, text_config) -> DecoderDims:
        # Qwen2's q/k/v carry biases
        return replace(DecoderDims.from_config(text_config), qkv_bias=True)

    def _load(self, dims: DecoderDims) -> dict[str, dict[str, torch.Tensor]]:
        """Every tensor, grouped (lm, vision, projector): the projector is LayerNorm + two Linears
        over the pixel-shuffled width (the tower's x 1/ratio²)."""
        import transformers

        cfg = self.config
        with no_init():
            self.vision = getattr(transformers, self.tower_class)(cfg.vision_config)
        vision_shapes = {f"vision.{k}": tuple(v.shape) for k, v in self.vision.state_dict().items()}
        wide = cfg.vision_config.hidden_size * int(1 / cfg.downsample_ratio) ** 2
        h = dims.hidden_size
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        expected.update(vision_shapes)
        expected.update({"projector.layer_norm.weight": (wide,),
                         "projector.layer_norm.bias": (wide,),
                         "projector.linear_1.weight": (h, wide), "projector.linear_1.bias": (h,),
                         "projector.linear_2.weight": (h, h), "projector.linear_2.bias": (h,)})
        parts = self.load_parts(self.name_rules, expected)
        proj = parts["projector"]
        self.projector_norm = (proj["layer_norm.weight"].to(self.device, self.dtype),
                               proj["layer_norm.bias"].to(self.device, self.dtype))
        return parts

    def tied(self) -> bool:
        """The config's tie_word_embeddings, refused where the checkpoint stores an lm_head all
        the same."""
        tied = super().tied()
        if tied and any(re.match(r"^(?:model\.)?(?:language_model\.)?lm_head\.", k)
                        for k in tensor_files(self.folder)):
            # InternVLConfig's tie_word_embeddings defaults to true, and transformers 5 ties by
            # it: a config written without it reads as tied, and transformers would drop the
            # stored head.
            raise CheckpointError(f"{self.folder}: config.json ties lm_head to the embeddings "
                                  "(top-level tie_word_embeddings, true where absent) but the "
                                  "checkpoint stores an lm_head; set tie_word_embeddings to false "
                                  "in config.json if that head is meant")
        return tied

    def _vision_tower(self, weights: dict[str, torch.Tensor]) -> None:
        """InternViT with its weights, cut after the layer read (hidden_states[i]: the output of
        layer i; -1 reads last_hidden_state, after every layer)."""
        load_module(self.vision, weights, self.folder, "vision tower")
        total = self.config.vision_config.num_hidden_layers
        layer = self.feature_layer if isinstance(self.feature_layer, int) else total
        self.feature_states = [layer if layer >= 0 else total + 1 + layer]
        if not 0 < self.feature_states[0] <= total:
            raise CheckpointError(f"{self.folder}/config.json: vision_feature_layer "
                                  f"{self.feature_layer} lies outside the tower's {total} layers")
        del self.vision.encoder.layer[self.feature_states[0]:]
        self.vision = self.borrowed(self.vision)

    # --- pixels ---------------------------------------------------------------------------------

    def preprocess_settings(self) -> dict:
        # InternVLProcessor's images_kwargs
        return {**super().preprocess_settings(), "crop_to_patches": True}

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """One image → its tiles [n, 3, S, S] (row by row, then the thumbnail where n > 1), as
        InternVLProcessor has the image processor make them."""
        if self._fast_pixels is None:
            return self._processor_pixels(image)
        return self._fast_pixels(image)

    def _processor_pixels(self, image: Image.Image) -> np.ndarray:
        out = self.image_processor(images=image, crop_to_patches=True, return_tensors="np")
        return np.asarray(out["pixel_values"])

    def _fast_pixel_path(self):
        return TilePixels.for_processor(self.image_processor)

    def crops(self, pixels: np.ndarray) -> int:
        return pixels.shape[0]

    def vision_tokens(self, pixels) -> int:
        """Patches + class token per tile, over every tile."""
        return self.crops(pixels) * (self.side**2 + 1)

    # --- features -------------------------------------------------------------------------------

    @torch.inference_mode()
    def encode_images(self, pixels: list[np.ndarray]) -> list[torch.Tensor]:
        """preprocess() outputs → features [tiles * 256, hidden] per image; every tile of every
        image runs in one vision batch."""
        counts = [tiles.shape[0] for tiles in pixels]
        features = self.project(torch.from_numpy(np.concatenate(pixels)))
        return [f.flatten(0, 1) for f in features.split(counts)]

    @torch.inference_mode()
    def project(self, pixels: torch.Tensor) -> torch.Tensor:
        """tiles [N, 3, S, S] → projected features [N, (side * ratio)², hidden]."""
        pixels = pixels.to(self.device, self.dtype)
        # last_hidden_state: after the tower's final norm (Identity under mean pooling)
        if self.feature_layer == -1:
            x = self.vision(pixels).last_hidden_state
        else:  # the cut tower's last layer
            x = self.vision(pixels, output_hidden_states=True).hidden_states[-1]
        x = pixel_shuffle(x[:, 1:].reshape(x.shape[0], self.side, self.side, -1), self.scale)
        x = F.layer_norm(x.flatten(1, 2), x.shape[-1:], *self.projector_norm)
        lin1, act, lin2 = self.projector
        return lin2(act(lin1(x)))

    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]:
        """The prompt's ids with `<IMG_CONTEXT>` written as `<img>` + the context tokens + `</img>`,
        as InternVLProcessor.replace_image_token does."""
        if prompt.count(CONTEXT) != 1:
            raise ValueError(f"prompt must hold exactly one {CONTEXT}: {prompt!r}")
        return self._expand(prompt.replace(CONTEXT, START + CONTEXT + END), num_image_tokens)

    def vision_flops(self, counts: Counts) -> float:
        """InternViT's layers over every token they read and its patch embedding, then the projector
        over the shuffled features (a quarter as many, four times as wide)."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d, layers = vc.hidden_size, len(self.vision.encoder.layer)
        per_token = (2 * layers * (4 * d * d + 2 * d * vc.intermediate_size)
                     + 2 * 3 * vc.patch_size[0] ** 2 * d)
        tiles = counts.vision_tokens / (self.side**2 + 1)
        wide = d * int(1 / self.scale) ** 2
        return (per_token * counts.vision_tokens
                + tiles * self.tokens_per_tile * 2 * (wide * h + h * h))

    # --- checkpoints and the reference ------------------------------------------------------------


    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """The checkpoint's processor; where transformers cannot build it (its video processor needs
        torchvision), a stand-in that does what it does for one image: the image processor with
        crop_to_patches, and the context token written as InternVLProcessor.replace_image_token
        writes it (its own code, on its fields)."""
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, InternVLProcessor

        if (processor := processor_with_video(checkpoint)) is not None:
            return processor
        config = AutoConfig.from_pretrained(str(checkpoint))
        counter = InternVLProcessor.__new__(InternVLProcessor)
        counter.tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        counter.image_processor = AutoImageProcessor.from_pretrained(str(checkpoint))
        counter.image_seq_length = config.image_seq_length
        counter.start_image_token, counter.end_image_token = START, END
        counter.image_token = CONTEXT

        def process(images, text: str, return_tensors: str):
            pixels = counter.image_processor(images=images, crop_to_patches=True,
                                             return_tensors=return_tensors)
            expanded = text.replace(CONTEXT, counter.replace_image_token(pixels, 0))
            encoded = counter.tokenizer(expanded, return_tensors=return_tensors)
            return {**encoded, "pixel_values": pixels["pixel_values"]}

        process.tokenizer = counter.tokenizer
        return process


def pixel_shuffle(x: torch.Tensor, scale: float) -> torch.Tensor:
    """InternVLModel.pixel_shuffle: [N, W, H, C] → [N, W * scale, H * scale, C / scale²] (its
    reshapes, in its order, so the features' channel order is the checkpoint's)."""
    n, w, h, c = x.shape
    x = x.reshape(n, w, int(h * scale), int(c / scale)).permute(0, 2, 1, 3)
    x = x.reshape(n, int(h * scale), int(w * scale), int(c / scale**2)).permute(0, 2, 1, 3)
    return x


class TilePixels:
    """transformers' PIL-backend GotOcr2 processor under crop_to_patches (the image resized with PIL
    to its best grid of tiles and cut, then the thumbnail resized to one tile, each rescaled and
    normalized) with the same values, faster: the same PIL resizes, then one table lookup per pixel
    as in ClipPixels. InternVLModel checks it against the processor at load."""

    def __init__(self, tile: int, min_patches: int, max_patches: int, resample: int,
                 rescale_factor: float, mean, std):
        self.tile, self.min_patches, self.max_patches = tile, min_patches, max_patches
        self.resample = resample
        self.lookup = normalize_table(rescale_factor, mean, std)

    @classmethod
    def for_processor(cls, processor) -> "TilePixels | None":
        if (type(processor).__name__ != "GotOcr2ImageProcessorPil"
                or np.size(processor.image_mean) != 3):
            return None
        if not all((processor.do_resize, processor.do_rescale, processor.do_normalize,
                    processor.do_convert_rgb)):
            return None
        size = processor.size
        if not size.height or size.height != size.width or processor.max_patches <= 1:
            return None
        return cls(size.height, processor.min_patches, processor.max_patches,
                   int(processor.resample), processor.rescale_factor, processor.image_mean,
                   processor.image_std)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """An image → tiles [n, 3, tile, tile] float32."""
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
            get_optimal_tiled_canvas)

        image = to_rgb(image)
        columns, rows = get_optimal_tiled_canvas((image.height, image.width),
                                                 (self.tile, self.tile), self.min_patches,
                                                 self.max_patches)
        t = self.tile
        grid = np.asarray(image.resize((columns * t, rows * t), resample=self.resample))
        views = [grid[r * t:(r + 1) * t, c * t:(c + 1) * t]
                 for r in range(rows) for c in range(columns)]
        if len(views) != 1:
            views.append(np.asarray(image.resize((t, t), resample=self.resample)))
        return np.stack([np.stack([np.take(self.lookup[c], v[:, :, c]) for c in range(3)])
                         for v in views])

