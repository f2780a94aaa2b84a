"""Gemma 4's quirks (the battery checks it against Gemma4ForConditionalGeneration): its soft tokens
against the class's own image path, that the battery's agreement tests the sliding window, what it
refuses."""

import pytest
import torch
from familychecks import edited_checkpoint
from registry import REGISTRY

from pope_fast.engine import Engine, Settings
from pope_fast.engine.models import family_class
from pope_fast.engine.utils.loader import CheckpointError

FAMILY = "gemma4"
IMAGES = REGISTRY[FAMILY].images
GEMMA4 = family_class(FAMILY)


@pytest.mark.slow
def test_soft_tokens_are_the_classes_and_vary_with_the_aspect(checkpoint, model):
    """The engine's features of each image are Gemma4Model.get_image_features' of the processor's
    patches, bit for bit in fp32, and the three aspect ratios give three soft-token counts (each its
    own prefix length)."""
    engine = Engine.load(checkpoint, Settings())
    process = GEMMA4.reference_processor(checkpoint)
    counts = set()
    for image in IMAGES:
        inputs = process(images=image, text=GEMMA4.image_marker, return_tensors="pt")
        with torch.no_grad():
            theirs = model.model.get_image_features(inputs["pixel_values"],
                                                    inputs["image_position_ids"]).pooler_output[0]
        ours = engine.features(image)
        assert torch.equal(ours, theirs)
        counts.add(ours.shape[0])
    assert len(counts) == len(IMAGES)


@pytest.mark.slow
def test_the_window_is_what_the_battery_tests(checkpoint, oracle, tmp_path):
    """Every tiny prompt outgrows the 24-token window: the class with the window widened past them
    answers otherwise, so the battery's agreement (logits, continuations) holds only for an engine
    that applies it to prompts."""
    from transformers import Gemma4ForConditionalGeneration

    wide = edited_checkpoint(checkpoint, tmp_path / "wide",
                             lambda c: c["text_config"].update(sliding_window=4096))
    question = REGISTRY[FAMILY].oracle_questions[0]
    logits, _, ids = oracle[0, question]
    assert len(ids) > 24 + 20  # the window lies inside the image's run of soft tokens
    model = Gemma4ForConditionalGeneration.from_pretrained(str(wide), dtype=torch.float32).eval()
    with torch.no_grad():
        processed = GEMMA4.reference_processor(wide)(images=IMAGES[0], text=GEMMA4.image_marker,
                                                      return_tensors="pt")
        types = (torch.tensor([ids]) == model.config.image_token_id).int()
        widened = model(input_ids=torch.tensor([ids]),
                        **{k: v for k, v in processed.items()
                           if k in ("pixel_values", "image_position_ids")},
                        mm_token_type_ids=types).logits[0, -1]
    assert float((widened - logits).abs().max()) > 1e-3


@pytest.mark.slow
def test_the_mixture_of_experts_is_the_classes(tmp_path):
    """The 26B-A4B's experts beside each dense MLP (4 experts, 2 a token, on the tiny's five
    layers): candidate logits within 1e-4 of Gemma4ForConditionalGeneration's and its argmax, where
    leaving the experts out moves them past that."""
    from transformers import Gemma4ForConditionalGeneration

    from pope_fast.engine.synthetic import Weights, write_checkpoint
    from pope_fast.engine.synthetic.gemma4 import SIZES

    moe = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)
    checkpoint = write_checkpoint("gemma4", tmp_path / "moe",
                                  {**SIZES["tiny"], "text": {**SIZES["tiny"]["text"], **moe}},
                                  weights=Weights("model", seed=4, std=0.08,
                                                  spread_ranks=(1, 2, 3)))
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    model = Gemma4ForConditionalGeneration.from_pretrained(str(checkpoint),
                                                           dtype=torch.float32).eval()
    process = GEMMA4.reference_processor(checkpoint)
    questions = REGISTRY[FAMILY].oracle_questions[:2]
    answers = engine.answer(IMAGES[0], questions)
    for answer, question in zip(answers, questions):
        with torch.no_grad():
            theirs = model(**process(images=IMAGES[0], text=engine.prompt(question),
                                     return_tensors="pt")).logits[0, -1]
        assert max(abs(v - float(theirs[i])) for i, v in answer.candidate_logits.items()) <= 1e-4
        assert answer.first_token_id == int(theirs.argmax())
    for layer in engine.model.lm.layers:
        layer.moe = None
    # the same weights without the experts
    without = engine.answer(IMAGES[0], questions[:1])[0].candidate_logits
    assert max(abs(without[i] - v) for i, v in answers[0].candidate_logits.items()) > 1e-3


@pytest.mark.parametrize("edit, message", [
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=6, moe_intermediate_size=16),
     "6 experts per token of 4: no such routing"),
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention 'all'"),
    (dict(num_kv_shared_layers=5), "num_kv_shared_layers 5 leaves no layer computing K/V"),
], ids=["moe-routing", "bidirectional-all", "all-shared"])
def test_what_the_engine_does_not_implement_is_refused_at_load(tmp_path, edit, message):
    """Refused from config.json alone, before the tokenizer or any weight is read (the folder holds
    nothing else)."""
    from transformers import Gemma4Config

    from pope_fast.engine.synthetic.gemma4 import TEXT_TINY, VISION_TINY

    Gemma4Config(text_config={**TEXT_TINY, **edit},
                 vision_config=VISION_TINY).save_pretrained(str(tmp_path))
    with pytest.raises(CheckpointError, match=message):
        Engine.load(tmp_path, Settings())
