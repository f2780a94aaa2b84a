"""LLaVA-NeXT against transformers' LlavaNextForConditionalGeneration, the oracle, on a tiny random
checkpoint whose crops are 28 px (2 x 2 patch features), so every grid shape of its pinpoints and
both unpad directions appear at small image sizes."""

import pytest
import torch
from familychecks import (assert_continuations_match, assert_nf4_matches, assert_run_matches, assert_scores_match,
                          image_items, processor_inputs, processor_oracle)
from tinymodels import QUESTIONS, bnb_nf4_oracle, make_tiny_llava_next, synthetic_image

from pope_fast.engine import Engine, Settings

# (width, height): wide (unpad rows), tall (unpad columns), square, very wide (a 1 x 3 grid), tiny
SIZES = [(90, 40), (40, 90), (60, 60), (120, 30), (20, 18)]
IMAGES = [synthetic_image(i + 11, size) for i, size in enumerate(SIZES)]
PROMPT = "[INST] <image>\n{} Answer yes or no only. [/INST]"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava_next(tmp_path_factory.mktemp("tiny_llava_next") / "ckpt")


@pytest.fixture(scope="module")
def oracle(checkpoint):
    """transformers' answer-position logits, greedy continuation and prompt ids per (image, question), on
    Mistral's prompt as written here."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(checkpoint))
    return processor_oracle(LlavaNextForConditionalGeneration, checkpoint, processor, PROMPT.format, IMAGES,
                            QUESTIONS[:3])


@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 2), (True, 32), (False, 3)],
                         ids=["reuse-b2", "reuse-b32", "whole-b3"])
def test_candidate_logits_match_transformers(checkpoint, oracle, prefix_reuse, batch_size):
    engine = Engine.load(checkpoint, Settings(batch_size=batch_size, prefix_reuse=prefix_reuse, max_new_tokens=6), readouts="all")
    assert engine.template.name == "mistral_inst"
    for i, image in enumerate(IMAGES):
        tokens = oracle[i, QUESTIONS[0]][2].count(engine.model.image_token_id)
        assert engine.features(image).shape[0] == tokens, f"image {i}: transformers has {tokens} image tokens"
    assert_scores_match(engine, oracle, IMAGES, QUESTIONS[:3])


def test_images_of_different_token_counts_in_one_batch(checkpoint, oracle):
    """A batch whose images have different prefix lengths, and whose question rows span images."""
    engine = Engine.load(checkpoint, Settings(batch_size=4, max_new_tokens=6), readouts="all")
    items = image_items(engine, IMAGES, QUESTIONS[:3])
    assert len({item.features.shape[0] for item in items}) >= 3
    assert_run_matches(engine, oracle, items, QUESTIONS[:3])


def test_continuation_matches_generate(checkpoint, oracle):
    engine = Engine.load(checkpoint, Settings(max_new_tokens=4), readouts="string_parse")
    assert_continuations_match(engine, oracle, IMAGES[:3], QUESTIONS[:3])


def test_pad_aspect_is_refused(checkpoint):
    with pytest.raises(ValueError, match="LLaVA-NeXT tiles every image"):
        Engine.load(checkpoint, Settings(image_aspect="pad"))


def test_nf4_decisions_match_transformers_bnb(tmp_path):
    """NF4 as transformers quantizes LLaVA-NeXT (LM, projector and tower Linears; image_newline stays
    fp16), against transformers + bitsandbytes on CPU (see engine/test_engine_nf4 for the two CPU caveats)."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    checkpoint = make_tiny_llava_next(tmp_path / "ckpt", vision_hidden=64, seed=5)
    model = bnb_nf4_oracle(LlavaNextForConditionalGeneration, checkpoint)
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    engine = Engine.load(checkpoint, Settings(quant="nf4", dtype="fp16", max_new_tokens=6), readouts="all")
    assert torch.equal(engine.model.newline, model.model.image_newline.data)
    inputs_of = processor_inputs(processor)
    assert_nf4_matches(engine, model, inputs_of, IMAGES[:3], QUESTIONS[:3])
