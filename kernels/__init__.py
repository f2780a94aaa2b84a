"""Triton kernels of pope-fast, each beside the pure-torch reference it must agree with.

`common` owns the triton import and the one decision of where kernels run: on CUDA tensors, or on
CPU tensors when ``TRITON_INTERPRET=1`` was set before triton was first imported (the interpreter:
slow, used by the tests). Every public op takes ``backend`` ("auto" | "triton" | "torch"); "auto"
picks the kernel on CUDA and the fp32 torch reference everywhere else, so the engine's CPU path
stays fast even in a test process that switched the interpreter on.

Imports inside this package are relative, and the package is only ever ``pope_fast.kernels``. Under
its bare name it is found only when the clone's root is on ``sys.path`` (``python -m pope_fast``,
``python -m pytest``, a REPL or notebook in the clone, torchrun's ``-m``), and then whoever asked
for ``kernels`` meant the hub's package of that name, which transformers, bitsandbytes and
setuptools import: this file hands that import to the next ``kernels`` on ``sys.path`` (or answers
that there is none) before anything of ours runs. docs/design.md says why this holds wherever
pope-fast is started.
"""
if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _clone = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))
    _spec = importlib.machinery.PathFinder.find_spec(
        "kernels", [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _clone])
    if _spec is None:
        raise ModuleNotFoundError("No module named 'kernels'", name="kernels")
    # the import system returns whatever sys.modules holds under the name once this file has run
    sys.modules["kernels"] = _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
else:  # imported as pope_fast.kernels, the only name it has in pope-fast
    # the public ops, each beside its torch reference
    from . import common  # noqa: F401 (the module the tests switch the interpreter in)
    from .common import interpreter_on, resolve_backend, triton_available
    from .nf4 import NF4Weight, dequantize_nf4, dequantize_nf4_ref, quantize_nf4
    from .launches import LaunchCounter
    from .gather_logits import gather_logits, gather_logits_ref, vocab_argmax, vocab_argmax_ref
    from .norm import fused_rms_norm, offset_rms_norm, rms_norm
    from .rotary import rotary, rotary_ref
    from .nf4_matmul import nf4_matmul, nf4_matmul_ref
    from .prefix_attention import prefix_attention
    from .prefix_attention_torch import PrefixRuns, prefix_attention_ref, prefix_runs

    __all__ = [
        "LaunchCounter",
        "NF4Weight",
        "PrefixRuns",
        "dequantize_nf4",
        "dequantize_nf4_ref",
        "fused_rms_norm",
        "gather_logits",
        "gather_logits_ref",
        "interpreter_on",
        "nf4_matmul",
        "nf4_matmul_ref",
        "offset_rms_norm",
        "prefix_attention",
        "prefix_attention_ref",
        "prefix_runs",
        "quantize_nf4",
        "rms_norm",
        "resolve_backend",
        "rotary",
        "rotary_ref",
        "triton_available",
        "vocab_argmax",
        "vocab_argmax_ref",
    ]
