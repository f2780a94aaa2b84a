"""Image files: found, read and decoded before any compute, so a bad file stops a run up front
(or, with skip-bad, becomes an error record) instead of failing hours in."""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError


class ImageError(ValueError):
    """A missing or undecodable image; the message names the path."""


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
    """The file's bytes; with verify, decoded once to prove they are an image (JPEGs in draft mode:
    every entropy-coded byte is still read, so a truncated file fails, at a quarter of the cost)."""
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
        loaded.open(draft=True)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise ImageError(f"{path}: not a decodable image ({err})") from None
    return loaded


def check_images(folder: str | Path, names: list[str]) -> dict[str, str]:
    """Problems by image name ({} when every file is present and decodes); reads each file once."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageError(f"{folder}: image folder not found")
    problems = {}
    for name in dict.fromkeys(names):
        try:
            read_image(folder / name)
        except ImageError as err:
            problems[name] = str(err)
    return problems
