"""Pyflakes' checks (ruff's F rules) over the whole tree, at zero findings: an unbound or undefined
name, an import that shadows or is never used, a local assigned and never read. Such a name in a
branch no test reaches (Shard.join's CUDA branch raised UnboundLocalError on every GPU) is found
here, on a CPU, before a user meets it."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("engine", "kernels", "readout", "bench", "pope_fast", "tests", "setup.py")


def test_pyflakes_finds_nothing():
    # --isolated: the rules named here, whatever ruff configuration the machine has
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
                           "--select", "F", "--output-format", "concise", *SOURCES],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
