"""Content digests of what decides a run's answers, for resuming only what is provably the same run.

A checkpoint is fingerprinted by the sha256 of every file a load can read (weights, config,
tokenizer and processor files), all of their bytes: sampling blocks would let an in-place edit of
the weights through. sha256, not blake2b: OpenSSL's runs on the CPU's SHA extensions and was the
faster of the two here (README: the cost per run).
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Weight files below the top level are copies a load never reads (Meta's original/ folder, say).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def checkpoint_files(folder: Path) -> list[Path]:
    """Every non-hidden file of the folder, recursively, except weight files in subfolders."""
    found = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        if len(rel.parts) > 1 and path.name.endswith(WEIGHT_SUFFIXES):
            continue
        found.append(path)
    return found


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def checkpoint_digests(folder: str | Path) -> dict[str, str]:
    """Relative path → sha256 of each file of a checkpoint folder."""
    folder = Path(folder)
    files = checkpoint_files(folder)
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        digests = list(pool.map(file_sha256, files))
    return {str(p.relative_to(folder)): d for p, d in zip(files, digests)}
