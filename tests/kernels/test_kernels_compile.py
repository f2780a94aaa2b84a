"""The kernels compile for an H200 (sm_90) without one: triton lowers them to PTX and its bundled
ptxas to a cubin on the CPU. This catches what the interpreter lets through (layouts, dot shapes,
shared memory) and checks two facts the GPU results rest on: the dequantizing kernels contain no
fused multiply-add (bitsandbytes rounds the nested absmax product before adding the offset), and
the matmul-like kernels use the tensor cores.

The compilation runs in a child process with the interpreter off (this process has it on, so
here every kernel is an interpreted function). Block sizes mirror the GPU choices of the wrappers.
"""
import json
import os
import subprocess
import sys

import pytest

# the Triton interpreter runs each kernel case on the CPU: seconds a case
pytestmark = pytest.mark.slow

COMPILE_SCRIPT = r'''
import importlib, json, re
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def kernel(module, name):
    return getattr(importlib.import_module(f"pope_fast.kernels.{module}"), name)

def compile_for_sm90(fn, pointers, constexprs, **options):
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*" + pointers.get(name, "fp32")
        else:
            signature[name] = "fp32" if name in ("eps", "scale_log2e", "scale") else "i32"
    source = ASTSource(fn, signature, constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    return {"shared": compiled.metadata.shared,
            "fma_f32": len(re.findall(r"\bfma\.rn\.f32", ptx)),
            "approx_f32": len(re.findall(r"\.approx\.(?:ftz\.)?f32|\bdiv\.full\.f32", ptx)),
            "mma": len(re.findall(r"\b(wgmma\.mma_async|mma\.sync)", ptx))}

nf4 = dict(BLOCKSIZE=64, NESTED=True, NESTED_BLOCKSIZE=256)
packed = dict(packed_ptr="u8", absmax_ptr="u8")
exact = dict(enable_fp_fusion=False)
results = {}
for dtype, name in ((tl.float16, "fp16"), (tl.bfloat16, "bf16")):
    results[f"dequantize-{name}"] = compile_for_sm90(
        kernel("nf4", "_dequantize_nf4_kernel"), {**packed, "out_ptr": name},
        dict(nf4, BLOCKS_PER_PROGRAM=32, OUT_DTYPE=dtype), num_warps=4, **exact)
    for aligned in (True, False):
        results[f"nf4_matmul-{name}-{'aligned' if aligned else 'straddling'}"] = compile_for_sm90(
            kernel("nf4_matmul", "_nf4_matmul_kernel"), {**packed, "x_ptr": name, "out_ptr": name},
            dict(nf4, ALIGNED=aligned, X_DTYPE=dtype, DOT_DTYPE=dtype,
                 BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8),
            num_warps=8, num_stages=3 if aligned else 2, **exact)
    tensors = ("q_ptr", "k_prefix_ptr", "v_prefix_ptr", "k_suffix_ptr", "v_suffix_ptr", "out_ptr")
    # with an attention intervention's edit of the image keys, and without
    for edit in (False, True):
        results[f"prefix_attention-{name}" + ("-edit" if edit else "")] = compile_for_sm90(
            kernel("prefix_attention", "_prefix_attention_kernel"),
            {**dict.fromkeys(tensors, name), "lens_ptr": "i64", "runs_ptr": "i32",
             "marked_ptr": "i8"},
            dict(GROUP=4, DOT_DTYPE=dtype, OUT_DTYPE=dtype, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128,
                 EDIT=edit),
            num_warps=4, num_stages=2)
fp16 = tl.float16
logits = dict(nf4, NORM=True, HIDDEN_DTYPE=fp16, NORMED_DTYPE=fp16, WEIGHT_DTYPE=fp16,
              DOT_DTYPE=fp16)
weight_pointers = {"nf4": {"weight_ptr": "u8", "absmax_ptr": "u8"}, "fp16": {"weight_ptr": "fp16"}}
for weight, pointers in weight_pointers.items():
    pointers = {"hidden_ptr": "fp16", "norm_ptr": "fp16", "ids_ptr": "i64", "tile_index_ptr": "i64",
                **pointers}
    results[f"gather_logits-{weight}"] = compile_for_sm90(
        kernel("gather_logits", "_gather_logits_kernel"), pointers,
        dict(logits, NF4=weight == "nf4", ALIGNED=False, BLOCK_B=32, BLOCK_V=16, BLOCK_K=256),
        num_warps=8, **exact)
    results[f"vocab_argmax-{weight}"] = compile_for_sm90(
        kernel("gather_logits", "_vocab_argmax_kernel"), pointers,
        dict(logits, NF4=weight == "nf4", ALIGNED=weight == "nf4", BLOCK_B=32, BLOCK_V=128,
             BLOCK_K=64 if weight == "nf4" else 128, ROUND_LOGITS=True, LOGITS_DTYPE=fp16),
        num_warps=4, **exact)
norm = importlib.import_module("pope_fast.kernels.norm")
for dtype, name in ((tl.float16, "fp16"), (tl.bfloat16, "bf16")):
    for offset in (False, True):  # LLaMA's norm, and Gemma's with a query scale
        results[f"rms_norm-{name}" + ("-offset" if offset else "")] = compile_for_sm90(
            kernel("norm", "_rms_norm_kernel"),
            {"x_ptr": name, "weight_ptr": name, "out_ptr": name},
            dict(OFFSET=offset, SCALED=offset, X_DTYPE=dtype, OUT_DTYPE=dtype,
                 **norm._sum_plan(4096, 8), BLOCK_R=16, BLOCK_H=1024),
            num_warps=4, **exact)
    results[f"rotary-{name}"] = compile_for_sm90(
        kernel("rotary", "_rotary_kernel"),
        dict.fromkeys(("x_ptr", "cos_ptr", "sin_ptr", "out_ptr"), name),
        dict(HALF=64, DTYPE=dtype, BLOCK_R=32, BLOCK_D=64), num_warps=4, **exact)
print(json.dumps(results))
'''

