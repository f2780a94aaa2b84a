"""Shared fixtures. The Triton interpreter must be switched on before triton is first imported,
so it is set here, at the top of the first module pytest loads."""
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared() -> Path:
    """The workplace's ../shared folder (POPE files, real tokenizers, fixtures), or a skip."""
    root = Path(os.environ.get("POPE_FAST_SHARED", SHARED))
    if not (root / "README.md").is_file():
        pytest.skip(f"../shared is absent ({root}): real tokenizer/data checks need it")
    return root
