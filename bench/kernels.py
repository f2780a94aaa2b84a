"""Kernel benchmark at LLaVA-1.5-7B shapes: each Triton kernel against the baseline it replaces.

    python -m pope_fast.bench.kernels                                # a CUDA GPU; < 8 minutes
    TRITON_INTERPRET=1 python -m pope_fast.bench.kernels --tiny      # checks this script on a CPU
    TRITON_INTERPRET=1 python -m pope_fast.bench.kernels --launches  # kernels a layer: torch, fused

Before timing, every kernel is checked again at the timed shapes: NF4 dequantization and the
dequantized tiles of nf4_matmul and gather_logits bit for bit against bitsandbytes, the rest
against their references and baselines. Figures come from ``triton.testing.do_bench`` (median),
the copy bandwidth and bf16 matmul rate from the same device. Prints one markdown table (the
format of bench/RESULTS.md) and exits 1 if a check failed.
"""
import argparse
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels import (
    NF4Weight,
    dequantize_nf4,
    gather_logits,
    interpreter_on,
    nf4_matmul,
    prefix_attention,
    prefix_attention_ref,
    prefix_runs,
    rms_norm,
    vocab_argmax,
)
from ..kernels import LaunchCounter, fused_rms_norm, rotary, rotary_ref
from ..engine.layers.decoder import DecoderLayer
from ..engine.layers.dims import DecoderDims
from .timing import Checks, Row, device_rates, format_table, graphed_us, make_timer


@dataclass(frozen=True)
class Shapes:
    hidden: int = 4096
    vocab: int = 32064
    intermediate: int = 11008
    heads: int = 32  # LLaVA-1.5-7B (Vicuna-7B) has as many KV heads as query heads
    head_dim: int = 128
    prefix: int = 600  # system prompt + 576 image tokens
    questions: int = 18
    suffix: int = 20
    candidates: int = 8
    gemm_m: int = 2048


LLAVA_7B = Shapes()
TINY = Shapes(hidden=128, vocab=300, intermediate=192, heads=2, head_dim=16, prefix=40, questions=3,
              suffix=5, candidates=3, gemm_m=40)


def quantize(weight: torch.Tensor):
    import bitsandbytes.functional as bnb_functional

    packed, quant_state = bnb_functional.quantize_4bit(weight, blocksize=64,
                                                       compress_statistics=True, quant_type="nf4")
    return packed, quant_state, NF4Weight.from_bnb(packed, quant_state)


def bench_dequantize(s: Shapes, device, timer, checks: Checks, bandwidth: float) -> list[Row]:
    import bitsandbytes.functional as bnb_functional

    gen = torch.Generator(device=device).manual_seed(0)
    ok = True
    # bit for bit in each output dtype, and on a shape whose blocks straddle rows (K % 64 = 40)
    for dtype, shape in ((torch.float16, (s.intermediate, s.hidden)),
                         (torch.bfloat16, (s.hidden, s.intermediate)),
                         (torch.float32, (1000, 1000))):
        weight = torch.randn(shape, generator=gen, device=device).to(dtype) * 0.02
        packed, quant_state, w = quantize(weight)
        ok &= checks.equal(f"dequantize_nf4 {dtype} {shape}", dequantize_nf4(w, backend="triton"),
                           bnb_functional.dequantize_4bit(packed, quant_state))
    weight = torch.randn((s.intermediate, s.hidden), generator=gen, device=device).half() * 0.02
    packed, quant_state, w = quantize(weight)
    out = torch.empty(w.shape, dtype=torch.float16, device=device)
    ours = timer(lambda: dequantize_nf4(w, backend="triton", out=out))
    theirs = timer(lambda: bnb_functional.dequantize_4bit(packed, quant_state))
    moved = packed.numel() + w.absmax.numel() + 4 * w.nested_absmax.numel() + 2 * weight.numel()
    achieved = moved / ours / 1e3
    return [Row("dequantize_nf4", f"[{s.intermediate}, {s.hidden}] -> fp16", ours,
                "bnb dequantize_4bit", theirs,
                f"{achieved:.0f} GB/s = {achieved / bandwidth:.0%} of copy", ">= 80% of copy",
                achieved >= 0.8 * bandwidth, ok)]


