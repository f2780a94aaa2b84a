"""Triton kernels of pope-fast, each beside the pure-torch reference it must agree with.

`common` owns the triton import and the one decision of where kernels run: on CUDA tensors,
or on CPU tensors when ``TRITON_INTERPRET=1`` was set before triton was first imported (the
interpreter: slow, used by the tests). Every public op takes ``backend`` ("auto" | "triton" |
"torch"); "auto" picks the kernel on CUDA and the fp32 torch reference everywhere else, so the
engine's CPU path stays fast even in a test process that switched the interpreter on.

Imports inside this package are relative: bitsandbytes tries ``import kernels`` (a PyPI package)
and must never find this folder.
"""
from . import common
from .common import interpreter_on, resolve_backend, triton_available
from .nf4 import NF4Weight, dequantize_nf4, dequantize_nf4_ref, quantize_nf4
from .gather_logits import gather_logits, gather_logits_ref, rms_norm, vocab_argmax, vocab_argmax_ref
from .nf4_matmul import nf4_matmul, nf4_matmul_ref
from .prefix_attention import PrefixRuns, prefix_attention, prefix_attention_ref, prefix_runs

__all__ = [
    "NF4Weight",
    "PrefixRuns",
    "dequantize_nf4",
    "dequantize_nf4_ref",
    "gather_logits",
    "gather_logits_ref",
    "interpreter_on",
    "nf4_matmul",
    "nf4_matmul_ref",
    "prefix_attention",
    "prefix_attention_ref",
    "prefix_runs",
    "quantize_nf4",
    "rms_norm",
    "resolve_backend",
    "triton_available",
    "vocab_argmax",
    "vocab_argmax_ref",
]
