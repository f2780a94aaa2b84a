"""The decoder's fused RMSNorm and RoPE kernels (under the interpreter) in a whole engine: every
answer, candidate logit and continuation bit for bit the torch path's. Only the layers' norms and
RoPE take the Triton path here (the other kernels sum in their own order), so any difference is a
wiring mistake of those call sites."""
import pytest
from tinymodels import QUESTIONS

from pope_fast.engine import Engine, Settings
from pope_fast.engine.layers import decoder_layer, ops
from pope_fast.kernels import interpreter_on

pytestmark = [pytest.mark.skipif(not interpreter_on(),
                                 reason="needs TRITON_INTERPRET=1 before triton is imported"),
              pytest.mark.slow]  # a tiny engine with interpreted kernels: seconds


class Counted:
    """Stands in for a fused op in engine/layers/decoder_layer.py and ops.py: counts the calls that
    asked for Triton."""

    def __init__(self, op):
        self.op, self.triton_calls = op, 0

    def __call__(self, *args):
        self.triton_calls += args[-1] == "triton"
        return self.op(*args)


def test_fused_norm_and_rotary_give_the_torch_path_bits(tiny, monkeypatch):
    """Qwen3-VL in fp16: q_norm and k_norm as well as the layers' two norms, and
    M-RoPE's per-row cos/sin."""
    from registry import REGISTRY

    norm, rope = Counted(decoder_layer.fused_rms_norm), Counted(ops.apply_rotary)
    monkeypatch.setattr(decoder_layer, "fused_rms_norm", norm)
    monkeypatch.setattr(decoder_layer, "apply_rotary", rope)
    settings = Settings(kernels="torch", dtype="fp16", batch_size=4, max_new_tokens=2)
    checkpoint = tiny.checkpoint("qwen3_vl")
    engines = [Engine.load(checkpoint, settings, readouts="template_aware,first_token,string_parse")
               for _ in range(2)]
    for layer in engines[0].model.lm.layers:
        # the norms and RoPE only: the Linears, attention and lm_head stay torch
        layer.kernels = "triton"
    image, questions = REGISTRY["qwen3_vl"].images[0], [QUESTIONS[0], QUESTIONS[3], QUESTIONS[5]]
    # rows of three lengths: own positions
    fused, plain = (engine.answer(image, questions) for engine in engines)
    layers_count = len(engines[0].model.lm.layers)
    assert norm.triton_calls >= 2 * layers_count and rope.triton_calls >= 2 * layers_count
    for a, b in zip(fused, plain, strict=True):
        assert a.candidate_logits == b.candidate_logits, a.question  # fp32 values, compared exactly
        assert a == b
