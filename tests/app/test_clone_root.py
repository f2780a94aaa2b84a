"""pope-fast started from the clone's root, where the README's commands leave users: the root is
then on sys.path (`python -m`, `python -m pytest`, torchrun's `-m`, a REPL or notebook), and its
top-level kernels/ folder lies in the way of the hub's `kernels` package, which transformers,
bitsandbytes and setuptools import. kernels/__init__.py hands such an import on (docs/design.md);
these check it as a user meets it. torchrun's `-m pope_fast eval` from the root (each rank a
`python -m pope_fast` there), byte for byte against a single process, is test_distributed's job
(tests/torchrunjobs.py starts every launch there)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.slow  # a process that imports transformers (5 s on 2 cores)
def test_from_the_root_kernels_is_the_hubs_and_transformers_imports():
    """The import transformers makes of the hub's package (its attention and activation layers;
    transformers 5.25 installs it, constraints.txt pins it) gets that package, and pope_fast.kernels
    is still ours. Without the hub's package: the next test."""
    done = _python("-c", "import transformers.activations, pope_fast.kernels, kernels; "
                         "print(kernels.__file__); print(pope_fast.kernels.__file__)")
    assert done.returncode == 0, done.stderr[-2000:]
    hub, ours = done.stdout.split()
    assert Path(ours) == ROOT / "kernels" / "__init__.py"
    assert Path(hub).parent.name == "kernels" and Path(hub).parent.parent != ROOT


def test_from_the_root_without_the_hub_package_kernels_is_not_found():
    """With no other `kernels` on sys.path (-S: no site-packages), the bare import fails as for a
    package that is not there, so a caller's `try: import kernels` takes its fallback instead of
    getting pope-fast's kernels."""
    done = _python("-S", "-c", "import sys; sys.path.insert(0, ''); import kernels")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "ModuleNotFoundError: No module named 'kernels'"


# a test module run in a pytest of its own (transformers imported by the tests' conftest)
@pytest.mark.slow
def test_python_m_pytest_runs_from_the_root():
    done = _python("-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                   "tests/engine/test_loader_alignment.py")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("1 passed")
