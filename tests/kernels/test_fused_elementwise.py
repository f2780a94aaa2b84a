"""The decoder's fused elementwise kernels under the interpreter, bit for bit against the torch ops
they replace: `fused_rms_norm` against `rms_norm` (LLaMA's, eight torch kernels) and
`offset_rms_norm` (Gemma's), `rotary` against `rotary_ref` (five).

Bit equality is the promise (kernels/norm.py, kernels/rotary.py say how each rounding and the sum's
order are kept), so every comparison is torch.equal. Inputs are fresh per case and never zeros,
outputs are poisoned (the kernels allocate theirs: the allocator is made to hand out NaN-filled
memory), and a failure names the first differing index. SiLU·mul has no kernel: torch's own CPU
SiLU rounds one value two ways (see the last test).
"""
import zlib

import pytest
import torch
import torch.nn.functional as F

from pope_fast.kernels import (fused_rms_norm, interpreter_on, offset_rms_norm, rms_norm, rotary,
                               rotary_ref)
from pope_fast.kernels import norm as norm_module

# each case runs the Triton interpreter: a fraction of a second to seconds
pytestmark = [pytest.mark.skipif(not interpreter_on(),
                                 reason="needs TRITON_INTERPRET=1 before triton is imported"),
              pytest.mark.slow]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture
def gen(request) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty and torch.empty_like (what the wrappers allocate with) return NaN-filled
    tensors."""
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: nan(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: nan(empty_like(*a, **k)))


def randn(shape, gen, dtype, scale=1.0) -> torch.Tensor:
    x = torch.randn(shape, generator=gen) * scale
    return torch.where(x == 0, 0.5, x).to(dtype)  # never a zero


def assert_bit_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    if not torch.equal(actual, expected):
        differ = actual != expected  # NaN (poison left in place) differs from everything
        first = tuple(int(i) for i in differ.nonzero()[0])
        raise AssertionError(f"{what}: {int(differ.sum())} of {actual.numel()} elements differ; "
                             f"first at {first}: got {actual[first].item()!r}, "
                             f"expected {expected[first].item()!r}")


# RMSNorm: rows of H, covering every part of torch's summation order (module docstring of
# kernels/norm.py)
NORM_SHAPES = {
    "5-rows-of-3": (5, 3),  # shorter than a vector: summed as scalars, a tail of 3
    "2x3-rows-of-7": (2, 3, 7),  # still scalars, one group of four and three more
    "4-rows-of-37": (4, 37),  # four vectors: one group, five elements after them
    "3-rows-of-100": (3, 100),  # twelve vectors: three groups, a tail of four
    "7-rows-of-203": (7, 203),  # six groups, a vector left over after them, a tail of 3
    # 18 groups: one level of 16 carried up, two groups and three vectors after it
    "3-rows-of-600": (3, 600),
    "2-rows-of-4109": (2, 4109),  # 128 groups: eight carries, then a vector and a tail of 5
}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", NORM_SHAPES.values(), ids=NORM_SHAPES.keys())
def test_fused_rms_norm_is_bit_equal_to_rms_norm(shape, dtype, gen, poisoned):
    x, weight = randn(shape, gen, dtype, scale=3.0), randn(shape[-1], gen, dtype)
    assert_bit_equal(fused_rms_norm(x, weight, 1e-6, backend="triton"), rms_norm(x, weight, 1e-6),
                     f"{shape}")


OFFSET_CASES = {"3-rows-of-37": ((3, 37), 1.0), "2x5-rows-of-203-scaled": ((2, 5, 203), 24 ** -0.5),
                "2-rows-of-600": ((2, 600), 1.0)}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape, scale", OFFSET_CASES.values(), ids=OFFSET_CASES.keys())
def test_fused_offset_rms_norm_is_bit_equal_to_offset_rms_norm(shape, scale, dtype, gen, poisoned):
    """Gemma's norm: scaled by (1 + w) (and a query scale) in fp32, cast once."""
    x, weight = randn(shape, gen, dtype, scale=3.0), randn(shape[-1], gen, dtype)
    got = fused_rms_norm(x, weight, 1e-6, backend="triton", offset=True, scale=scale)
    assert_bit_equal(got, offset_rms_norm(x, weight, 1e-6, scale), f"{shape}, scale {scale}")


