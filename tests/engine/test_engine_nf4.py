"""NF4 as the paper ran it (bitsandbytes load_in_4bit, nf4, double quant, fp16 compute), against
transformers + bitsandbytes on CPU.

Two facts about bitsandbytes 0.50 on CPU shape this file (both checked here):
- On CPUs with AVX512-BF16, Linear4bit.forward repacks its weight for a CPU-only GEMM that keeps the
  block scales in bf16, which the paper's GPU path never does; the oracle switches that repack off
  so it computes dequantize_4bit (fp32 scales) + F.linear, the GPU path's numerics.
- Its CPU dequantize kernel disagrees with its own (flat-blocked) quantizer when a weight row is
  shorter than one 64-element block; real models never have such rows, so the tiny vision tower
  here is 64 wide.
"""
import pytest
import torch
from tinymodels import (QUESTIONS, assert_matches_nf4_oracle, bnb_nf4_oracle, make_tiny_llava,
                        synthetic_image)

from pope_fast.engine import Engine, Settings

pytestmark = pytest.mark.slow  # the engine on tiny checkpoints, against transformers

IMAGES = [synthetic_image(20 + i, size) for i, size in enumerate([(80, 60), (60, 90)])]
NF4 = dict(quant="nf4", dtype="fp16")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("tiny_llava_nf4") / "ckpt", vision_hidden=64,
                           seed=3)


@pytest.fixture(scope="module")
def oracle_model(checkpoint):
    from transformers import LlavaForConditionalGeneration

    return bnb_nf4_oracle(LlavaForConditionalGeneration, checkpoint)


@pytest.fixture(scope="module")
def engine(checkpoint):
    return Engine.load(checkpoint, Settings(**NF4, max_new_tokens=6), readouts="all")


def test_dequantized_weights_equal_bitsandbytes(engine, oracle_model):
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnb_functional

    ours = {
        "model.language_model.layers.1.mlp.down_proj": engine.model.lm.layers[1].down_proj,
        "model.language_model.layers.0.self_attn.k_proj": engine.model.lm.layers[0].k_proj,
        "model.multi_modal_projector.linear_1": engine.model.projector[0],
        "model.vision_tower.encoder.layers.0.mlp.fc2":
            engine.model.vision.encoder.layers[0].mlp.fc2,
    }
    modules = dict(oracle_model.named_modules())
    quantized = [n for n, m in modules.items() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == 2 * 7 + 2 + 2 * 6   # every Linear of LM, projector and vision tower
    assert not isinstance(modules["lm_head"], bnb.nn.Linear4bit)
    for name, linear in ours.items():
        w = modules[name].weight
        expected = bnb_functional.dequantize_4bit(w.data, w.quant_state)
        assert linear.weight.dtype == torch.float16
        assert torch.equal(linear.weight, expected), name
    assert (engine.model.lm.lm_head.packed is None
            and engine.model.lm.lm_head.weight.dtype == torch.float16)
    # layer -2 of 2 is read: the last is never run
    assert len(engine.model.vision.encoder.layers) == 1


def test_candidate_logits_and_decisions_match_transformers_bnb(checkpoint, engine, oracle_model):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(checkpoint))
    for image in IMAGES:
        for answer in engine.answer(image, QUESTIONS):
            inputs = processor(images=image, text=engine.prompt(answer.question),
                               return_tensors="pt")
            inputs["pixel_values"] = inputs["pixel_values"].half()
            with torch.no_grad():
                theirs = oracle_model(**inputs).logits[0, -1].float()
            assert_matches_nf4_oracle(engine, answer, theirs)


def test_packed_weights_give_the_same_answers(checkpoint, engine):
    packed = Engine.load(checkpoint, Settings(**NF4, nf4_weights="packed", max_new_tokens=6),
                         readouts="all")
    assert packed.model.lm.layers[0].q_proj.packed is not None
    assert engine.model.lm.layers[0].q_proj.packed is None
    for image in IMAGES[:1]:
        assert [a.candidate_logits for a in packed.answer(image, QUESTIONS)] == \
               [a.candidate_logits for a in engine.answer(image, QUESTIONS)]


def test_quantized_lm_head_option(checkpoint):
    engine = Engine.load(checkpoint, Settings(**NF4, quantize_lm_head=True),
                         readouts="template_aware")
    assert engine.model.lm.lm_head.weight.dtype == torch.float16
    plain = Engine.load(checkpoint, Settings(**NF4), readouts="template_aware")
    assert not torch.equal(engine.model.lm.lm_head.weight, plain.model.lm.lm_head.weight)
