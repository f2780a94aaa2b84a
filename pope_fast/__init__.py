"""pope-fast: fast POPE evaluation of vision-language models under every answer readout.

Subpackages: `pope_fast.readout` (data, readouts, metrics, records; no torch), `pope_fast.engine`
(loading and the prefill step), `pope_fast.kernels` (Triton kernels with torch references),
`pope_fast.bench` (throughput benchmarks); `pope_fast.cli` is the `pope-fast` command; beside it the
application: `pope_fast.sweep` (POPE sweeps into run folders), `pope_fast.distributed` (torchrun).
`pope_fast.demo()` writes the built-in demo's checkpoint and images, to try the Python API on.
"""
__version__ = "0.1.0"


def demo(folder=None, questions: int = 60):
    """The built-in demo's inputs (pope_fast.builtin.Demo: checkpoint, images_dir, questions,
    images): a random tiny LLaVA-1.5 and synthetic images, written once under `folder` (default
    ~/.cache/pope-fast)."""
    # on call: every subpackage imports pope_fast, which stays light
    from .builtin import demo as write

    return write(folder, questions)
