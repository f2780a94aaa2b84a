"""pope_fast.kernels on CPU: each Triton kernel (under the interpreter) against its torch reference,
and each reference against an independent computation (bitsandbytes, transformers, SDPA, fp64).

Inputs are fresh per case (a generator seeded from the test id), never zeros; outputs are poisoned
with NaN before the call, and padded regions of the inputs are poisoned too, so a kernel that skips
a store or reads padding fails. Failures name the worst index and both values.
"""
import copy
import os
import subprocess
import sys
import zlib

import bitsandbytes as bnb
import bitsandbytes.functional as bnb_functional
import pytest
import torch
import torch.nn.functional as F

from pope_fast import kernels
from pope_fast.kernels import (
    NF4Weight,
    dequantize_nf4,
    dequantize_nf4_ref,
    gather_logits,
    gather_logits_ref,
    nf4_matmul,
    nf4_matmul_ref,
    prefix_attention,
    prefix_attention_ref,
    quantize_nf4,
    resolve_backend,
    vocab_argmax,
    vocab_argmax_ref,
)
from pope_fast.kernels.nf4_matmul import FUSED_MAX_ROWS

# the Triton interpreter runs each kernel case on the CPU: seconds a case
pytestmark = pytest.mark.slow

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# (atol, rtol) of a kernel against its reference: fp32 sums in another order, then at most one
# output rounding apart
KERNEL_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
              torch.bfloat16: (1.6e-2, 1.6e-2)}


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded by the test id: fresh inputs per case, the same on every run."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))


def randn(shape, gen, dtype=torch.float32, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float,
                 what: str) -> None:
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    a, e = actual.double(), expected.double()
    excess = (a - e).abs() - (atol + rtol * e.abs())
    excess = torch.where(torch.isnan(a) | torch.isnan(e), torch.inf, excess)
    if excess.numel() and excess.max() > 0:
        worst = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
        bad = int((excess > 0).sum())
        raise AssertionError(
            f"{what}: {bad}/{excess.numel()} elements off (atol={atol}, rtol={rtol}); "
            f"worst at {worst}: "
            f"got {a[worst].item()!r}, expected {e[worst].item()!r}"
        )


def assert_bit_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    if not torch.equal(actual, expected):
        differ = (actual != expected) & ~(torch.isnan(actual) & torch.isnan(expected))
        first = tuple(int(i) for i in differ.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(differ.sum())} elements differ; first at {first}: "
            f"got {actual[first].item()!r}, expected {expected[first].item()!r}"
        )


