"""Shared fixtures. The Triton interpreter must be switched on before triton is first imported,
so it is set here, at the top of the first module pytest loads."""
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from registry import REGISTRY, Tiny  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared() -> Path:
    """The workplace's ../shared folder (POPE files, real tokenizers, fixtures), or a skip."""
    root = Path(os.environ.get("POPE_FAST_SHARED", SHARED))
    if not (root / "README.md").is_file():
        pytest.skip(f"../shared is absent ({root}): real tokenizer/data checks need it")
    return root


# --- the families' tiny checkpoints (registry.REGISTRY), for every folder's tests -----------------------------
# Each family's checkpoint, fp32 transformers model and oracle are made once a session, on first use (registry.Tiny):
# test_battery reaches them through `family` (parametrized indirectly over the registry), the family files, the
# engine's, the app's and the bench's tests by name.

@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def family(request):
    return REGISTRY[request.param]


@pytest.fixture(scope="session")
def family_checkpoint(family, tiny):
    return tiny.checkpoint(family.name)


@pytest.fixture(scope="session")
def family_oracle(family, tiny):
    return tiny.oracle(family.name)