def test_fused_rms_norm_carries_a_second_level(gen, poisoned):
    """256 groups of four vectors (H = 8200): the cascade's second level is carried into its third
    once."""
    x, weight = randn((2, 8200), gen, torch.float32, scale=3.0), randn(8200, gen, torch.float32)
    assert_bit_equal(fused_rms_norm(x, weight, 1e-6, backend="triton"), rms_norm(x, weight, 1e-6),
                     "8200")


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16],
                         ids=["fp32-weight", "bf16-weight"])
def test_fused_rms_norm_promotes_as_torch_does(weight_dtype, gen, poisoned):
    """An fp16 hidden with an fp32 (or bf16) weight: the normed fp16 values times it, in the
    promoted dtype."""
    x, weight = randn((6, 67), gen, torch.float16, scale=2.0), randn(67, gen, weight_dtype)
    assert_bit_equal(fused_rms_norm(x, weight, 1e-5, backend="triton"), rms_norm(x, weight, 1e-5),
                     "promoted")


def test_fused_rms_norm_reads_strided_rows(gen, poisoned):
    """Rows a stride apart (a slice of wider rows) and a view of heads, as q_norm and k_norm take
    them."""
    wide = randn((9, 80), gen, torch.float32, scale=2.0)
    weight = randn(48, gen, torch.float32)
    x = wide[:, 16:64]
    assert_bit_equal(fused_rms_norm(x, weight, 1e-6, backend="triton"), rms_norm(x, weight, 1e-6),
                     "strided rows")
    heads = randn((2, 5, 3 * 24), gen, torch.bfloat16).view(2, 5, 3, 24)
    weight = randn(24, gen, torch.bfloat16)
    assert_bit_equal(fused_rms_norm(heads, weight, 1e-6, backend="triton"),
                     rms_norm(heads, weight, 1e-6), "heads")


def test_summation_order_is_what_makes_the_bits(gen, monkeypatch):
    """The same kernel summing as a 16-lane (AVX512) torch would: fp32 rows now differ from this
    CPU's torch, so the order the kernel keeps is doing the work (this machine's torch sums in
    8-lane vectors)."""
    if norm_module.sum_lanes() != 8:
        pytest.skip("this torch sums in 16-lane vectors")
    x, weight = randn((16, 600), gen, torch.float32, scale=3.0), randn(600, gen, torch.float32)
    assert torch.equal(fused_rms_norm(x, weight, 1e-6, backend="triton"), rms_norm(x, weight, 1e-6))
    monkeypatch.setattr(norm_module, "sum_lanes", lambda: 16)
    assert not torch.equal(fused_rms_norm(x, weight, 1e-6, backend="triton"),
                           rms_norm(x, weight, 1e-6))


def test_fused_rms_norm_refuses_a_weight_of_another_width(gen):
    x = randn((2, 10), gen, torch.float32)
    refusal = r"norm_weight must be a \[10\] tensor on cpu, got \(12,\)"
    with pytest.raises(ValueError, match=refusal):
        fused_rms_norm(x, randn(12, gen, torch.float32), 1e-6, backend="triton")


