"""LLaVA-NeXT / LLaVA-1.6 (llava-hf `model_type: llava_next`; LLaVA-1.6-Mistral-7B, -Vicuna-7B/13B).

LLaVA-1.5's CLIP tower and projector, run over "anyres" tiles: the processor picks the resolution of
`image_grid_pinpoints` that keeps most of the image, resizes and pads the image to it, and cuts it
into tower-sized crops, plus one base view of the whole image. The features of the crops are laid
back out as one grid, the padding is cut away again ("unpad"), and an `image_newline` embedding closes
every row; the base view's features come first. So the number of image tokens follows each image's
size (LLaVA-1.6-Mistral on COCO: ~1,900-2,900), and so do the prefix lengths; the engine batches
prefixes of equal length and runs the rest as they come.

The language model is the same LLaMA stack (Vicuna or Mistral: grouped KV heads, rope_theta 1e6).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers.image_processing_utils import select_best_resolution

from .images import AnyresPixels
from .llava import NAME_RULES, LlavaModel
from .loader import CheckpointError
from .settings import Settings

MODEL_TYPE = "llava_next"


class LlavaNextModel(LlavaModel):
    """Everything the engine needs from one LLaVA-NeXT checkpoint."""

    family = MODEL_TYPE
    default_template = "mistral_inst"
    name_rules = [(r"^(?:model\.)?image_newline$", "extra.image_newline"), *NAME_RULES]

    def __init__(self, folder: Path, settings: Settings):
        if settings.image_aspect != "processor":
            raise ValueError("image_aspect 'pad' is LLaVA-1.5's; LLaVA-NeXT tiles every image its own way")
        super().__init__(folder, settings)
        if self.select_strategy != "default":
            raise CheckpointError(f"{folder}/config.json: LLaVA-NeXT packs a square grid of patch features per "
                                  f"crop; vision_feature_select_strategy {self.select_strategy!r} keeps CLS")
        vision = self.config.vision_config
        self.crop_size = vision.image_size  # pixels per crop side
        self.side = vision.image_size // vision.patch_size  # patch features per crop side
        self.pinpoints = [tuple(p) for p in self.config.image_grid_pinpoints]
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
        # The model reads 1 + rows * cols crops (the processor also cuts partial ones where a pinpoint
        # is not a multiple of the crop size); the processor's own pinpoints, as this runs at load.
        crop = self.image_processor.crop_size.height
        best_height, best_width = select_best_resolution((height, width),
                                                         [tuple(p) for p in self.image_processor.image_grid_pinpoints])
        return np.asarray(out["pixel_values"][0][:1 + (best_height // crop) * (best_width // crop)]), (height, width)

    def _grid(self, height: int, width: int) -> tuple[int, int]:
        """Crops (rows, columns) of an image of this size: those of its best pinpoint resolution."""
        best_height, best_width = select_best_resolution((height, width), self.pinpoints)
        return best_height // self.crop_size, best_width // self.crop_size

    def crops(self, pixels: tuple[np.ndarray, tuple[int, int]]) -> int:
        return pixels[0].shape[0]

    @torch.inference_mode()
    def encode_images(self, pixels: list[tuple[np.ndarray, tuple[int, int]]]) -> list[torch.Tensor]:
        """preprocess() outputs → packed features [T_i, hidden] per image; every crop of every image
        runs in one vision batch."""
        counts = [crops.shape[0] for crops, _ in pixels]
        features = self.project(torch.from_numpy(np.concatenate([crops for crops, _ in pixels])))
        return [self._pack(f, size) for f, (_, size) in zip(features.split(counts), pixels)]

    def _pack(self, features: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """features [crops, side², hidden] of one image → [base (side²) ; unpadded grid rows, each
        closed by image_newline]."""
        base, tiles = features[0], features[1:]
        newline = self.newline.to(features.dtype)
        if not len(tiles):  # one crop only: the base view and a newline
            return torch.cat([base, newline[None]])
        rows, cols = self._grid(*size)
        hidden = features.shape[-1]
        # [rows * cols, side * side, hidden] → the whole grid [hidden, rows * side, cols * side]
        grid = tiles.view(rows, cols, self.side, self.side, hidden).permute(4, 0, 2, 1, 3)
        grid = _unpad(grid.reshape(hidden, rows * self.side, cols * self.side), *size)
        grid = torch.cat([grid, newline[:, None, None].expand(hidden, grid.shape[1], 1)], dim=2)
        return torch.cat([base, grid.flatten(1).T])


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
