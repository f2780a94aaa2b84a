"""Pixels that travel to the device as the image's own uint8 values and are normalized there.

A processor path that ends in normalize_table's lookup (images.ClipPixels) can hand encode_images
the resized, cropped uint8 values and the table instead of the looked-up float32s: a quarter of the
bytes to copy, and on the device one gather from the same table gives the same float32s (a lookup
does no arithmetic), so the features, and every record, keep their bits."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .plan import to_device


@dataclass(frozen=True, eq=False)
class CodedPixels:
    """One image's pixels as uint8 codes and the table that normalizes them; np.asarray gives the
    float32 pixels the processor makes."""

    codes: np.ndarray  # [3, H, W] uint8: the resized, cropped image, channels first
    # [3, 256] float32: normalize_table's, each channel's float32 for each uint8 value
    table: np.ndarray

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        pixels = np.stack([np.take(self.table[c], self.codes[c]) for c in range(3)])
        return pixels if dtype is None else pixels.astype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape


def pixels_on_device(pixels: list, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """preprocess() outputs of N images, float32 arrays [3, H, W] or CodedPixels of one table →
    [N, 3, H, W] on the device in dtype. Arrays are copied as they are; codes are copied as uint8
    (non-blocking, from pinned memory on CUDA) and normalized on the device by a gather from their
    table, then cast, as the float32s would be."""
    if not all(isinstance(p, CodedPixels) for p in pixels):
        return torch.from_numpy(np.stack([np.asarray(p) for p in pixels])).to(device, dtype)
    table = pixels[0].table
    if any(p.table is not table and not np.array_equal(p.table, table) for p in pixels):
        raise ValueError("pixels_on_device: the images' normalize tables differ (pixels of two "
                         "processors in one call)")
    codes = to_device(torch.from_numpy(np.stack([p.codes for p in pixels])), device)
    lookup = to_device(torch.from_numpy(table), device)
    # [N, 3, H, W] uint8 → flat indices into the [3 * 256] table: channel c's values at
    # c * 256 + value
    offsets = torch.arange(0, 3 * 256, 256, device=device).view(1, 3, 1, 1)
    return torch.take(lookup, codes.long() + offsets).to(dtype)
