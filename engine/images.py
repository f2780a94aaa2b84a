"""Image files: found, read and decoded before any compute, so a bad file stops a run up front
(or, with skip-bad, becomes an error record) instead of failing hours in."""
from __future__ import annotations

import io
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError
from transformers.image_processing_utils import select_best_resolution


class ImageError(ValueError):
    """A missing or undecodable image; the message names the path."""


# What PIL raises for a file it cannot decode (a decompression bomb is not an OSError).
DECODE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@dataclass(frozen=True)
class LoadedImage:
    path: Path
    data: bytes  # the file's bytes: what the feature cache hashes

    def open(self, draft: bool = False) -> Image.Image:
        image = Image.open(io.BytesIO(self.data))
        if draft and image.format == "JPEG":
            image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
        return image


def read_image(path: str | Path, verify: bool = True) -> LoadedImage:
    """The file's bytes; with verify, proven to be a whole image without decoding it where the format
    allows: a JPEG whose header parses and that ends with its end-of-image marker, a PNG whose chunks all pass
    their CRCs. Anything else (a JPEG with bytes after the marker, other formats) is decoded once,
    JPEGs in draft mode (every entropy-coded byte is still read, so a truncated file fails). The
    draft decode cost ~1 ms per COCO image, a third of the CPU time the sweep spends per image
    outside the model on the 2-core machine."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ImageError(f"{path}: image file not found") from None
    except OSError as err:
        raise ImageError(f"{path}: cannot read image ({err.strerror or err})") from None
    loaded = LoadedImage(path, data)
    if not verify:
        return loaded
    try:
        image = Image.open(io.BytesIO(data))  # the header: size, mode, format
        if image.format == "PNG":
            image.verify()
        elif not (image.format == "JPEG" and data.endswith(b"\xff\xd9")):
            loaded.open(draft=True)
    except DECODE_ERRORS as err:
        raise ImageError(f"{path}: not a decodable image ({err})") from None
    return loaded


def check_images(folder: str | Path, names: list[str], workers: int = 1) -> dict[str, str]:
    """Problems by image name ({} when every file is present and decodes); reads each file once, in
    `workers` threads (decoding releases the GIL)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageError(f"{folder}: image folder not found")

    def problem(name: str) -> str | None:
        try:
            read_image(folder / name)
        except ImageError as err:
            return str(err)
        return None

    unique = list(dict.fromkeys(names))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        found = list(pool.map(problem, unique))
    return {name: why for name, why in zip(unique, found) if why is not None}


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB as transformers' processors make it: images with an alpha band or a transparency key are
    composited over white first (a plain convert('RGB') would drop the alpha and keep what lies under it)."""
    keyed = image.info.get("transparency") is not None
    if image.mode == "RGB" and not keyed:
        return image
    if "A" in image.getbands() or keyed:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


class ClipPixels:
    """transformers' PIL-backend CLIP processor (shortest edge resized with PIL, centre crop, rescale,
    normalize) with the same values in ~60% of the time (2.7 vs 4.2 ms per COCO-sized image on the CPU
    machine): the same PIL resize, then one lookup per pixel into a table that maps each uint8 value to
    its normalized float32, computed as the processor computes it (float64 rescale, float32 cast, float32
    (x - mean) / std), instead of three full-image float passes."""

    def __init__(self, shortest_edge: int, crop: tuple[int, int], resample: int, rescale_factor: float,
                 mean, std):
        self.shortest_edge, self.crop, self.resample = shortest_edge, crop, resample
        values = (np.arange(256, dtype=np.float64) * rescale_factor).astype(np.float32)
        mean, std = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
        self.table = (values[None, :] - mean[:, None]) / std[:, None]  # [3, 256]

    @classmethod
    def for_processor(cls, processor) -> "ClipPixels | None":
        """The fast path for this processor, or None where it does anything else (other backends,
        padding, fixed-size resizes, crops larger than the resized image, ...)."""
        if type(processor).__name__ != "CLIPImageProcessorPil" or getattr(processor, "do_pad", None):
            return None
        size, crop = processor.size, processor.crop_size
        flags = (processor.do_resize, processor.do_center_crop, processor.do_rescale, processor.do_normalize,
                 processor.do_convert_rgb)
        if not all(flags) or not size.shortest_edge or size.longest_edge or not (crop.height and crop.width):
            return None
        if max(crop.height, crop.width) > size.shortest_edge or np.size(processor.image_mean) != 3:
            return None
        return cls(size.shortest_edge, (crop.height, crop.width), int(processor.resample),
                   processor.rescale_factor, processor.image_mean, processor.image_std)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """An image → pixel values [3, crop height, crop width] float32."""
        image = to_rgb(image)
        width, height = image.size
        short, long = sorted((width, height))
        # The processor's rounding: the long edge scales to int(edge * long / short).
        new_long = int(self.shortest_edge * long / short)
        new_width, new_height = (self.shortest_edge, new_long) if width <= height else (new_long, self.shortest_edge)
        resized = np.asarray(image.resize((new_width, new_height), resample=self.resample))
        top, left = (new_height - self.crop[0]) // 2, (new_width - self.crop[1]) // 2
        resized = resized[top:top + self.crop[0], left:left + self.crop[1]]
        return np.stack([np.take(self.table[c], resized[:, :, c]) for c in range(3)])


class AnyresPixels:
    """transformers' PIL-backend LLaVA-NeXT processor (the image resized to fit its best pinpoint
    resolution and padded with zeros, cut into crops, after a base view resized to one crop) with the
    same values in ~55% of the time (10 vs 18 ms for a 640 x 480 image, 5 crops, on the CPU machine):
    the same PIL resizes and the same zero padding, then one table lookup per pixel as in ClipPixels,
    instead of a processor pass per crop (whose own resize and centre crop leave a crop-sized crop
    unchanged). LlavaNextModel checks it against the processor at load, as LlavaModel does ClipPixels."""

    def __init__(self, pinpoints: list[tuple[int, int]], crop: int, resample: int, rescale_factor: float, mean, std):
        self.pinpoints, self.crop, self.resample = pinpoints, crop, resample
        self.lookup = ClipPixels(crop, (crop, crop), resample, rescale_factor, mean, std).table

    @classmethod
    def for_processor(cls, processor) -> "AnyresPixels | None":
        if type(processor).__name__ != "LlavaNextImageProcessorPil":
            return None
        size, crop = processor.size, processor.crop_size
        flags = (processor.do_resize, processor.do_center_crop, processor.do_rescale, processor.do_normalize,
                 processor.do_convert_rgb)
        # Per crop the processor resizes to the shortest edge and centre-crops: identities only when
        # both equal the crop size.
        if not all(flags) or not size.shortest_edge or not (crop.height == crop.width == size.shortest_edge):
            return None
        # transformers keeps only whole crops of a pinpoint that is not a multiple of the crop size
        if np.size(processor.image_mean) != 3 or any(h % crop.height or w % crop.height
                                                     for h, w in processor.image_grid_pinpoints):
            return None
        return cls([tuple(p) for p in processor.image_grid_pinpoints], crop.height, int(processor.resample),
                   processor.rescale_factor, processor.image_mean, processor.image_std)

    def __call__(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        """An image → (crops [1 + rows * cols, 3, crop, crop] float32, base view first; (height, width))."""
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
        crops = np.stack([np.stack([np.take(self.lookup[c], v[:, :, c]) for c in range(3)]) for v in views])
        return crops, (height, width)
