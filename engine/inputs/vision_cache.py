"""Cache of projected image features, keyed by content, never by file name.

Key = hash(image bytes, preprocessing settings, model fingerprint): two different images with the
same file name in two folders never share an entry, and a second sweep with the same model and
settings skips the vision tower. In memory always; on disk (one safetensors file per key) with a
cache dir, each entry carrying its proof: the key it was written for and a digest of that key and of
its features' dtype, shape and bytes. An entry is served only when its proof holds; one renamed,
swapped, altered or written before entries carried a proof is dropped and recomputed, and the cache
lists it in `rejected`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from ..utils.loader import aligned
from ..utils.settings import Settings

ENTRY_FORMAT = "pope-fast features 2"  # 1: the entries before their proof (a tensor alone)

def tensor_fingerprint(tensors: dict[str, torch.Tensor], extra: dict | None = None) -> str:
    """A digest of every byte of every tensor (and their names, shapes, dtypes and `extra`): an edit
    anywhere in the vision weights changes the key of every cached feature. Tensors are hashed in
    parallel threads (hashlib releases the GIL)."""
    names = sorted(tensors)

    def digest(name: str) -> bytes:
        t = tensors[name].detach().cpu().contiguous().reshape(-1)
        return hashlib.sha256(memoryview(t.view(torch.uint8).numpy())).digest()

    h = hashlib.blake2b(digest_size=16)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        for name, d in zip(names, pool.map(digest, names)):
            h.update(f"{name}:{tuple(tensors[name].shape)}:{tensors[name].dtype}".encode())
            h.update(d)
    h.update(json.dumps(extra or {}, sort_keys=True, default=str).encode())
    return h.hexdigest()


def vision_fingerprint(tensors: dict[str, torch.Tensor], settings: Settings, **extra) -> str:
    """The cached features' dependence on the weights that make them, the compute settings and
    `extra` (what a family's packing of them reads from its config)."""
    return tensor_fingerprint(tensors, extra={**settings.feature_settings(), **extra})


def feature_key(image_bytes: bytes, processor: dict, settings: Settings,
                model_fingerprint: str) -> str:
    """An image's key: its bytes, what decides its pixels (`processor`: the family's
    preprocess_settings; the settings' image steps) and the model that encodes them
    (vision_fingerprint)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(hashlib.sha256(image_bytes).digest())
    preprocess = {"processor": processor, "steps": settings.pixel_settings()}
    h.update(json.dumps(preprocess, sort_keys=True, default=str).encode())
    h.update(model_fingerprint.encode())
    return h.hexdigest()


def noised_key(key: str, step: int, seed: int) -> str:
    """The key of VCD's noised copy of the image of `key`: its noise step and the seed its noise is
    drawn from."""
    return f"{key}-noise{step}-seed{seed}"


def entry_digest(key: str, features: torch.Tensor) -> str:
    """What proves a disk entry: its key, its features' dtype and shape, every byte of them (sha256,
    the faster of it and blake2b here: 3.4 ms for a 7B model's 4.7 MB of features,
    docs/design.md)."""
    h = hashlib.sha256(f"{key}:{features.dtype}:{tuple(features.shape)}:".encode())
    h.update(memoryview(features.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def read_entry(path: Path, key: str) -> tuple[torch.Tensor | None, str | None]:
    """A disk entry's features where its proof holds, else None and why not."""
    try:
        with safe_open(str(path), framework="pt") as f:
            proof = f.metadata() or {}
            features = f.get_tensor("features")
    except (OSError, KeyError, ValueError, RuntimeError, SafetensorError):
        return None, "unreadable (truncated or garbled)"
    if proof.get("format") != ENTRY_FORMAT:
        return None, "written before entries carried a proof"
    if proof.get("key") != key:
        return None, "written for another key (renamed or swapped)"
    if proof.get("digest") != entry_digest(key, features):
        return None, "altered since written"
    return features, None


class VisionCache:
    def __init__(self, cache_dir: str | Path | None = None, max_in_memory: int = 64):
        self.dir = Path(cache_dir) if cache_dir else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.max_in_memory = max_in_memory
        self._memory: dict[str, torch.Tensor] = {}
        self.hits = self.disk_hits = self.misses = 0
        self.rejected: list[tuple[Path, str]] = []  # disk entries dropped and recomputed, and why

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.safetensors"

    def contains(self, key: str) -> bool:
        return key in self._memory or (self.dir is not None and self._path(key).is_file())

    def get(self, key: str, device: torch.device) -> torch.Tensor | None:
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        if self.dir is None or not self._path(key).is_file():
            return None
        features, why = read_entry(self._path(key), key)
        if features is None:
            # a disk that filled, a copy cut short, a file renamed or edited: recompute
            self.rejected.append((self._path(key), why))
            with contextlib.suppress(OSError):
                self._path(key).unlink()
            return None
        self.disk_hits += 1
        # read in place, at its file's offset: the loader says why not
        features = aligned(features).to(device)
        self._remember(key, features)
        return features

    def put(self, key: str, features: torch.Tensor) -> None:
        """Store freshly computed features (each put is one miss: the vision tower ran)."""
        self.misses += 1
        self._remember(key, features)
        if self.dir is not None:
            # A private temp name, then an atomic rename: neither a crash nor a second process
            # sharing the cache dir ever leaves or reads a torn entry.
            stored = features.detach().cpu().contiguous()
            proof = {"format": ENTRY_FORMAT, "key": key, "digest": entry_digest(key, stored)}
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{key}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(save({"features": stored}, metadata=proof))
                os.replace(tmp, self._path(key))
            except OSError as err:  # a full disk, say: name the cache file
                raise OSError(err.errno, err.strerror, str(self._path(key))) from None
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

    def _remember(self, key: str, features: torch.Tensor) -> None:
        # POPE visits images in order, so a small FIFO is enough; features of a 7B model are ~4.7 MB
        # each.
        if len(self._memory) >= self.max_in_memory:
            self._memory.pop(next(iter(self._memory)))
        self._memory[key] = features
