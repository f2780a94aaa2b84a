"""What proves a downloaded file is the one the hub announced. The hub library keeps each file of a
snapshot as a link to blobs/<ETag>, and the hub's ETag of a file is its hash: an LFS file's sha256
(the oid its pointer states) and a git file's blob id (the sha1 of `blob <size>\\0` and its bytes).
A file whose bytes hash otherwise is not the hub's (a proxy or mirror serving other bytes, a disk
that lost some): it is refused and its blob removed, so the next download fetches it again. An ETag
of any other form (a mirror's own) states no hash and is not checked; a snapshot read from the cache
as it is was checked when pope-fast downloaded it (`hf cache verify` checks any).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

SHA256 = re.compile(r"^[0-9a-f]{64}$")
GIT_BLOB = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Mismatch:
    """A snapshot's file whose bytes are not those its hub hash names."""

    link: Path  # the snapshot's file, a link to its blob
    algorithm: str  # "sha256" or "git blob id"
    expected: str
    actual: str

    def remove(self) -> None:
        """The blob and the link to it out of the cache: a later download fetches the file again."""
        blob = Path(os.path.realpath(self.link))
        self.link.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)


def file_hash(path: Path, algorithm: str) -> str:
    """The file's sha256, or its git blob id."""
    digest = (hashlib.sha256() if algorithm == "sha256"
              else hashlib.sha1(b"blob %d\0" % path.stat().st_size))
    with open(path, "rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def mismatch(link: Path) -> Mismatch | None:
    """How a snapshot's file differs from the hash its blob is named by, or None (it agrees, or
    states none)."""
    if not link.is_symlink():
        return None
    expected = Path(os.path.realpath(link)).name
    algorithm = ("sha256" if SHA256.match(expected)
                 else "git blob id" if GIT_BLOB.match(expected) else None)
    if algorithm is None:
        return None
    actual = file_hash(link, algorithm)
    return None if actual == expected else Mismatch(link, algorithm, expected, actual)


def first_mismatch(links: list[Path]) -> Mismatch | None:
    return next((m for m in map(mismatch, links) if m is not None), None)