def bench_logits(s: Shapes, device, timer, checks: Checks) -> list[Row]:
    gen = torch.Generator(device=device).manual_seed(1)
    lm_head = torch.randn((s.vocab, s.hidden), generator=gen, device=device).half() * 0.02
    hidden = torch.randn((s.questions, s.hidden), generator=gen, device=device).half()
    norm_weight = (1 + 0.1 * torch.randn(s.hidden, generator=gen, device=device)).half()
    ids = torch.randint(0, s.vocab, (s.candidates,), generator=gen, device=device)

    def full_logits():
        return F.linear(rms_norm(hidden, norm_weight, 1e-6), lm_head)

    exact = rms_norm(hidden, norm_weight, 1e-6).double() @ lm_head.double().T
    ok = checks.close("gather_logits",
                      gather_logits(hidden, lm_head, ids, norm_weight, backend="triton"),
                      exact[:, ids], 1e-3, 1e-3)
    argmax = vocab_argmax(hidden, lm_head, norm_weight, backend="triton")
    top2 = exact.topk(2, dim=1).values
    clear = top2[:, 0] - top2[:, 1] > 1e-3
    ok_argmax = checks.equal("vocab_argmax (rows with a clear maximum)", argmax[clear],
                             exact.argmax(dim=1)[clear])
    _, _, lm_head_nf4 = quantize(lm_head)
    eye = torch.eye(s.hidden, device=device, dtype=torch.float16)
    nf4_rows = dequantize_nf4(lm_head_nf4.take_rows(ids), backend="triton")
    ok_nf4 = checks.equal("gather_logits nf4 rows (one-hot hidden)",
                          gather_logits(eye, lm_head_nf4, ids, backend="triton"),
                          nf4_rows.T.float())

    shape = f"{s.questions} x {s.candidates} ids, V={s.vocab}, H={s.hidden}, +RMSNorm"
    rows = []
    full = timer(lambda: full_logits()[:, ids])
    for name, weight, checked in (("gather_logits fp16", lm_head, ok),
                                  ("gather_logits nf4", lm_head_nf4, ok_nf4)):
        def ours_fn(weight=weight):
            return gather_logits(hidden, weight, ids, norm_weight, backend="triton")

        ours = timer(ours_fn)
        # the target is the kernel's time: judged in a CUDA graph where one can be captured
        ours_graphed = graphed_us(ours_fn, device)
        full_graphed = graphed_us(lambda: full_logits()[:, ids], device)
        figure = f"{full / ours:.1f}x"
        if ours_graphed is not None:
            figure += f"; in a CUDA graph {ours_graphed:.1f} us"
            figure += f" vs {full_graphed:.1f} us" if full_graphed is not None else ""
        judged = ours if ours_graphed is None else ours_graphed
        rows.append(Row(name, shape, ours, "RMSNorm + full fp16 lm_head", full, figure, "< 20 us",
                        judged < 20, checked))
    ours = timer(lambda: vocab_argmax(hidden, lm_head, norm_weight, backend="triton"))
    baseline = timer(lambda: full_logits().argmax(dim=1))
    weight_gbs = lm_head.numel() * 2 / ours / 1e3
    figure = f"{baseline / ours:.1f}x, lm_head read at {weight_gbs:.0f} GB/s"
    rows.append(Row("vocab_argmax fp16", f"{s.questions} rows, V={s.vocab}, +RMSNorm", ours,
                    "RMSNorm + full lm_head + argmax", baseline, figure, "-", None, ok_argmax))
    return rows


