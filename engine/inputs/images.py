"""Image files and pixels.

Files are found, read and proven whole before any compute, so a bad file stops a run up front (or,
with skip-bad, becomes an error record) instead of failing hours in. Pixels: what every exact fast
path of a processor shares (the normalize table that replaces its float passes with one lookup per
pixel, the check against the checkpoint's own processor at load, `checked_fast_path`, which drops a
fast path where it differs by a bit), and CLIP's resize-and-crop path; a family's own processor path
lives with its family (engine/models/)."""
from __future__ import annotations

import io
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError


class ImageError(ValueError):
    """A missing or undecodable image; the message names the path."""


# What PIL raises for a file it cannot decode (a decompression bomb is not an OSError).
DECODE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError,
                 Image.DecompressionBombError)
# PIL names the in-memory file it read in its messages; its address differs in every process.
_BUFFER = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>")


def undecodable(path, err: Exception) -> ImageError:
    """The error of a file PIL cannot decode, naming it (the same text in every run)."""
    return ImageError(f"{path}: not a decodable image ({_BUFFER.sub('', str(err))})")


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


def read_image(path: str | Path, verify: bool = True, data: bytes | None = None) -> LoadedImage:
    """The file's bytes (or `data`: an image embedded in a question file, `path` naming it in
    messages); with verify, proven to be a whole image without decoding it where the format allows:
    a JPEG whose header parses and that ends with its end-of-image marker, a PNG whose chunks all
    pass their CRCs. Anything else (a JPEG with bytes after the marker, other formats) is decoded
    once, JPEGs in draft mode (every entropy-coded byte is still read, so a truncated file
    fails)."""
    path = Path(path)
    try:
        data = path.read_bytes() if data is None else data
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
        raise undecodable(path, err) from None
    return loaded


# Modes a PNG holds as they are; any other in-memory image is converted first, as preprocessing
# converts it when the same image comes from a file.
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")


def as_loaded(image: LoadedImage | Image.Image | bytes | str | Path) -> LoadedImage:
    """An image as the engine's API takes one: a file path, a file's bytes, a PIL image or a
    LoadedImage."""
    if isinstance(image, (str, Path)):
        return read_image(image)
    if isinstance(image, (bytes, bytearray)):
        return read_image(Path("<bytes>"), data=bytes(image))
    if isinstance(image, Image.Image):
        if image.mode not in PNG_MODES:  # CMYK, I, F, YCbCr, HSV, ...: the file path's conversion
            image = to_rgb(image)
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return LoadedImage(Path("<in-memory>"), buf.getvalue())
    if not isinstance(image, LoadedImage):
        raise TypeError("image must be a file path, a file's bytes, a PIL image or a LoadedImage, "
                        f"not {type(image).__name__}")
    return image


def embedded_path(name: str) -> Path:
    """What an embedded image is called in messages."""
    return Path(f"{name} (embedded)")


def image_file(folder: str | Path, name: str) -> Path:
    """The file `name` names in the image folder; ImageError where reading it would leave the
    folder: an absolute name, a `..` step, or a symbolic link (the file's or a subfolder's) that
    resolves outside it, so that a question file cannot have a system file (or another data set's)
    read, hashed and recorded."""
    folder, path = Path(folder), Path(name)
    if path.is_absolute() or ".." in path.parts:
        raise ImageError(f"image {name!r} is not a name inside the image folder {folder} (an "
                         "absolute path, or one climbing out with '..')")
    full = folder / path
    if not full.resolve().is_relative_to(folder.resolve()):
        raise ImageError(f"{full}: a symbolic link out of the image folder (to {full.resolve()}); "
                         "give --images the folder the images are in")
    return full