def nan_like(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


# backend decision


def test_interpreter_is_on_in_tests():
    assert kernels.triton_available()
    assert kernels.interpreter_on(), (
        "tests/conftest.py must set TRITON_INTERPRET=1 before triton is imported")


def test_auto_backend_is_torch_on_cpu_even_under_the_interpreter():
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    # interpreter on: never auto-pick it
    assert resolve_backend("auto", torch.device("cuda")) == "torch"
    assert resolve_backend("torch", torch.device("cpu")) == "torch"


def test_forced_triton_runs_on_cpu_under_the_interpreter():
    assert resolve_backend("triton", torch.device("cpu")) == "triton"


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", torch.device("cpu"))


def test_auto_backend_is_triton_on_cuda_when_compiled(monkeypatch):
    monkeypatch.setattr(kernels.common, "_INTERPRETED", False)
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_backend("auto", torch.device("cpu")) == "torch"


def test_forced_triton_without_interpreter_or_cuda_raises():
    """In a fresh process with the interpreter off, as a CPU-only user would run."""
    script = (
        "import torch\n"
        "from pope_fast.kernels import interpreter_on, resolve_backend\n"
        "assert not interpreter_on()\n"
        "try:\n"
        "    resolve_backend('triton', torch.device('cpu'))\n"
        "except RuntimeError as error:\n"
        "    print('refused:', error)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused: backend='triton' was forced for cpu tensors" in done.stdout


# NF4 dequantization

NF4_SHAPES = {
    "37x128": (37, 128),  # rows own whole blocks
    "66x256": (66, 256),  # 264 blocks: two nested (256-block) scales, the second partial
    "5x200": (5, 200),  # K % 64 != 0: blocks straddle rows
    "37x96": (37, 96),  # straddling, where bnb 0.50.2's CPU extension mis-indexes blocks
    "3x97": (3, 97),  # odd K: bytes straddle rows too
}


def bnb_quantize_tensor(weight, double_quant=True):
    return bnb_functional.quantize_4bit(weight, blocksize=64, compress_statistics=double_quant,
                                        quant_type="nf4")


def bnb_quantize(n_k, dtype, gen, double_quant=True):
    return bnb_quantize_tensor(randn(n_k, gen, dtype, scale=0.05), double_quant)


def bnb_dequantize(packed, quant_state) -> torch.Tensor:
    """bitsandbytes' dequantize_4bit. Where its 0.50.2 CPU extension reads blocks per row
    (K % 64 != 0, even K), the answer is its own torch implementation of the same op: the flat
    layout its quantizer writes and its CUDA kernel reads. For odd K its CPU op runs that same
    implementation under torch.compile (backends/cpu/ops.py, the shape fallback); it runs eagerly
    here, the same elementwise ops, without the half-minute compile a fresh machine pays once."""
    n, k = quant_state.shape
    if k % quant_state.blocksize == 0:
        return bnb_functional.dequantize_4bit(packed, quant_state)
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

    absmax = quant_state.absmax
    if quant_state.nested:
        absmax = (bnb_functional.dequantize_blockwise(quant_state.absmax, quant_state.state2)
                  + quant_state.offset)
    # skip torch.compile
    compute = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)
    return compute(packed.reshape(-1), absmax, quant_state.code, 64, quant_state.shape,
                   quant_state.dtype)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("double_quant", [True, False], ids=["nested", "flat-absmax"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("n_k", NF4_SHAPES.values(), ids=NF4_SHAPES.keys())
def test_dequantize_nf4_is_bit_identical_to_bitsandbytes(n_k, dtype, double_quant, backend, gen):
    packed, quant_state = bnb_quantize(n_k, dtype, gen, double_quant)
    w = NF4Weight.from_bnb(packed, quant_state)
    out = nan_like(n_k, dtype)
    result = dequantize_nf4(w, backend=backend, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert_bit_equal(result, bnb_dequantize(packed, quant_state), f"dequantize_nf4[{backend}]")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_dequantize_nf4_to_another_dtype_rounds_the_fp32_value_once(dtype, gen):
    packed, quant_state = bnb_quantize((29, 192), torch.float16, gen)
    w = NF4Weight.from_bnb(packed, quant_state)
    as_fp32_state = copy.copy(quant_state)
    as_fp32_state.dtype = torch.float32
    as_fp32 = bnb_functional.dequantize_4bit(packed, as_fp32_state)
    assert_bit_equal(dequantize_nf4_ref(w, dtype), as_fp32.to(dtype), "reference")
    assert_bit_equal(dequantize_nf4(w, dtype, backend="triton"), as_fp32.to(dtype), "kernel")


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("n_k", [(7, 96), (4, 200), (3, 97)], ids=["7x96", "4x200", "3x97"])
def test_dequantize_nf4_recovers_exactly_representable_weights(n_k, backend, gen):
    """Independent of bitsandbytes' dequantizer: a weight whose every block is NF4 codes times
    a power of two (with a +-1 code in the block) quantizes losslessly, so dequantizing it must
    give it back exactly, wherever blocks and bytes straddle rows."""
    n, k = n_k
    code = bnb_functional.get_4bit_type("nf4", device="cpu")
    n_elements = n * k
    values = code[torch.randint(0, 16, (n_elements,), generator=gen)]
    blocks = torch.arange(n_elements) // 64
    values[torch.arange(0, n_elements, 64)] = 1.0  # each block's absmax is exactly its scale
    scale = 2.0 ** torch.randint(-6, 3, (int(blocks[-1]) + 1,), generator=gen).float()
    weight = (values * scale[blocks]).reshape(n, k)
    w = quantize_nf4(weight, double_quant=False)
    assert_bit_equal(dequantize_nf4(w, backend=backend), weight, f"round trip [{backend}]")


def test_take_rows_dequantizes_to_the_same_rows(gen):
    # 600 blocks: 3 nested scales
    packed, quant_state = bnb_quantize((300, 128), torch.float16, gen)
    w = NF4Weight.from_bnb(packed, quant_state)
    rows = torch.tensor([299, 0, 131, 131, 257])
    taken = w.take_rows(rows)
    assert not taken.nested and taken.shape == (5, 128)
    whole = bnb_functional.dequantize_4bit(packed, quant_state)
    assert_bit_equal(dequantize_nf4_ref(taken), whole[rows], "reference")
    assert_bit_equal(dequantize_nf4(taken, backend="triton"), whole[rows], "kernel")


def test_take_rows_refuses_rows_that_share_blocks(gen):
    w = NF4Weight.from_bnb(*bnb_quantize((5, 200), torch.float16, gen))
    with pytest.raises(ValueError, match="K % blocksize == 0"):
        w.take_rows(torch.tensor([1]))


def test_nf4_weight_from_params4bit(gen):
    weight = randn((33, 128), gen, torch.float16)
    param = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4",
                              compress_statistics=True).to("cpu")
    w = NF4Weight.from_bnb(param.data, param.quant_state)
    assert w.shape == (33, 128) and w.dtype == torch.float16 and w.nested
    expected = bnb_functional.dequantize_4bit(param.data, param.quant_state)
    assert_bit_equal(dequantize_nf4(w, backend="triton"), expected, "kernel")
    assert NF4Weight.from_bnb(param).shape == (33, 128)


def test_nf4_weight_rejects_a_short_packed_tensor(gen):
    w = NF4Weight.from_bnb(*bnb_quantize((8, 64), torch.float16, gen))
    with pytest.raises(ValueError, match="packed must hold 256"):
        NF4Weight(w.packed[:-1], w.absmax, w.code, w.shape, w.dtype, nested_absmax=w.nested_absmax,
                  nested_code=w.nested_code, offset=w.offset)


# gather_logits and vocab_argmax

LOGIT_SHAPES = {  # B, H, V, ids (with 0, V - 1 and a repeat)
    "B1-H96-n1": (1, 96, 57, [56]),
    "B5-H200-n3": (5, 200, 131, [0, 130, 0]),
    "B18-H128-n8": (18, 128, 100, [3, 99, 17, 64, 0, 50, 51, 17]),
}
WEIGHT_KINDS = ["fp16", "bf16", "fp32", "nf4-fp16", "nf4-bf16"]
# (atol, rtol) against fp64 or across kernels; logits are fp32 sums of ~H products
LOGIT_TOL = (2e-5, 1e-5)


def make_logit_case(shape, kind, norm, gen):
    """hidden, weight (tensor or NF4Weight), ids, norm_weight, and the weight as dequantized by
    bnb."""
    b, h, v, ids = shape
    dtype = DTYPES[kind.removeprefix("nf4-")]
    hidden = randn((b, h), gen, dtype, scale=2.0)
    weight = randn((v, h), gen, dtype, scale=0.05)
    dense = weight
    if kind.startswith("nf4"):
        packed, quant_state = bnb_quantize_tensor(weight)
        weight = NF4Weight.from_bnb(packed, quant_state)
        dense = bnb_dequantize(packed, quant_state)
    norm_weight = (1.0 + randn((h,), gen, scale=0.2)).to(dtype) if norm else None
    return hidden, weight, torch.tensor(ids), norm_weight, dense


def independent_logits(hidden, dense, norm_weight, eps=1e-6):
    """transformers' LlamaRMSNorm (when norm_weight), then fp64 products of the fp32 values."""
    if norm_weight is not None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        norm = LlamaRMSNorm(hidden.shape[1], eps=eps).to(norm_weight.dtype)
        norm.weight.data.copy_(norm_weight)
        with torch.no_grad():
            hidden = norm(hidden)
    return hidden.double() @ dense.double().T


@pytest.mark.parametrize("norm", [False, True], ids=["no-norm", "rmsnorm"])
@pytest.mark.parametrize("kind", WEIGHT_KINDS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES.values(), ids=LOGIT_SHAPES.keys())
def test_gather_logits_ref_is_hidden_times_dequantized_rows(shape, kind, norm, gen):
    hidden, weight, ids, norm_weight, dense = make_logit_case(shape, kind, norm, gen)
    expected = independent_logits(hidden, dense, norm_weight)[:, ids]
    result = gather_logits_ref(hidden, weight, ids, norm_weight)
    assert result.dtype == torch.float32
    assert_close(result, expected, *LOGIT_TOL, "gather_logits_ref")


@pytest.mark.parametrize("norm", [False, True], ids=["no-norm", "rmsnorm"])
@pytest.mark.parametrize("kind", WEIGHT_KINDS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES.values(), ids=LOGIT_SHAPES.keys())
def test_gather_logits_kernel_matches_ref(shape, kind, norm, gen):
    hidden, weight, ids, norm_weight, _ = make_logit_case(shape, kind, norm, gen)
    out = nan_like((hidden.shape[0], ids.numel()), torch.float32)
    result = gather_logits(hidden, weight, ids, norm_weight, backend="triton", out=out)
    # a normed fp16/bf16 element may round the other way when rstd differs in its last bit
    atol, rtol = LOGIT_TOL if not norm else KERNEL_TOL[hidden.dtype]
    assert_close(result, gather_logits_ref(hidden, weight, ids, norm_weight), atol, rtol,
                 "gather_logits")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("h", [128, 200], ids=["H128-whole-blocks", "H200-straddling"])
def test_gather_logits_dequantizes_nf4_rows_bit_for_bit(h, dtype, gen):
    """One-hot hidden rows make each logit a single exact product: the dequantized weight value."""
    packed, quant_state = bnb_quantize((70, h), dtype, gen)
    ids = torch.tensor([69, 0, 33])
    logits = gather_logits(torch.eye(h, dtype=dtype), NF4Weight.from_bnb(packed, quant_state), ids,
                           backend="triton")
    assert_bit_equal(logits, bnb_dequantize(packed, quant_state)[ids].T.float(), "gather_logits")


def test_gather_logits_norm_in_fp32_over_fp16_hidden_promotes_like_transformers(gen):
    """norm_weight fp32, hidden fp16: transformers' ``weight * x.to(fp16)`` is an fp32 product."""
    hidden, weight, ids, _, dense = make_logit_case(LOGIT_SHAPES["B5-H200-n3"], "fp16", False, gen)
    norm_weight = 1.0 + randn((hidden.shape[1],), gen, scale=0.2)
    expected = independent_logits(hidden, dense, norm_weight)[:, ids]
    assert_close(gather_logits_ref(hidden, weight, ids, norm_weight), expected, *LOGIT_TOL,
                 "reference")
    assert_close(gather_logits(hidden, weight, ids, norm_weight, backend="triton"), expected,
                 *LOGIT_TOL, "kernel")


def test_gather_logits_rejects_ids_outside_the_vocabulary(gen):
    hidden, weight, _, _, _ = make_logit_case(LOGIT_SHAPES["B1-H96-n1"], "fp16", False, gen)
    with pytest.raises(IndexError):
        gather_logits(hidden, weight, torch.tensor([57]), backend="triton")


def assert_argmax(result, logits, atol, what):
    """Equal to torch.argmax wherever the top two logits are more than atol apart; elsewhere
    the chosen logit is within atol of the maximum."""
    expected = logits.argmax(dim=1)
    top2 = logits.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > atol
    assert torch.equal(result[clear], expected[clear]), (
        f"{what}: {result.tolist()} != {expected.tolist()}")
    chosen = logits.gather(1, result[:, None]).squeeze(1)
    assert bool((chosen >= top2[:, 0] - atol).all()), (
        f"{what}: chosen logits {chosen} below max {top2[:, 0]}")


@pytest.mark.parametrize("norm", [False, True], ids=["no-norm", "rmsnorm"])
@pytest.mark.parametrize("kind", WEIGHT_KINDS)
@pytest.mark.parametrize("shape", LOGIT_SHAPES.values(), ids=LOGIT_SHAPES.keys())
def test_vocab_argmax_is_argmax_of_full_logits(shape, kind, norm, gen, monkeypatch):
    monkeypatch.setattr(sys.modules["pope_fast.kernels.gather_logits"], "ARGMAX_CHUNK_ROWS", 64)
    monkeypatch.setattr(sys.modules["pope_fast.kernels.gather_logits"],
                        "ARGMAX_CHUNK_ROWS_FP32", 64)
    hidden, weight, _, norm_weight, dense = make_logit_case(shape, kind, norm, gen)
    logits = independent_logits(hidden, dense, norm_weight)
    assert_argmax(vocab_argmax_ref(hidden, weight, norm_weight), logits, 1e-4, "reference")
    out = torch.full((hidden.shape[0],), -1, dtype=torch.int64)
    assert_argmax(vocab_argmax(hidden, weight, norm_weight, backend="triton", out=out), logits,
                  1e-4, "kernel")
    assert int(out.min()) >= 0


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_vocab_argmax_ties_go_to_the_smallest_index(dtype, gen, monkeypatch):
    """Small integers make every logit exact in any summation order, so ties are real ties."""
    monkeypatch.setattr(sys.modules["pope_fast.kernels.gather_logits"], "ARGMAX_CHUNK_ROWS", 16)
    monkeypatch.setattr(sys.modules["pope_fast.kernels.gather_logits"],
                        "ARGMAX_CHUNK_ROWS_FP32", 16)
    hidden = torch.randint(-3, 4, (3, 40), generator=gen).to(dtype)
    weight = torch.randint(-2, 3, (100, 40), generator=gen).to(dtype)
    best_for = [2 * torch.sign(hidden[row].float()).to(dtype) for row in range(2)]  # maximal logits
    weight[40] = weight[75] = best_for[0]  # other kernel tiles, other reference chunks
    weight[3] = weight[6] = best_for[1]  # one kernel tile
    expected = (hidden.float() @ weight.float().T).argmax(dim=1)
    assert expected[:2].tolist() == [40, 3]
    assert torch.equal(vocab_argmax_ref(hidden, weight), expected)
    assert torch.equal(vocab_argmax(hidden, weight, backend="triton"), expected)



@pytest.mark.parametrize("logits_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_vocab_argmax_of_logits_rounded_to_the_model_dtype(logits_dtype, gen, monkeypatch):
    """transformers takes the argmax of the model-dtype lm_head output: 2049 and 2048 both round to
    2048 in fp16 and bf16, so the smaller id wins there while fp32 picks the 2049 row. Integer
    inputs keep every fp32 logit exact, in any summation order."""
    monkeypatch.setattr(sys.modules["pope_fast.kernels.gather_logits"], "ARGMAX_CHUNK_ROWS", 16)
    monkeypatch.setattr(sys.modules["pope_fast.kernels.gather_logits"],
                        "ARGMAX_CHUNK_ROWS_FP32", 16)
    hidden = torch.randint(-2, 3, (2, 40), generator=gen).float()
    hidden[:, :2] = torch.eye(2)
    weight = torch.randint(-2, 3, (100, 40), generator=gen).float()
    # hidden row 0 meets rows 5 and 40 (other kernel tiles, other reference chunks), row 1 meets
    # rows 3 and 6 (one tile): each pair scores 2048 and 2049, every other row at most 160
    for column, (low, high) in enumerate(((5, 40), (3, 6))):
        weight[[low, high]] = 0.0
        weight[low, column], weight[high, column] = 2048.0, 2049.0
    logits = hidden @ weight.T
    assert logits.argmax(dim=1).tolist() == [40, 6]
    rounded = logits.to(logits_dtype).float()
    expected = rounded.argmax(dim=1)
    assert expected.tolist() == [5, 3] and float(rounded[0, 5]) == float(rounded[0, 40])
    assert torch.equal(vocab_argmax_ref(hidden, weight, logits_dtype=logits_dtype), expected)
    assert torch.equal(vocab_argmax(hidden, weight, backend="triton", logits_dtype=logits_dtype),
                       expected)
    assert torch.equal(vocab_argmax(hidden, weight, backend="triton"), logits.argmax(dim=1))

# nf4_matmul

# on the interpreter's 16 x 32 x 32 tiles (BLOCK_M x BLOCK_N x BLOCK_K): K128 the aligned path
# (BLOCK_K = blocksize, two K steps); K72 blocks straddle rows (72 % 64 = 8) and the third K tile
# is partial; K69 odd, so bytes straddle rows too, third K tile partial; every N ends in a partial
# N tile (N40 and N33 after a full one, N19 alone)
MATMUL_SHAPES = {"N40-K128": (40, 128), "N33-K72": (33, 72), "N19-K69": (19, 69)}


def make_matmul_case(m, n_k, dtype, gen, double_quant=True):
    x = randn((m, n_k[1]), gen, dtype)
    packed, quant_state = bnb_quantize(n_k, dtype, gen, double_quant)
    return x, packed, quant_state, NF4Weight.from_bnb(packed, quant_state)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("n_k", MATMUL_SHAPES.values(), ids=MATMUL_SHAPES.keys())
@pytest.mark.parametrize("m", [1, 17, 40], ids=lambda m: f"M{m}")
def test_nf4_matmul_kernel_matches_ref(m, n_k, dtype, gen):
    """The fused kernel at every M (40: two row tiles and a ragged one, so the last GROUP_M=2
    group of row tiles is short), as the op runs it below FUSED_MAX_ROWS."""
    x, _, _, w = make_matmul_case(m, n_k, dtype, gen)
    out = nan_like((m, n_k[0]), dtype)
    result = nf4_matmul(x, w, backend="triton", out=out, fused_max_rows=m)
    assert result.dtype == dtype
    assert_close(result, nf4_matmul_ref(x, w), *KERNEL_TOL[dtype], "nf4_matmul")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("n_k", MATMUL_SHAPES.values(), ids=MATMUL_SHAPES.keys())
def test_nf4_matmul_past_the_fused_rows_is_transformers_linear_bit_for_bit(n_k, dtype, gen):
    """Past FUSED_MAX_ROWS the op is bitsandbytes' multi-token path itself: the weight dequantized
    (by our kernel, bit for bit as dequantize_4bit) and F.linear, so it equals F.linear on bnb's
    dequantized weight exactly."""
    m = FUSED_MAX_ROWS + 3
    x, packed, quant_state, w = make_matmul_case(m, n_k, dtype, gen)
    expected = torch.nn.functional.linear(x, bnb_dequantize(packed, quant_state).to(dtype))
    assert_bit_equal(nf4_matmul(x, w, backend="triton"), expected, "nf4_matmul")
    out = nan_like((m, n_k[0]), dtype)
    assert nf4_matmul(x, w, backend="triton", out=out) is out and torch.equal(out, expected)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("n_k", MATMUL_SHAPES.values(), ids=MATMUL_SHAPES.keys())
def test_nf4_matmul_ref_is_linear_on_the_bitsandbytes_weight(n_k, dtype, gen):
    """transformers' multi-token path: dequantize_4bit, then F.linear (fp64 here, one rounding)."""
    x, packed, quant_state, w = make_matmul_case(17, n_k, dtype, gen)
    expected = (x.double() @ bnb_dequantize(packed, quant_state).double().T).to(dtype)
    assert_close(nf4_matmul_ref(x, w), expected, *KERNEL_TOL[dtype], "nf4_matmul_ref")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("n_k", MATMUL_SHAPES.values(), ids=MATMUL_SHAPES.keys())
def test_nf4_matmul_dequantizes_tiles_bit_for_bit(n_k, dtype, gen):
    """x = I makes every output a single exact product, so it must be the bitsandbytes-dequantized
    weight (transposed) bit for bit, in the whole-block and the straddling tile paths."""
    _, packed, quant_state, w = make_matmul_case(1, n_k, dtype, gen)
    eye = torch.eye(n_k[1], dtype=dtype)
    assert_bit_equal(nf4_matmul(eye, w, backend="triton", fused_max_rows=n_k[1]),
                     bnb_dequantize(packed, quant_state).T, "nf4_matmul")


def test_nf4_matmul_without_double_quant(gen):
    x, _, _, w = make_matmul_case(17, (40, 128), torch.float16, gen, double_quant=False)
    assert not w.nested
    assert_close(nf4_matmul(x, w, backend="triton"), nf4_matmul_ref(x, w),
                 *KERNEL_TOL[torch.float16], "nf4_matmul")


# prefix_attention

ATTENTION_CASES = {  # B, Hkv, group, S, D, P, suffix_lens
    "g1-D16": (3, 2, 1, 7, 16, 19, [7, 2, 5]),
    "g4-D32": (2, 2, 4, 9, 32, 17, [4, 9]),  # P: a whole 16-key tile, then a 1-key one
    "g4-D24": (2, 1, 4, 5, 24, 6, [5, 3]),  # D padded to 32 in the kernel
    "empty-suffix": (3, 1, 2, 5, 16, 8, [5, 0, 1]),
}


def make_attention_case(case, dtype, gen):
    """Inputs with every padded query row and suffix key/value set to NaN."""
    batch, kv_heads, group, length, head_dim, prefix_len, lens = case
    q = randn((batch, kv_heads * group, length, head_dim), gen, dtype)
    k_prefix, v_prefix = (randn((kv_heads, prefix_len, head_dim), gen, dtype) for _ in range(2))
    k_suffix, v_suffix = (randn((batch, kv_heads, length, head_dim), gen, dtype) for _ in range(2))
    lens = torch.tensor(lens)
    padded = torch.arange(length)[None, :] >= lens[:, None]  # [B, S]
    for t in (q, k_suffix, v_suffix):
        t.masked_fill_(padded[:, None, :, None], float("nan"))
    return q, k_prefix, v_prefix, k_suffix, v_suffix, lens


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", ATTENTION_CASES.values(), ids=ATTENTION_CASES.keys())
def test_prefix_attention_ref_is_sdpa_over_each_concatenated_sequence(case, dtype, gen):
    q, k_prefix, v_prefix, k_suffix, v_suffix, lens = make_attention_case(case, dtype, gen)
    result = prefix_attention_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, lens)
    group = q.shape[1] // k_prefix.shape[0]
    prefix_len = k_prefix.shape[1]
    for b, length in enumerate(lens.tolist()):
        keys = torch.cat([k_prefix, k_suffix[b, :, :length]], dim=1).float()
        keys = keys.repeat_interleave(group, dim=0)
        values = torch.cat([v_prefix, v_suffix[b, :, :length]], dim=1).float()
        values = values.repeat_interleave(group, dim=0)
        mask = torch.ones(length, prefix_len + length, dtype=torch.bool)
        mask[:, prefix_len:] = torch.ones(length, length, dtype=torch.bool).tril()
        expected = F.scaled_dot_product_attention(q[b, :, :length].float(), keys, values,
                                                  attn_mask=mask).to(dtype)
        assert_close(result[b, :, :length], expected, *KERNEL_TOL[dtype], f"question {b}")
        assert bool((result[b, :, length:] == 0).all()), f"question {b}: padded rows are not zero"


@pytest.mark.parametrize("backend", ["triton", "torch"], ids=["kernel", "torch-path"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", ATTENTION_CASES.values(), ids=ATTENTION_CASES.keys())
def test_prefix_attention_matches_ref(case, dtype, backend, gen):
    """The Triton kernel, and the batched CPU path (backend torch) that stands in for it without
    one."""
    q, k_prefix, v_prefix, k_suffix, v_suffix, lens = make_attention_case(case, dtype, gen)
    out = nan_like(q.shape, dtype)
    result = prefix_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, lens, backend=backend,
                              out=out)
    expected = prefix_attention_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, lens)
    assert_close(result, expected, *KERNEL_TOL[dtype], f"prefix_attention ({backend})")


# prefix of each row, grouped: unequal runs, prefixes out of order and one prefix unused, a lone row
MULTI_PREFIX = {
    "runs-3-1-2": [0, 0, 0, 1, 2, 2],
    "out-of-order": [2, 2, 0, 3, 3, 3],
    "one-run": [1, 1, 1, 1, 1, 1],
}


def make_multi_prefix_case(index, dtype, gen, kv_heads=2, group=2, head_dim=24, prefix_len=21,
                           length=5):
    """Six questions over four prefixes; padded query rows and suffix keys/values set to NaN."""
    lens = [5, 0, 3, 4, 1, 5]
    q, _, _, k_suffix, v_suffix, lens = make_attention_case(
        (len(index), kv_heads, group, length, head_dim, prefix_len, lens), dtype, gen)
    k_prefix, v_prefix = (randn((4, kv_heads, prefix_len, head_dim), gen, dtype) for _ in range(2))
    return q, k_prefix, v_prefix, k_suffix, v_suffix, lens


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("index", MULTI_PREFIX.values(), ids=MULTI_PREFIX.keys())
def test_prefix_attention_over_several_prefixes_in_one_call(index, dtype, backend, gen):
    q, k_prefix, v_prefix, k_suffix, v_suffix, lens = make_multi_prefix_case(index, dtype, gen)
    out = nan_like(q.shape, dtype)
    result = prefix_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, lens, backend=backend,
                              prefix_index=index, out=out)
    for row, g in enumerate(index):  # each row as a single-prefix call on its own prefix
        expected = prefix_attention_ref(q[row:row + 1], k_prefix[g], v_prefix[g],
                                        k_suffix[row:row + 1], v_suffix[row:row + 1],
                                        lens[row:row + 1])
        assert_close(result[row:row + 1], expected, *KERNEL_TOL[dtype],
                     f"row {row} (prefix {g}, {backend})")


def make_key_edit(gen, groups=4, prefix_len=21, heads=4):
    """Marked keys (a run in the middle of each prefix, a different one per prefix), and per-head
    scale and bias with one head masked off (-inf)."""
    marked = torch.zeros(groups, prefix_len, dtype=torch.bool)
    for g in range(groups):
        marked[g, 3 + g:11 + 2 * g] = True
    scale = 0.5 + torch.rand(heads, generator=gen)
    bias = torch.randn(heads, generator=gen)
    bias[heads - 1] = float("-inf")
    return marked, scale, bias


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("index", MULTI_PREFIX.values(), ids=MULTI_PREFIX.keys())
def test_prefix_attention_key_edit_matches_ref(index, dtype, backend, gen):
    """Edited image-key logits (Intervention.image_attention) in the kernel and the batched torch
    path, against the reference, which is itself checked against SDPA with the edit as an explicit
    score."""
    q, k_prefix, v_prefix, k_suffix, v_suffix, lens = make_multi_prefix_case(index, dtype, gen)
    edit = make_key_edit(gen)
    out = nan_like(q.shape, dtype)
    result = prefix_attention(q, k_prefix, v_prefix, k_suffix, v_suffix, lens, backend=backend,
                              prefix_index=index, out=out, key_edit=edit)
    expected = prefix_attention_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, lens,
                                    prefix_index=index, key_edit=edit)
    assert_close(result, expected, *KERNEL_TOL[dtype], f"edited prefix_attention ({backend})")
    plain = prefix_attention_ref(q, k_prefix, v_prefix, k_suffix, v_suffix, lens,
                                 prefix_index=index)
    assert not torch.allclose(expected.float().nan_to_num(), plain.float().nan_to_num(), atol=1e-3)
    # one row by hand: softmax of edited scores
    row = next(r for r, n in enumerate(lens.tolist()) if n)
    g, n, group = index[row], int(lens[row]), q.shape[1] // k_prefix.shape[1]
    marked, scale, bias = edit
    keys = torch.cat([k_prefix[g], k_suffix[row, :, :n]], dim=1).float()
    keys = keys.repeat_interleave(group, dim=0)
    values = torch.cat([v_prefix[g], v_suffix[row, :, :n]], dim=1).float()
    values = values.repeat_interleave(group, dim=0)
    scores = q[row, :, :n].float() @ keys.transpose(-1, -2) / q.shape[-1] ** 0.5  # [Hq, n, P + n]
    p_len = k_prefix.shape[2]
    scores[:, :, :p_len] = torch.where(
        marked[g], scores[:, :, :p_len] * scale[:, None, None] + bias[:, None, None],
        scores[:, :, :p_len])
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores[:, :, p_len:] = scores[:, :, p_len:].masked_fill(~causal, float("-inf"))
    by_hand = (torch.softmax(scores, dim=-1) @ values).to(dtype)
    assert_close(expected[row, :, :n], by_hand, *KERNEL_TOL[dtype],
                 "reference against the edit by hand")


def test_prefix_attention_refuses_rows_not_grouped_by_prefix(gen):
    args = make_multi_prefix_case([0, 1, 0, 1, 2, 2], torch.float32, gen)
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match="grouped by prefix"):
            prefix_attention(*args, backend=backend, prefix_index=[0, 1, 0, 1, 2, 2])
    with pytest.raises(ValueError, match="prefix_index must hold 6 ints"):
        prefix_attention(*args, backend="torch", prefix_index=[0, 1, 4, 4, 4, 4])


def test_prefix_attention_takes_a_scale_and_int32_lengths(gen):
    q, k_prefix, v_prefix, k_suffix, v_suffix, lens = make_attention_case(
        ATTENTION_CASES["g1-D16"], torch.float32, gen)
    args = (q, k_prefix, v_prefix, k_suffix, v_suffix, lens.int())
    expected = prefix_attention_ref(*args, scale=0.3)
    assert_close(prefix_attention(*args, scale=0.3, backend="triton"), expected,
                 *KERNEL_TOL[torch.float32], "kernel")
    assert not torch.allclose(expected, prefix_attention_ref(*args))


def test_prefix_attention_rejects_heads_that_do_not_group(gen):
    q = randn((1, 3, 4, 16), gen)
    k = randn((2, 5, 16), gen)
    s = randn((1, 2, 4, 16), gen)
    with pytest.raises(ValueError, match="not a multiple"):
        prefix_attention(q, k, k, s, s, torch.tensor([4]), backend="triton")
