"""Qwen2-VL against transformers' Qwen2VLForConditionalGeneration, the oracle, on a tiny random
checkpoint (native-resolution ViT with 2 x 2 merging, Qwen2 with M-RoPE)."""

from functools import partial

import pytest
import torch
from familychecks import (assert_continuations_match, assert_nf4_matches, assert_run_matches, assert_scores_match,
                          image_items, qwen_oracle)
from tinymodels import QUESTIONS, bnb_nf4_oracle, make_tiny_qwen2_vl, synthetic_image
from tinymodels import qwen_inputs as _inputs

from pope_fast.engine import Engine, Settings

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
    assert_scores_match(engine, oracle, IMAGES, QUESTIONS[:3])


def test_same_length_prefixes_with_different_grids_share_a_batch(checkpoint, oracle):
    """2 x 3 and 3 x 2 grids: one prefix length, different M-RoPE positions, one prefill."""
    engine = Engine.load(checkpoint, Settings(batch_size=4, max_new_tokens=6), readouts="all")
    items = image_items(engine, IMAGES, QUESTIONS[:3])
    assert items[0].features.shape[:2] == (2, 3) and items[1].features.shape[:2] == (3, 2)
    assert_run_matches(engine, oracle, items, QUESTIONS[:3])


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
    assert_continuations_match(engine, oracle, IMAGES, QUESTIONS[:3])


def test_nf4_decisions_match_transformers_bnb(tmp_path):
    """NF4 as transformers quantizes Qwen2-VL (every Linear but lm_head, the tower's included), against
    transformers + bitsandbytes on CPU (see engine/test_engine_nf4 for the two CPU caveats)."""
    import bitsandbytes as bnb
    from transformers import Qwen2VLForConditionalGeneration

    checkpoint = make_tiny_qwen2_vl(tmp_path / "ckpt", vision_dim=64, seed=9)
    model = bnb_nf4_oracle(Qwen2VLForConditionalGeneration, checkpoint)
    quantized = {n.split(".")[1] for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized == {"visual", "language_model"}
    engine = Engine.load(checkpoint, Settings(quant="nf4", dtype="fp16", max_new_tokens=6), readouts="all")
    assert_nf4_matches(engine, model, partial(_inputs, checkpoint), IMAGES[:2], QUESTIONS[:3])