def check_images(folder: str | Path | None, names: list[str], workers: int = 1,
                 embedded: dict[str, bytes] | None = None) -> dict[str, str]:
    """Problems by image name ({} when every file is present and decodes); reads each file once, in
    `workers` threads (decoding releases the GIL). Names in `embedded` are checked from those bytes;
    an empty name is a question asked without an image (HallusionBench's), which has no file to
    check."""
    embedded = embedded or {}
    folder = None if folder is None else Path(folder)
    if any(name and name not in embedded for name in names) \
            and (folder is None or not folder.is_dir()):
        raise ImageError(f"{folder}: image folder not found" if folder
                         else "no image folder given for image files")

    def problem(name: str) -> str | None:
        if not name:
            return None
        try:
            if name in embedded:
                read_image(embedded_path(name), data=embedded[name])
            else:
                read_image(image_file(folder, name))
        except ImageError as err:
            return str(err)
        return None

    unique = list(dict.fromkeys(names))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        found = list(pool.map(problem, unique))
    return {name: why for name, why in zip(unique, found) if why is not None}


def reencoded(image: Image.Image, how: str) -> Image.Image:
    """The image as a tool hands it to its processor (Settings.image_reencode): as read; (rgb)
    through PIL's convert('RGB'), as lmms-eval's POPE task (tasks/pope/utils.py l.4-6) and
    VLMEvalKit's LLaVA, LLaVA-NeXT, OneVision and mPLUG-Owl2 classes open every image, which drops
    an alpha band where the processor would composite it over white (an RGB file is copied, its info
    kept, as PIL does); (load_image) as transformers' load_image opens a path a processor is given
    (its EXIF orientation applied, then convert('RGB')), as VLMEvalKit's Gemma3 hands its processor
    each image's path; or (jpeg85) converted to RGB where it is not and saved as a JPEG of quality
    85 with PIL's defaults, then decoded again: what lmms-eval's
    encode_image_to_data_url(image_format="JPEG", convert_rgb=True, quality=85) sends
    (models/model_utils/media_encoder.py l.142-167, l.82-107 at v0.7.2) and the processor
    decodes."""
    if how == "none":
        return image
    if how == "rgb":
        return image.convert("RGB")
    if how == "load_image":
        return ImageOps.exif_transpose(image).convert("RGB")
    if image.mode != "RGB":
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    decoded = Image.open(io.BytesIO(buffer.getvalue()))
    decoded.load()
    return decoded