def bench_nf4_matmul(s: Shapes, device, timer, checks: Checks, peak_tflops: float) -> list[Row]:
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnb_functional

    gen = torch.Generator(device=device).manual_seed(2)
    rows = []
    for name, (n, k) in (("gate/up_proj", (s.intermediate, s.hidden)),
                         ("down_proj", (s.hidden, s.intermediate)),
                         ("q/k/v/o_proj", (s.hidden, s.hidden))):
        weight = torch.randn((n, k), generator=gen, device=device).half() * 0.02
        packed, quant_state, w = quantize(weight)
        dense = bnb_functional.dequantize_4bit(packed, quant_state)
        x = torch.randn((s.gemm_m, k), generator=gen, device=device).half()
        # I @ W.T is W.T exactly: each dequantized tile, bit for bit
        eye = torch.eye(k, device=device, dtype=torch.float16)
        ok = checks.equal(f"nf4_matmul {name} (x = I)",
                          nf4_matmul(eye, w, backend="triton", fused_max_rows=k), dense.T)
        ok &= checks.close(f"nf4_matmul {name} vs cuBLAS", nf4_matmul(x, w, backend="triton"),
                           F.linear(x, dense), 2e-2, 1e-2)
        flop = 2 * s.gemm_m * n * k
        ours = timer(lambda: nf4_matmul(x, w, backend="triton"))
        cublas = timer(lambda: F.linear(x, dense))
        bnb_us = timer(lambda: bnb.matmul_4bit(x, packed, quant_state=quant_state))
        shape = f"M={s.gemm_m}, N={n}, K={k}"
        figure = (f"{flop / ours / 1e6:.0f} TFLOP/s = {flop / ours / 1e6 / peak_tflops:.0%} "
                  "of bf16 peak")
        rows.append(Row(f"nf4_matmul {name}", shape, ours, "cuBLAS on dequantized W", cublas,
                        f"{figure}; {ours / cublas:.2f}x cuBLAS time", "<= 1.5x cuBLAS",
                        ours <= 1.5 * cublas, ok))
        rows.append(Row(f"nf4_matmul {name}", shape, ours, "bnb matmul_4bit", bnb_us,
                        f"{bnb_us / ours:.2f}x faster", "-", None, ok))
        # the fused kernel where it runs: a question batch's rows, the weight read packed
        if name == "q/k/v/o_proj":
            few = x[:s.questions]
            fused = timer(lambda: nf4_matmul(few, w, backend="triton"))
            dense_us = timer(lambda: F.linear(few, dense))
            rows.append(Row("nf4_matmul fused", f"M={s.questions}, N={n}, K={k}", fused,
                            "cuBLAS on dequantized W", dense_us,
                            f"{fused / dense_us:.2f}x cuBLAS time", "-", None, ok))
    return rows


