"""What every kernel file shares: the triton import (or a stand-in where it is missing), the
decision of where kernels run, and the small JIT helpers. The package's own modules import from
here, never from the package, so importing `pope_fast.kernels` has no cycle.
"""
import torch

try:
    import triton
    import triton.language as tl

    _TRITON = True
except ImportError:  # the references still run; resolve_backend refuses "triton"

    class _Absent:
        """Stands in for triton and triton.language so the kernel definitions still import."""

        constexpr = None

        @staticmethod
        def jit(fn=None, **kwargs):
            return fn if fn is not None else (lambda f: f)

    triton = tl = _Absent()
    _TRITON = False

# triton.jit reads this knob when each kernel of this package is decorated (as its module is
# imported), so its value now is what decides whether our kernels are interpreted.
_INTERPRETED = _TRITON and bool(triton.knobs.runtime.interpret)

BACKENDS = ("auto", "triton", "torch")


def triton_available() -> bool:
    """Whether triton could be imported."""
    return _TRITON


def interpreter_on() -> bool:
    """Whether our kernels run under the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRETED


def resolve_backend(backend: str, device: torch.device) -> str:
    """"triton" or "torch" for tensors on ``device``.

    "auto" is "triton" only on CUDA with compiled triton (never under the interpreter, which is
    for tests); a forced "triton" raises where no kernel can run.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    device = torch.device(device)
    if backend == "torch":
        return "torch"
    if backend == "auto":
        return "triton" if device.type == "cuda" and _TRITON and not _INTERPRETED else "torch"
    if not _TRITON:
        raise RuntimeError("backend='triton' was forced but triton cannot be imported")
    if device.type == "cuda" or (device.type == "cpu" and _INTERPRETED):
        return "triton"
    raise RuntimeError(
        f"backend='triton' was forced for {device.type} tensors: Triton kernels run on CUDA, or on "
        "CPU only when TRITON_INTERPRET=1 is set before triton is first imported"
    )


def on_gpu(device: torch.device) -> bool:
    """Whether a kernel on ``device`` is compiled for a GPU (block sizes are then tuned for it)."""
    return torch.device(device).type == "cuda" and not _INTERPRETED


def dot_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype tl.dot operands are cast to: the shared 16-bit dtype of ``dtypes``, else fp32.

    bf16 falls back to fp32 under the interpreter, whose tl.dot multiplies bf16's uint16 storage
    as integers (triton 3.9); bf16 products are exact in fp32, so only the summation order moves.
    """
    first = dtypes[0]
    if all(d == first for d in dtypes) and first == torch.float16:
        return first
    if all(d == first for d in dtypes) and first == torch.bfloat16 and not _INTERPRETED:
        return first
    return torch.float32


def tl_dtype(dtype: torch.dtype):
    """The triton dtype of a floating torch dtype, for constexpr arguments."""
    table = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
    if dtype not in table:
        raise TypeError(f"kernels handle fp16, bf16 and fp32 tensors, got {dtype}")
    return table[dtype]


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """Round fp32 ``x`` to ``DTYPE`` to nearest-even, as torch's ``.to(dtype)`` does.

    bf16 is rounded by hand: the interpreter truncates fp32 -> bf16 (triton 3.9), and this bit
    trick is what the GPU's cvt.rn does, so both give torch's bits. No NaNs reach here.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(DTYPE)
    return y


@triton.jit
def rounded(x, DTYPE: tl.constexpr):
    """fp32 ``x`` rounded to ``DTYPE`` (`round_to`) and widened back: one op's result as torch
    rounds it in DTYPE. For fp32 nothing is called, which spares the interpreter a nested call."""
    if DTYPE != tl.float32:
        x = round_to(x, DTYPE).to(tl.float32)
    return x