def qwen_vl_utils_size(height: int, width: int, factor: int, min_pixels: int,
                       max_pixels: int) -> tuple[int, int]:
    """qwen_vl_utils' smart_resize (vision_process.py, qwen-vl-utils 0.0.14): each side rounded to a
    multiple of `factor`, then, where the area leaves [min_pixels, max_pixels], both sides scaled by
    one factor and floored (too large) or ceiled (too small) to multiples of it. Returns
    (height, width)."""
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = math.floor(height / beta / factor) * factor
        w = math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def resized(image: Image.Image, how: str) -> Image.Image:
    """The image as a tool resizes it before its processor (Settings.image_resize): as read, or
    (qwen_vl_utils:F[:MIN:MAX]) as qwen_vl_utils' fetch_image does: composited over white where it
    has an alpha band (its to_rgb), its smart_resize at factor F within MIN and MAX pixels (its
    defaults: 4 and 16384 tokens of F*F pixels), and PIL's resize with its default filter
    (bicubic)."""
    if how == "none":
        return image
    factor, *bounds = map(int, how.split(":")[1:])
    low, high = bounds or (4 * factor**2, 16384 * factor**2)
    if image.mode == "RGBA":
        white = Image.new("RGB", image.size, (255, 255, 255))
        white.paste(image, mask=image.split()[3])
        image = white
    else:
        image = image.convert("RGB")
    height, width = qwen_vl_utils_size(image.height, image.width, factor, low, high)
    return image.resize((width, height), resample=Image.Resampling.BICUBIC)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB as transformers' processors make it: images with an alpha band or a transparency key are
    composited over white first (a plain convert('RGB') would drop the alpha and keep what lies
    under it)."""
    keyed = image.info.get("transparency") is not None
    if image.mode == "RGB" and not keyed:
        return image
    if "A" in image.getbands() or keyed:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def normalize_table(rescale_factor: float, mean, std) -> np.ndarray:
    """[3, 256] float32: each uint8 value of each channel rescaled and normalized exactly as
    transformers' processors do it (a float64 rescale cast to float32, then float32 (x - mean) /
    std), so that one lookup per pixel replaces three full-image float passes with the same bits."""
    values = (np.arange(256, dtype=np.float64) * rescale_factor).astype(np.float32)
    mean, std = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
    return (values[None, :] - mean[:, None]) / std[:, None]


class ClipPixels:
    """transformers' PIL-backend CLIP processor (shortest edge resized with PIL, centre crop,
    rescale, normalize) with the same values, faster (bench/RESULTS.md): the same PIL resize, then
    one lookup per pixel into a table that maps each uint8 value to its normalized float32, computed
    as the processor computes it (float64 rescale, float32 cast, float32 (x - mean) / std), instead
    of three full-image float passes."""

    def __init__(self, shortest_edge: int, crop: tuple[int, int], resample: int,
                 rescale_factor: float, mean, std):
        self.shortest_edge, self.crop, self.resample = shortest_edge, crop, resample
        self.table = normalize_table(rescale_factor, mean, std)

    @classmethod
    def for_processor(cls, processor) -> "ClipPixels | None":
        """The fast path for this processor, or None where it does anything else (other backends,
        padding, fixed-size resizes, crops larger than the resized image, ...)."""
        if type(processor).__name__ != "CLIPImageProcessorPil" \
                or getattr(processor, "do_pad", None):
            return None
        size, crop = processor.size, processor.crop_size
        flags = (processor.do_resize, processor.do_center_crop, processor.do_rescale,
                 processor.do_normalize, processor.do_convert_rgb)
        if not all(flags) or not size.shortest_edge or size.longest_edge \
                or not (crop.height and crop.width):
            return None
        if max(crop.height, crop.width) > size.shortest_edge or np.size(processor.image_mean) != 3:
            return None
        return cls(size.shortest_edge, (crop.height, crop.width), int(processor.resample),
                   processor.rescale_factor, processor.image_mean, processor.image_std)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """An image → pixel values [3, crop height, crop width] float32."""
        codes = self.codes(image)
        return np.stack([np.take(self.table[c], codes[c]) for c in range(3)])

    def codes(self, image: Image.Image) -> np.ndarray:
        """An image → its resized, cropped uint8 values [3, crop height, crop width], before the
        lookup."""
        image = to_rgb(image)
        width, height = image.size
        short, long = sorted((width, height))
        # The processor's rounding: the long edge scales to int(edge * long / short).
        new_long = int(self.shortest_edge * long / short)
        new_width, new_height = (self.shortest_edge, new_long) if width <= height \
            else (new_long, self.shortest_edge)
        resized = np.asarray(image.resize((new_width, new_height), resample=self.resample))
        top, left = (new_height - self.crop[0]) // 2, (new_width - self.crop[1]) // 2
        cropped = resized[top:top + self.crop[0], left:left + self.crop[1]]
        return np.ascontiguousarray(cropped.transpose(2, 0, 1))


def same_pixels(a, b) -> bool:
    """Bit-equal preprocess() outputs: arrays of one dtype and shape, or tuples of them (and
    sizes)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and \
            all(same_pixels(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and \
            np.array_equal(a, b)
    return a == b


def checked_fast_path(fast, reference):
    """`fast` if it gives `reference`'s outputs bit for bit on two textured probes of odd sizes, a
    landscape and a portrait one (both of the processors' fitting branches), else None. Run once at
    load, before any worker thread: a transformers release that computes differently turns the fast
    path off instead of changing a single value, and a flat probe could not tell, say, two
    resampling filters apart."""
    if fast is None:
        return None
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:377, 0:503]
    pattern = np.stack([x % 256, (y * 3) % 256, (x + y) % 256], axis=-1)
    noisy = np.clip(pattern + rng.integers(0, 60, (377, 503, 3)), 0, 255)
    landscape = Image.fromarray(noisy.astype(np.uint8))
    try:
        same = all(same_pixels(fast(probe), reference(probe))
                   for probe in (landscape, landscape.transpose(Image.Transpose.TRANSPOSE)))
    except Exception:  # a fast path that cannot even run on the probe is not this processor's
        return None
    return fast if same else None
