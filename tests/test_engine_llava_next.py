"""LLaVA-NeXT against transformers' LlavaNextForConditionalGeneration, the oracle, on a tiny random
checkpoint whose crops are 28 px (2 x 2 patch features), so every grid shape of its pinpoints and
both unpad directions appear at small image sizes."""

import pytest
import torch
from tinymodels import (QUESTIONS, assert_matches_nf4_oracle, bnb_nf4_oracle, generated_text, make_tiny_llava_next,
                        synthetic_image, worst_difference)

from pope_fast.engine import Engine, ImagePrompts, Settings

# (width, height): wide (unpad rows), tall (unpad columns), square, very wide (a 1 x 3 grid), tiny
SIZES = [(90, 40), (40, 90), (60, 60), (120, 30), (20, 18)]
IMAGES = [synthetic_image(i + 11, size) for i, size in enumerate(SIZES)]
PROMPT = "[INST] <image>\n{} Answer yes or no only. [/INST]"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava_next(tmp_path_factory.mktemp("tiny_llava_next") / "ckpt")


@pytest.fixture(scope="module")
def oracle(checkpoint):
    """transformers' answer-position logits, greedy continuation and image-token count per (image, question)."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    model = LlavaNextForConditionalGeneration.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    out = {}
    for i, image in enumerate(IMAGES):
        for q in QUESTIONS[:3]:
            inputs = processor(images=image, text=PROMPT.format(q), return_tensors="pt")
            with torch.no_grad():
                logits = model(**inputs).logits[0, -1]
                generated = model.generate(**inputs, max_new_tokens=4, do_sample=False)[0, inputs["input_ids"].shape[1]:]
            tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
            out[i, q] = (logits, generated.tolist(), tokens)
    return out


@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 2), (True, 32), (False, 3)],
                         ids=["reuse-b2", "reuse-b32", "whole-b3"])
def test_candidate_logits_match_transformers(checkpoint, oracle, prefix_reuse, batch_size):
    engine = Engine.load(checkpoint, Settings(batch_size=batch_size, prefix_reuse=prefix_reuse, max_new_tokens=6), readouts="all")
    assert engine.template.name == "mistral_inst"
    for i, image in enumerate(IMAGES):
        features = engine.features(image)
        for answer in engine.score(image, QUESTIONS[:3]):
            logits, generated, tokens = oracle[i, answer.question]
            assert features.shape[0] == tokens, f"image {i}: {features.shape[0]} image tokens, transformers {tokens}"
            worst, at = worst_difference(answer.candidate_logits, logits)
            assert worst <= 1e-4, f"image {i} {answer.question!r}: id {at} differs by {worst:.2e}"
            assert answer.first_token_id == int(logits.argmax()) == generated[0]


def test_images_of_different_token_counts_in_one_batch(checkpoint, oracle):
    """A batch whose images have different prefix lengths, and whose question rows span images."""
    engine = Engine.load(checkpoint, Settings(batch_size=4, max_new_tokens=6), readouts="all")
    items = [ImagePrompts(engine.features(image), [engine.prompt(q) for q in QUESTIONS[:3]]) for image in IMAGES]
    assert len({item.features.shape[0] for item in items}) >= 3
    for i, answers in enumerate(engine.run_images(items)):
        for q, answer in zip(QUESTIONS[:3], answers):
            first, candidates = answer.first_token_id, answer.candidate_logits
            logits, generated, _ = oracle[i, q]
            worst, _ = worst_difference(candidates, logits)
            assert worst <= 1e-4 and first == generated[0], f"image {i} {q!r}"


def test_continuation_matches_generate(checkpoint, oracle):
    engine = Engine.load(checkpoint, Settings(max_new_tokens=4), readouts="string_parse")
    for i, image in enumerate(IMAGES[:3]):
        for answer in engine.score(image, QUESTIONS[:3]):
            _, generated, _ = oracle[i, answer.question]
            assert answer.decoded == generated_text(engine, generated)


def test_pad_aspect_is_refused(checkpoint):
    with pytest.raises(ValueError, match="LLaVA-NeXT tiles every image"):
        Engine.load(checkpoint, Settings(image_aspect="pad"))


def test_nf4_decisions_match_transformers_bnb(tmp_path):
    """NF4 as transformers quantizes LLaVA-NeXT (LM, projector and tower Linears; image_newline stays
    fp16), against transformers + bitsandbytes on CPU (see test_engine_nf4 for the two CPU caveats)."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    checkpoint = make_tiny_llava_next(tmp_path / "ckpt", vision_hidden=64, seed=5)
    model = bnb_nf4_oracle(LlavaNextForConditionalGeneration, checkpoint)
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    engine = Engine.load(checkpoint, Settings(quant="nf4", dtype="fp16", max_new_tokens=6), readouts="all")
    assert torch.equal(engine.model.newline, model.model.image_newline.data)
    for image in IMAGES[:3]:
        for answer in engine.score(image, QUESTIONS[:3]):
            inputs = processor(images=image, text=engine.prompt(answer.question), return_tensors="pt")
            inputs["pixel_values"] = inputs["pixel_values"].half()
            with torch.no_grad():
                theirs = model(**inputs).logits[0, -1].float()
            assert_matches_nf4_oracle(engine, answer, theirs)
