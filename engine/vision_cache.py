"""Cache of projected image features, keyed by content, never by file name.

Key = hash(image bytes, preprocessing settings, model fingerprint): two different images with the same
file name in two folders never share an entry, and a second sweep with the same model and settings
skips the vision tower. In memory always; on disk (one safetensors file per key) with a cache dir.
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
from safetensors import SafetensorError
from safetensors.torch import load_file, save

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


def feature_key(image_bytes: bytes, preprocess: dict, model_fingerprint: str) -> str:
    h = hashlib.blake2b(digest_size=20)
    h.update(hashlib.sha256(image_bytes).digest())
    h.update(json.dumps(preprocess, sort_keys=True, default=str).encode())
    h.update(model_fingerprint.encode())
    return h.hexdigest()


class VisionCache:
    def __init__(self, cache_dir: str | Path | None = None, max_in_memory: int = 64):
        self.dir = Path(cache_dir) if cache_dir else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.max_in_memory = max_in_memory
        self._memory: dict[str, torch.Tensor] = {}
        self.hits = self.disk_hits = self.misses = 0

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.safetensors"

    def contains(self, key: str) -> bool:
        return key in self._memory or (self.dir is not None and self._path(key).is_file())

    def get(self, key: str, device: torch.device) -> torch.Tensor | None:
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        if self.dir is not None and self._path(key).is_file():
            try:
                features = load_file(str(self._path(key)))["features"].to(device)
            except (OSError, KeyError, ValueError, RuntimeError, SafetensorError):
                # a truncated or garbled entry (a disk that filled, a copy cut short): drop it, recompute
                with contextlib.suppress(OSError):
                    self._path(key).unlink()
                return None
            self.disk_hits += 1
            self._remember(key, features)
            return features
        return None

    def put(self, key: str, features: torch.Tensor) -> None:
        """Store freshly computed features (each put is one miss: the vision tower ran)."""
        self.misses += 1
        self._remember(key, features)
        if self.dir is not None:
            # A private temp name, then an atomic rename: neither a crash nor a second process
            # sharing the cache dir ever leaves or reads a torn entry.
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{key}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(save({"features": features.detach().cpu().contiguous()}))
                os.replace(tmp, self._path(key))
            except OSError as err:  # a full disk, say: name the cache file
                raise OSError(err.errno, err.strerror, str(self._path(key))) from None
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

    def _remember(self, key: str, features: torch.Tensor) -> None:
        # POPE visits images in order, so a small FIFO is enough; features of a 7B model are ~4.7 MB each.
        if len(self._memory) >= self.max_in_memory:
            self._memory.pop(next(iter(self._memory)))
        self._memory[key] = features
