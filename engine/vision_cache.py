"""Cache of projected image features, keyed by content, never by file name.

Key = hash(image bytes, preprocessing settings, model fingerprint): two different images with the same
file name in two folders never share an entry, and a second sweep with the same model and settings
skips the vision tower. In memory always; on disk (one safetensors file per key) with a cache dir.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# Sampling every element of a 300M-parameter tower would cost seconds per load; a strided sample
# plus both ends of every tensor tells different fine-tunes apart, which differ almost everywhere.
_SAMPLE_STRIDE = 4099
_EDGE = 2048


def tensor_fingerprint(tensors: dict[str, torch.Tensor], extra: dict | None = None) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].detach().reshape(-1)
        h.update(f"{name}:{tuple(tensors[name].shape)}:{t.dtype}".encode())
        sample = torch.cat([t[:_EDGE], t[_EDGE:-_EDGE:_SAMPLE_STRIDE], t[-_EDGE:]]) if t.numel() > 2 * _EDGE else t
        h.update(sample.cpu().contiguous().view(torch.uint8).numpy().tobytes())
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
            except (OSError, KeyError, ValueError, RuntimeError):  # unreadable entry: recompute it
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
            os.close(fd)
            try:
                save_file({"features": features.detach().cpu().contiguous()}, tmp)
                os.replace(tmp, self._path(key))
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

    def _remember(self, key: str, features: torch.Tensor) -> None:
        # POPE visits images in order, so a small FIFO is enough; features of a 7B model are ~4.7 MB each.
        if len(self._memory) >= self.max_in_memory:
            self._memory.pop(next(iter(self._memory)))
        self._memory[key] = features
