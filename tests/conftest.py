"""Shared fixtures. The Triton interpreter must be switched on before triton is first imported,
so it is set here, at the top of the first module pytest loads."""
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (setup.cfg's -n auto) the workers share the cores: one worker's torch should
# not spread over all of them while the others do too. Through the environment, before torch is
# imported, so that the processes a test starts compute on as many threads as the test itself: CPU
# float sums depend on the thread count, and those tests compare records bit for bit.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1)
                                  // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

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


# --- the families' tiny checkpoints (registry.REGISTRY), for every folder's tests -----------------
# Each family's checkpoint, fp32 transformers model and oracle are made once a session, on first use
# (registry.Tiny): test_battery reaches them through `family` (parametrized indirectly over the
# registry), the family files, the engine's, the app's and the bench's tests by name.

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


def _group_of(item) -> str | None:
    """The worker group of a test: its registry family's (_family_of), else its module's where it
    uses a fixture made once a module, else none (any worker)."""
    name = _family_of(item)
    if name is not None:
        return name
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d.scope == "module" for fixturedefs in defs.values() for d in fixturedefs):
        return item.path.stem
    return None


def _family_of(item) -> str | None:
    """The registry family whose tiny objects a test uses: its `family` or `name` parameter, or its
    module's test_<model_type>.py."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for key in ("family", "name"):
        if params.get(key) in REGISTRY:
            return params[key]
    stem = item.path.stem.removeprefix("test_")
    return stem if item.path.parent.name == "families" and stem in REGISTRY else None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    """One worker per family and per module with a module fixture: a family's checkpoint, model and
    oracle (a session's, made on first use) and a module's fixtures are made by one worker, not by
    each."""
    for item in items:
        name = _group_of(item)
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))