SM90_SHARED_BYTES = 227 * 1024  # the most one block may use on Hopper


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # silences triton 3.9's notice; our launches say what they need
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_within_shared_memory(compiled):
    # prefix_attention with and without an attention edit; both norms, RoPE
    assert len(compiled) == 20
    too_big = {name: r["shared"] for name, r in compiled.items() if r["shared"] > SM90_SHARED_BYTES}
    assert not too_big, f"shared memory over {SM90_SHARED_BYTES} bytes: {too_big}"


@pytest.mark.slow
def test_dequantizing_kernels_round_like_bitsandbytes_without_fma(compiled):
    readers = ("dequantize", "nf4_matmul", "gather_logits-nf4", "vocab_argmax-nf4")
    fused = {name: r["fma_f32"] for name, r in compiled.items()
             if name.startswith(readers) and r["fma_f32"]}
    assert not fused, f"fp32 fma in kernels that must round each product: {fused}"


@pytest.mark.slow
def test_matmul_like_kernels_use_tensor_cores(compiled):
    no_mma = [name for name, r in compiled.items()
              if not name.startswith(("dequantize", "rms_norm", "rotary")) and r["mma"] == 0]
    assert not no_mma, f"no tensor-core instructions in {no_mma}"


@pytest.mark.slow
def test_norm_and_rotary_round_each_op_as_ieee_does(compiled):
    """Their bits equal torch's only with each product and sum rounded apart (no fma) and a
    correctly rounded square root and division (triton's plain `/` and rsqrt are approximate on a
    GPU; the interpreter can't tell)."""
    inexact = {name: (r["fma_f32"], r["approx_f32"]) for name, r in compiled.items()
               if name.startswith(("rms_norm", "rotary")) and (r["fma_f32"] or r["approx_f32"])}
    assert not inexact, (
        f"(fma, approximate ops) in kernels that must round as torch does: {inexact}")


class LaunchRecorder:
    """Stands in for a kernel: records each launch's keyword arguments, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


def test_nf4_reading_launches_switch_fp_fusion_off(monkeypatch):
    """The no-fma fact above holds only for launches with enable_fp_fusion=False."""
    import torch

    from pope_fast.kernels import (dequantize_nf4, gather_logits, nf4_matmul, quantize_nf4,
                                   vocab_argmax)

    recorders = {}
    nf4_readers = (("nf4", "_dequantize_nf4_kernel"), ("nf4_matmul", "_nf4_matmul_kernel"),
                   ("gather_logits", "_gather_logits_kernel"),
                   ("gather_logits", "_vocab_argmax_kernel"))
    for module_name, kernel_name in nf4_readers:
        module = sys.modules[f"pope_fast.kernels.{module_name}"]
        recorders[kernel_name] = LaunchRecorder(getattr(module, kernel_name))
        monkeypatch.setattr(module, kernel_name, recorders[kernel_name])
    w = quantize_nf4(torch.randn(40, 64, generator=torch.Generator().manual_seed(0)).half())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).half()
    dequantize_nf4(w, backend="triton")
    nf4_matmul(x, w, backend="triton")
    gather_logits(x, w, torch.tensor([0, 39]), backend="triton")
    vocab_argmax(x, w, backend="triton")
    for name, recorder in recorders.items():
        assert [launch.get("enable_fp_fusion") for launch in recorder.launches] == [False], name
