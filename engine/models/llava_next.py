"""LLaVA-NeXT / LLaVA-1.6 (llava-hf `model_type: llava_next`; LLaVA-1.6-Mistral-7B, -Vicuna-7B/13B).

LLaVA-1.5's CLIP tower and projector, run over "anyres" tiles: the processor picks the resolution of
`image_grid_pinpoints` that keeps most of the image, resizes and pads the image to it, and cuts it
into tower-sized crops, plus one base view of the whole image. The features of the crops are laid
back out as one grid, the padding is cut away again ("unpad"), and an `image_newline` embedding
closes every row; the base view's features come first. So the number of image tokens follows each
image's size (LLaVA-1.6-Mistral on COCO: ~1,900-2,900), and so do the prefix lengths; the engine
batches prefixes of equal length and runs the rest as they come.

The language model is the same LLaMA stack (Vicuna or Mistral: grouped KV heads, rope_theta 1e6).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from PIL import Image
from transformers.image_processing_utils import select_best_resolution

from ..inputs.images import normalize_table, to_rgb
from ..utils.loader import CheckpointError
from ..utils.settings import Settings
from .llava import NAME_RULES, LlavaModel


class LlavaNextModel(LlavaModel):
    """Everything the engine needs from one LLaVA-NeXT checkpoint."""

    family = "llava_next"
    name = "LLaVA-NeXT"
    seed_model = "LLaVA-1.6-Mistral-7B"
    inner_types = {"text_config": ("llama", "mistral"), "vision_config": ("clip_vision_model",)}
    default_template = "mistral_inst"
    own_aspect = "tiles every image its own way"
    name_rules = [(r"^(?:model\.)?image_newline$", "extra.image_newline"), *NAME_RULES]
    # the select strategy that leaves side² patch features per crop
    packed_strategy: ClassVar[str] = "default"

    @classmethod
    def protocol_variants(cls) -> dict[str, dict]:
        # its checkpoints carry a Mistral or a Vicuna (llama) language model, whose processors'
        # templates differ
        return {"LLaVA-NeXT (Mistral)": {"text_config": {"model_type": "mistral"}},
                "LLaVA-NeXT (Vicuna)": {"text_config": {"model_type": "llama"}}}

    def __init__(self, folder: Path, settings: Settings):
        super().__init__(folder, settings)
        if self.select_strategy != self.packed_strategy:
            raise CheckpointError(f"{folder}/config.json: {self.name} packs a square grid of patch "
                                  "features per crop, which vision_feature_select_strategy "
                                  f"{self.packed_strategy!r} leaves; {self.select_strategy!r} "
                                  "does not")
        vision = self.config.vision_config
        self.crop_size = vision.image_size  # pixels per crop side
        self.side = vision.image_size // vision.patch_size  # patch features per crop side
        self.pinpoints = [tuple(p) for p in self.config.image_grid_pinpoints or ()]
        if not self.pinpoints or any(len(p) != 2 or min(p) <= 0 for p in self.pinpoints):
            raise CheckpointError(f"{self.folder}/config.json: image_grid_pinpoints "
                                  f"{self.config.image_grid_pinpoints} holds no grid of "
                                  "[height, width] to cut images to")
        self.newline = self.extra["image_newline"]

    def extra_shapes(self, hidden_size: int) -> dict[str, tuple[int, ...]]:
        return {"image_newline": (hidden_size,)}

    def _fast_pixel_path(self):
        return AnyresPixels.for_processor(self.image_processor)

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        """One image → (its crops [1 + rows * cols, 3, S, S], base view first, as the checkpoint's
        processor makes them; the image's (height, width))."""
        if self._fast_pixels is not None:
            return self._fast_pixels(image)
        return self._processor_pixels(image)

    def _processor_pixels(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        out = self.image_processor(images=image, return_tensors="np")
        height, width = (int(v) for v in out["image_sizes"][0])
        # The model reads 1 + rows * cols crops (the processor also cuts partial ones where a
        # pinpoint is not a multiple of the crop size); the processor's own pinpoints, as this runs
        # at load.
        crop = self.image_processor.crop_size.height
        pinpoints = [tuple(p) for p in self.image_processor.image_grid_pinpoints]
        best_height, best_width = select_best_resolution((height, width), pinpoints)
        crops = 1 + (best_height // crop) * (best_width // crop)
        return np.asarray(out["pixel_values"][0][:crops]), (height, width)

    def _grid(self, height: int, width: int) -> tuple[int, int]:
        """Crops (rows, columns) of an image of this size: those of its best pinpoint resolution."""
        best_height, best_width = select_best_resolution((height, width), self.pinpoints)
        return best_height // self.crop_size, best_width // self.crop_size

    def crops(self, pixels: tuple[np.ndarray, tuple[int, int]]) -> int:
        return pixels[0].shape[0]

    @torch.inference_mode()
    def encode_images(self, pixels: list[tuple[np.ndarray, tuple[int, int]]]) -> list[torch.Tensor]:
        """preprocess() outputs → packed features [T_i, hidden] per image; every crop of every
        image runs in one vision batch."""
        counts = [crops.shape[0] for crops, _ in pixels]
        features = self.project(torch.from_numpy(np.concatenate([crops for crops, _ in pixels])))
        return [self._pack(f, size) for f, (_, size) in zip(features.split(counts), pixels)]

    def _pack(self, features: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """features [crops, side², hidden] of one image → [base (side²) ; unpadded grid rows,
        each closed by image_newline]."""
        base, tiles = features[0], features[1:]
        newline = self.newline.to(features.dtype)
        if not len(tiles):  # one crop only: the base view and a newline
            return torch.cat([base, newline[None]])
        rows, cols = self._grid(*size)
        hidden = features.shape[-1]
        # [rows * cols, side * side, hidden] → the whole grid [hidden, rows * side, cols * side]
        grid = tiles.view(rows, cols, self.side, self.side, hidden).permute(4, 0, 2, 1, 3)
        grid = self._reduce(_unpad(grid.reshape(hidden, rows * self.side, cols * self.side), *size))
        grid = torch.cat([grid, newline[:, None, None].expand(hidden, grid.shape[1], 1)], dim=2)
        return torch.cat([base, grid.flatten(1).T])

    def _reduce(self, grid: torch.Tensor) -> torch.Tensor:
        """The unpadded grid [hidden, H, W] as the language model reads it (LLaVA-NeXT: all
        of it)."""
        return grid


def _unpad(grid: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Cut the padding the processor added to fit an image of (height, width) into the grid's aspect
    (the grid [C, H, W] covers the padded, resized image; the rounding is the processor's)."""
    grid_height, grid_width = grid.shape[1:]
    if width / height > grid_width / grid_height:  # wider than the grid: padding above and below
        kept = int(round(height * (grid_width / width), 7))
        cut = (grid_height - kept) // 2
        return grid[:, cut:grid_height - cut]
    kept = int(round(width * (grid_height / height), 7))
    cut = (grid_width - kept) // 2
    return grid[:, :, cut:grid_width - cut]


class AnyresPixels:
    """transformers' PIL-backend LLaVA-NeXT processor (the image resized to fit its best pinpoint
    resolution and padded with zeros, cut into crops, after a base view resized to one crop) with
    the same values, faster (bench/RESULTS.md): the same PIL resizes and the same zero padding, then
    one table lookup per pixel as in ClipPixels, instead of a processor pass per crop (whose own
    resize and centre crop leave a crop-sized crop unchanged). LlavaNextModel checks it against the
    processor at load, as LlavaModel does ClipPixels."""

    def __init__(self, pinpoints: list[tuple[int, int]], crop: int, resample: int,
                 rescale_factor: float, mean, std):
        self.pinpoints, self.crop, self.resample = pinpoints, crop, resample
        self.lookup = normalize_table(rescale_factor, mean, std)

    @classmethod
    def for_processor(cls, processor) -> "AnyresPixels | None":
        if type(processor).__name__ != "LlavaNextImageProcessorPil":
            return None
        size, crop = processor.size, processor.crop_size
        flags = (processor.do_resize, processor.do_center_crop, processor.do_rescale,
                 processor.do_normalize, processor.do_convert_rgb)
        # Per crop the processor resizes to the shortest edge and centre-crops: identities only when
        # both equal the crop size.
        if (not all(flags) or not size.shortest_edge
                or not (crop.height == crop.width == size.shortest_edge)):
            return None
        # transformers keeps only whole crops of a pinpoint that is not a multiple of the crop size
        if np.size(processor.image_mean) != 3 or any(h % crop.height or w % crop.height
                                                     for h, w in processor.image_grid_pinpoints):
            return None
        return cls([tuple(p) for p in processor.image_grid_pinpoints], crop.height,
                   int(processor.resample), processor.rescale_factor, processor.image_mean,
                   processor.image_std)

    def __call__(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        """An image → (crops [1 + rows * cols, 3, crop, crop] float32, base view first;
        (height, width))."""
        image = to_rgb(image)
        width, height = image.size
        best_height, best_width = select_best_resolution((height, width), self.pinpoints)
        # The processor's fit: the side that limits scales to the target, the other rounds up.
        scale_width, scale_height = best_width / width, best_height / height
        if scale_width < scale_height:
            new_width, new_height = best_width, min(math.ceil(height * scale_width), best_height)
        else:
            new_height, new_width = best_height, min(math.ceil(width * scale_height), best_width)
        fitted = np.asarray(image.resize((new_width, new_height), resample=self.resample))
        top, left = (best_height - new_height) // 2, (best_width - new_width) // 2
        canvas = np.zeros((best_height, best_width, 3), dtype=np.uint8)
        canvas[top:top + new_height, left:left + new_width] = fitted
        views = [np.asarray(image.resize((self.crop, self.crop), resample=self.resample))]
        views += [canvas[y:y + self.crop, x:x + self.crop] for y in range(0, best_height, self.crop)
                  for x in range(0, best_width, self.crop)]
        crops = np.stack([np.stack([np.take(self.lookup[c], v[:, :, c]) for c in range(3)])
                          for v in views])

        return crops, (height, width)