# RoPE: x [B, H, S, D] as the decoder makes it (a transposed view of the projection), cos/sin
# [S, D] or [B, S, D]
ROTARY_CASES = {
    "view-2x3x5x8-shared-positions": (2, 3, 5, 8, False, True),
    "view-3x2x7x6-per-row-positions": (3, 2, 7, 6, True, True),
    "contiguous-1x5x9x18": (1, 5, 9, 18, False, False),
    "view-3x4x1x10-decode-step": (3, 4, 1, 10, True, True),
}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", ROTARY_CASES.values(), ids=ROTARY_CASES.keys())
def test_rotary_is_bit_equal_to_rotary_ref(case, dtype, gen, poisoned):
    b, heads, s, d, per_row, view = case
    if view:
        x = randn((b, s, heads * d), gen, dtype, scale=4.0).view(b, s, heads, d).transpose(1, 2)
    else:
        x = randn((b, heads, s, d), gen, dtype, scale=4.0)
    table = (b, s, d) if per_row else (s, d)
    cos, sin = randn(table, gen, dtype), randn(table, gen, dtype)
    got, want = rotary(x, cos, sin, backend="triton"), rotary_ref(x, cos, sin)
    assert_bit_equal(got, want, f"{case}")
    # laid out as torch's result (strides of size-1 dims say nothing), so what reads it next reads
    # the same
    assert [st for st, n in zip(got.stride(), got.shape) if n > 1] == \
        [st for st, n in zip(want.stride(), want.shape) if n > 1]


def test_rotary_refuses_tables_of_another_shape(gen):
    x = randn((1, 2, 5, 8), gen, torch.float16)
    refusal = r"cos must be \[S, D\] or \[B, S, D\] = \[5, 8\] or \[1, 5, 8\], got \(4, 8\)"
    with pytest.raises(ValueError, match=refusal):
        rotary(x, randn((4, 8), gen, torch.float16), randn((4, 8), gen, torch.float16),
               backend="triton")
    with pytest.raises(ValueError, match="cos and sin must be torch.float16 on cpu as x is"):
        rotary(x, randn((5, 8), gen, torch.float32), randn((5, 8), gen, torch.float32),
               backend="triton")


def test_torch_silu_rounds_one_value_two_ways(gen):
    """Why SiLU·mul has no kernel: torch's CPU SiLU takes a vectorized exp for whole vectors of a
    loop and the C library's for the elements after them, so the same fp32 value gets other bits at
    another position, and no elementwise kernel can equal both."""
    x = randn(4096, gen, torch.float32, scale=4.0)
    whole = F.silu(x)  # full vectors but for the last elements
    # each value alone: the scalar path
    one_by_one = torch.cat([F.silu(x[i:i + 1]) for i in range(256)])
    assert not torch.equal(whole[:256], one_by_one)


# the benchmark's count (bench/kernels.py --launches): what one decoder layer launches, torch path
# against fused


def test_launch_counter_counts_computing_ops_and_triton_launches(gen):
    from pope_fast.kernels import LaunchCounter

    x, weight = randn((3, 16), gen, torch.float16), randn(16, gen, torch.float16)
    with torch.inference_mode(), LaunchCounter() as counter:
        x.view(48).t()  # views: nothing computed
        x.to(torch.float16)  # the same dtype: an alias, nothing computed
        fused_rms_norm(x, weight, 1e-6, backend="triton")
    assert counter.triton == 1 and counter.ops.total() == 0, counter.ops
    with torch.inference_mode(), LaunchCounter() as counter:
        rms_norm(x, weight, 1e-6)
    assert counter.triton == 0 and counter.ops == {"to": 2, "pow": 1, "mean": 1, "add": 1,
                                                   "rsqrt": 1, "mul": 2}


def test_a_decoder_layer_launches_fewer_kernels_fused():
    """37 launches a layer on the torch path (2 norms of 8 ops, 2 RoPEs of 5, 7 matmuls, SiLU, ·up,
    2 residual adds); fused, each norm and RoPE is one Triton launch: 15."""
    from pope_fast.bench.kernels import TINY, layer_launches

    plain, fused = layer_launches(TINY, torch.device("cpu"))
    assert (plain.ops.total(), plain.triton) == (37, 0), plain.ops
    assert (fused.ops.total(), fused.triton) == (11, 4), fused.ops
    assert fused.ops == {"linear": 7, "silu_": 1, "mul_": 1, "add": 2}
