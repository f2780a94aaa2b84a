"""Qwen2-VL against transformers' Qwen2VLForConditionalGeneration, the oracle, on a tiny random
checkpoint (native-resolution ViT with 2 x 2 merging, Qwen2 with M-RoPE)."""

import pytest
import torch
from tinymodels import (QUESTIONS, assert_matches_nf4_oracle, bnb_nf4_oracle, generated_text, make_tiny_qwen2_vl,
                        synthetic_image, worst_difference)
from tinymodels import qwen_inputs as _inputs, qwen_oracle

from pope_fast.engine import Engine, ImagePrompts, Settings

# Merged token grids 2 x 3 and 3 x 2 (six tokens each: one prefix length, two position layouts),
# 2 x 2, and 1 x 7 (the text after it moves on by 7, its token count; the others by their longer side).
SIZES = [(90, 40), (40, 90), (60, 60), (200, 30)]
IMAGES = [synthetic_image(i + 41, size) for i, size in enumerate(SIZES)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_qwen2_vl(tmp_path_factory.mktemp("tiny_qwen2_vl") / "ckpt")


@pytest.fixture(scope="module")
def oracle(checkpoint):
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    return qwen_oracle(checkpoint, model, IMAGES, QUESTIONS[:3])


@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 2), (True, 32), (False, 3)],
                         ids=["reuse-b2", "reuse-b32", "whole-b3"])
def test_candidate_logits_match_transformers(checkpoint, oracle, prefix_reuse, batch_size):
    engine = Engine.load(checkpoint, Settings(batch_size=batch_size, prefix_reuse=prefix_reuse, max_new_tokens=6), readouts="all")
    assert engine.template.name == "qwen2_vl_chat"
    for i, image in enumerate(IMAGES):
        for answer in engine.score(image, QUESTIONS[:3]):
            logits, generated = oracle[i, answer.question]
            worst, at = worst_difference(answer.candidate_logits, logits)
            assert worst <= 1e-4, f"image {i} {answer.question!r}: id {at} differs by {worst:.2e}"
            assert answer.first_token_id == int(logits.argmax()) == generated[0]


def test_same_length_prefixes_with_different_grids_share_a_batch(checkpoint, oracle):
    """2 x 3 and 3 x 2 grids: one prefix length, different M-RoPE positions, one prefill."""
    engine = Engine.load(checkpoint, Settings(batch_size=4, max_new_tokens=6), readouts="all")
    items = [ImagePrompts(engine.features(image), [engine.prompt(q) for q in QUESTIONS[:3]]) for image in IMAGES]
    assert items[0].features.shape[:2] == (2, 3) and items[1].features.shape[:2] == (3, 2)
    for i, answers in enumerate(engine.run_images(items)):
        for q, answer in zip(QUESTIONS[:3], answers):
            first, candidates = answer.first_token_id, answer.candidate_logits
            logits, generated = oracle[i, q]
            worst, _ = worst_difference(candidates, logits)
            assert worst <= 1e-4 and first == generated[0], f"image {i} {q!r}"


def test_positions_follow_the_grid(checkpoint):
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    features = engine.features(IMAGES[0])  # 2 x 3
    ids = engine.model.prompt_ids(engine.prompt(QUESTIONS[0]), 6)
    streams = engine.model.positions(ids, features)
    start = ids.index(engine.model.image_token_id)
    assert streams[:, start:start + 6].tolist() == [[start] * 6, [start + r for r in (0, 0, 0, 1, 1, 1)],
                                                   [start + c for c in (0, 1, 2, 0, 1, 2)]]
    assert streams[:, start + 6].tolist() == [start + 3] * 3   # on from the longer side, not the count


def test_continuation_matches_generate(checkpoint, oracle):
    engine = Engine.load(checkpoint, Settings(max_new_tokens=4), readouts="string_parse")
    for i, image in enumerate(IMAGES):
        for answer in engine.score(image, QUESTIONS[:3]):
            _, generated = oracle[i, answer.question]
            assert answer.decoded == generated_text(engine, generated)


def test_nf4_decisions_match_transformers_bnb(tmp_path):
    """NF4 as transformers quantizes Qwen2-VL (every Linear but lm_head, the tower's included), against
    transformers + bitsandbytes on CPU (see test_engine_nf4 for the two CPU caveats)."""
    import bitsandbytes as bnb
    from transformers import Qwen2VLForConditionalGeneration

    checkpoint = make_tiny_qwen2_vl(tmp_path / "ckpt", vision_dim=64, seed=9)
    model = bnb_nf4_oracle(Qwen2VLForConditionalGeneration, checkpoint)
    quantized = {n.split(".")[1] for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized == {"visual", "language_model"}
    engine = Engine.load(checkpoint, Settings(quant="nf4", dtype="fp16", max_new_tokens=6), readouts="all")
    for image in IMAGES[:2]:
        for answer in engine.score(image, QUESTIONS[:3]):
            inputs = _inputs(checkpoint, image, engine.prompt(answer.question))
            inputs["pixel_values"] = inputs["pixel_values"].half()
            with torch.no_grad():
                theirs = model(**inputs).logits[0, -1].float()
            assert_matches_nf4_oracle(engine, answer, theirs)