def bench_prefix_attention(s: Shapes, device, timer, checks: Checks) -> list[Row]:
    gen = torch.Generator(device=device).manual_seed(3)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device).half()

    q = randn(s.questions, s.heads, s.suffix, s.head_dim)
    k_prefix, v_prefix = randn(s.heads, s.prefix, s.head_dim), randn(s.heads, s.prefix, s.head_dim)
    k_suffix, v_suffix = (randn(s.questions, s.heads, s.suffix, s.head_dim) for _ in range(2))
    lens = torch.full((s.questions,), s.suffix, device=device)
    args = (q, k_prefix, v_prefix, k_suffix, v_suffix, lens)

    # the baseline's inputs are built outside its timing: each question's keys hold a prefix copy
    keys = torch.cat([k_prefix.expand(s.questions, -1, -1, -1), k_suffix], dim=2)
    values = torch.cat([v_prefix.expand(s.questions, -1, -1, -1), v_suffix], dim=2)
    mask = torch.ones(s.suffix, s.prefix + s.suffix, dtype=torch.bool, device=device)
    mask[:, s.prefix:] = torch.ones(s.suffix, s.suffix, dtype=torch.bool, device=device).tril()

    def sdpa():
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    ours_out = prefix_attention(*args, backend="triton")
    ok = checks.close("prefix_attention vs reference", ours_out, prefix_attention_ref(*args),
                      2e-3, 2e-3)
    ok &= checks.close("prefix_attention vs SDPA", ours_out, sdpa(), 4e-3, 4e-3)
    ours = timer(lambda: prefix_attention(*args, backend="triton"))
    baseline = timer(sdpa)
    shape = (f"{s.questions} questions x {s.suffix} tokens, prefix {s.prefix}, "
             f"{s.heads} x {s.head_dim} heads")
    rows = [Row("prefix_attention fp16", shape, ours, "SDPA, prefix expanded per question",
                baseline, f"{baseline / ours:.1f}x faster", ">= 2x", baseline >= 2 * ours, ok)]

    # A question batch that spans three images: one launch over three prefixes vs one launch
    # per image.
    k_prefixes, v_prefixes = (randn(3, s.heads, s.prefix, s.head_dim),
                              randn(3, s.heads, s.prefix, s.head_dim))
    index = [3 * i // s.questions for i in range(s.questions)]
    runs = prefix_runs(index)

    def per_image():
        return torch.cat([prefix_attention(q[a:e], k_prefixes[g], v_prefixes[g], k_suffix[a:e],
                                           v_suffix[a:e], lens[a:e], backend="triton")
                          for g, a, e in runs])

    multi_args = (q, k_prefixes, v_prefixes, k_suffix, v_suffix, lens)
    ours_out = prefix_attention(*multi_args, backend="triton", prefix_index=index)
    ok = checks.close("prefix_attention, 3 prefixes, vs reference", ours_out,
                      prefix_attention_ref(*multi_args, prefix_index=index), 2e-3, 2e-3)
    ours = timer(lambda: prefix_attention(*multi_args, backend="triton", prefix_index=index))
    baseline = timer(per_image)
    rows.append(Row("prefix_attention fp16, 3 prefixes", shape.replace("prefix", "3 prefixes of"),
                    ours, "one launch per prefix", baseline, f"{baseline / ours:.1f}x faster", "-",
                    None, ok))
    return rows


def bench_elementwise(s: Shapes, device, timer, checks: Checks) -> list[Row]:
    """The fused RMSNorm (bit for bit torch's CPU op here too) and RoPE at a prefix's rows, a
    question batch's heads."""
    gen = torch.Generator(device=device).manual_seed(5)
    x, weight = (torch.randn(n, generator=gen, device=device).half()
                 for n in ((s.prefix, s.hidden), (s.hidden,)))
    ok = checks.equal("fused_rms_norm vs rms_norm on the CPU",
                      fused_rms_norm(x, weight, 1e-5, "triton").cpu(),
                      rms_norm(x.cpu(), weight.cpu(), 1e-5))
    ours = timer(lambda: fused_rms_norm(x, weight, 1e-5, "triton"))
    theirs = timer(lambda: rms_norm(x, weight, 1e-5))
    rows = [Row("fused_rms_norm fp16", f"{s.prefix} x {s.hidden}", ours, "torch, 8 kernels", theirs,
                f"{theirs / ours:.1f}x faster", "-", None, ok)]
    q = torch.randn((s.questions, s.suffix, s.hidden), generator=gen, device=device).half()
    q = q.view(s.questions, s.suffix, heads := s.hidden // s.head_dim, s.head_dim).transpose(1, 2)
    cos, sin = torch.randn((2, s.suffix, s.head_dim), generator=gen, device=device).half()
    ok = checks.equal("rotary vs rotary_ref", rotary(q, cos, sin, "triton"),
                      rotary_ref(q, cos, sin))
    ours = timer(lambda: rotary(q, cos, sin, "triton"))
    theirs = timer(lambda: rotary_ref(q, cos, sin))
    rows.append(Row("rotary fp16", f"{s.questions} x {heads} x {s.suffix} x {s.head_dim}", ours,
                    "torch, 5 kernels", theirs, f"{theirs / ours:.1f}x faster", "-", None, ok))
    return rows


def layer_launches(s: Shapes, device) -> tuple[LaunchCounter, LaunchCounter]:
    """One LLaMA layer's launches on a question batch, torch path and fused (qkv and finish;
    attention left out)."""
    gen = torch.Generator(device=device).manual_seed(4)
    h, mlp, heads = s.hidden, s.intermediate, s.hidden // s.head_dim
    shapes = {**{f"self_attn.{n}_proj.weight": (h, h) for n in "qkvo"},
              "mlp.gate_proj.weight": (mlp, h), "mlp.up_proj.weight": (mlp, h),
              "mlp.down_proj.weight": (h, mlp), "input_layernorm.weight": (h,),
              "post_attention_layernorm.weight": (h,)}
    weights = {n: torch.randn(shape, generator=gen, device=device).half()
               for n, shape in shapes.items()}
    layer = DecoderLayer(DecoderDims(s.vocab, h, mlp, 1, heads, heads, s.head_dim, 1e-5, 1e4),
                         weights, lambda w, b=None: lambda x: F.linear(x, w, b))
    x = torch.randn((s.questions, s.suffix, h), generator=gen, device=device).half()
    cos, sin = torch.randn((2, s.suffix, s.head_dim), generator=gen, device=device).half()
    plain, fused = LaunchCounter(), LaunchCounter()
    for layer.kernels, counter in (("torch", plain), ("triton", fused)):
        with torch.inference_mode(), counter:
            layer.finish(x, layer.qkv(x, cos, sin)[0])
    return plain, fused


def launches_line(s: Shapes, device) -> str:
    plain, fused = layer_launches(s, device)
    ops = ", ".join(f"{k} {n}" for k, n in sorted(plain.ops.items()))
    return (f"Kernels per decoder layer ({device.type}, {s.questions} x {s.suffix} tokens, "
            f"attention left out): torch path {plain.ops.total()} ops ({ops}); fused "
            f"norm and RoPE {fused.ops.total()} ops + {fused.triton} Triton launches")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true",
                        help="tiny shapes: checks this script, times nothing real")
    parser.add_argument("--launches", action="store_true",
                        help="count kernels per decoder layer, time nothing")
    args = parser.parse_args(argv)
    if args.launches:  # on CUDA, or on a CPU under the interpreter
        on_cuda = torch.cuda.is_available() and not interpreter_on()
        device = torch.device("cuda" if on_cuda else "cpu")
        print(launches_line(TINY if args.tiny else LLAVA_7B, device))
        return 0
    if torch.cuda.is_available() and not interpreter_on():
        device = torch.device("cuda")
        device_line = f"GPU: {torch.cuda.get_device_name()}, torch {torch.version.__version__}"
    elif args.tiny and interpreter_on():
        device = torch.device("cpu")
        device_line = "CPU under the Triton interpreter (--tiny): these figures mean nothing"
    else:
        sys.exit("bench/kernels.py times Triton kernels on a CUDA GPU, and none is available here "
                 "(or TRITON_INTERPRET=1 is set). On a CPU, only `TRITON_INTERPRET=1 python -m "
                 "pope_fast.bench.kernels --tiny` runs, to check the script itself.")
    import triton

    shapes = TINY if args.tiny else LLAVA_7B
    timer = make_timer(device)
    checks = Checks()
    started = time.perf_counter()
    bandwidth, tflops = device_rates(device, timer, args.tiny)
    rows = bench_dequantize(shapes, device, timer, checks, bandwidth)
    rows += bench_logits(shapes, device, timer, checks)
    rows += bench_nf4_matmul(shapes, device, timer, checks, tflops)
    rows += bench_prefix_attention(shapes, device, timer, checks)
    rows += bench_elementwise(shapes, device, timer, checks)
    device_line += (f", triton {triton.__version__}; measured copy bandwidth {bandwidth:.0f} GB/s, "
                    f"bf16 matmul {tflops:.0f} TFLOP/s; {time.perf_counter() - started:.0f} s")
    print(format_table(rows, device_line))
    for failure in checks.failures:
        print(f"CHECK FAILED: {failure}")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
