"""Attention interventions (Intervention.image_attention) against transformers' eager attention with
the same edit added to its scores, through transformers' attention interface."""
import math

import pytest
import torch
from tinymodels import (QUESTIONS, edited_eager_attention, make_tiny_llava, synthetic_image,
                        worst_difference)

from pope_fast.engine import (AttentionEdit, Engine, ImageAttentionAmplification,
                              ImageAttentionTemperature, ImagePrompts,
                              Intervention, PAIAttention, Settings)

pytestmark = pytest.mark.slow  # the engine on tiny checkpoints, against transformers

IMAGES = [synthetic_image(i + 61, size) for i, size in enumerate([(90, 40), (60, 60)])]


class PerHead(Intervention):
    """A different (scale, bias) per head in layer 1 only, to catch head and layer mix-ups."""

    def image_attention(self, layer):
        if layer != 1:
            return None
        return AttentionEdit(torch.tensor([1.0, 0.5, 2.0, 1.0]),
                             torch.tensor([0.7, 0.0, -0.3, -math.inf]))


class AnswerOnlyPerHead(Intervention):
    """Every term per head, from the answer position only, in layer 0 only."""

    def image_attention(self, layer):
        if layer != 0:
            return None
        return AttentionEdit(torch.tensor([1.0, 0.5, 2.0, 1.0]),
                             torch.tensor([0.2, 0.0, -0.3, 0.0]),
                             torch.tensor([0.0, 0.4, 0.1, 0.8]), answer_only=True)


EDITS = {"amplify": ImageAttentionAmplification(2.5, (0, 1)),
         "temperature": ImageAttentionTemperature(0.5, (1, 1)),
         "per-head": PerHead(), "pai": PAIAttention(0.6, (0, 1)),
         "answer-only-per-head": AnswerOnlyPerHead()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("edit_llava") / "ckpt")


@pytest.fixture(scope="module")
def oracles():
    """Each edit's oracle on the prompts, computed once for the engine settings that share them."""
    return {}


def _oracle(checkpoint, intervention, prompts):
    """transformers' LLaVA, eager attention with the edit applied to the image keys' scores of every
    query after the image: answer-position logits and image attention [L, H] per (image, prompt)."""
    from transformers import AttentionInterface, AutoProcessor, LlavaForConditionalGeneration

    state = {}

    def edit_scores(module, scores):
        # the vision tower's attention is left alone
        language = type(module).__name__ == "LlamaAttention"
        edit = intervention.image_attention(module.layer_idx) if language else None
        if edit is None:
            return scores
        if not isinstance(edit, AttentionEdit):
            edit = AttentionEdit(*edit)
        heads = scores.shape[1]
        scale, bias, magnitude = (
            torch.as_tensor(t, dtype=torch.float32).expand(heads).view(1, heads, 1, 1)
            for t in (edit.scale, edit.bias, edit.magnitude))
        image = state["image"]  # [S] image key positions
        queries = torch.arange(scores.shape[2])
        # every query after the image, or (answer_only) the last one, PAI's
        # attn_weights[:, :, -1, image]
        after = queries == scores.shape[2] - 1 if edit.answer_only \
            else queries > int(torch.nonzero(image).max())
        where = after[None, None, :, None] & image[None, None, None, :]
        return torch.where(where, scores * scale + bias + magnitude * scores.abs(), scores)

    edited = edited_eager_attention(edit_scores)
    AttentionInterface.register("pope_fast_edit", edited)
    model = LlavaForConditionalGeneration.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="pope_fast_edit").eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    out = {}
    for i, image in enumerate(IMAGES):
        for prompt in prompts:
            inputs = processor(images=image, text=prompt, return_tensors="pt")
            state["image"] = inputs["input_ids"][0] == model.config.image_token_id
            with torch.no_grad():
                result = model(**inputs, output_attentions=True)
            attention = torch.stack([a[0, :, -1, state["image"]].sum(-1)
                                     for a in result.attentions])
            out[i, prompt] = (result.logits[0, -1], attention)
    return out


@pytest.mark.parametrize("name", list(EDITS))
@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 2), (False, 3)],
                         ids=["reuse-b2", "whole-b3"])
def test_edit_matches_transformers_with_the_same_edit(checkpoint, oracles, name, prefix_reuse,
                                                      batch_size):
    intervention = EDITS[name]
    engine = Engine.load(checkpoint, Settings(prefix_reuse=prefix_reuse, batch_size=batch_size,
                                              probe="image-attention"),
                         readouts="template_aware,legacy_2tok")
    prompts = [engine.prompt(q) for q in QUESTIONS[:3]]
    if (name, *prompts) not in oracles:
        oracles[name, *prompts] = _oracle(checkpoint, intervention, prompts)
    oracle = oracles[name, *prompts]
    plain = engine.run_images([ImagePrompts(engine.features(image), prompts) for image in IMAGES])
    edited = engine.run_images([ImagePrompts(engine.features(image), prompts) for image in IMAGES],
                               intervention)
    moved = 0.0
    for i in range(len(IMAGES)):
        for prompt, ours, before in zip(prompts, edited[i], plain[i]):
            logits, attention = oracle[i, prompt]
            worst, at = worst_difference(ours.candidate_logits, logits)
            assert worst <= 1e-4, f"{name} image {i}: id {at} off by {worst:.2e}"
            assert ours.first_token_id == int(logits.argmax())
            probe = torch.tensor(ours.probe["image_attention_heads"])
            # the probe sees the edited attention
            assert float((probe - attention).abs().max()) <= 1e-5, name
            moved = max(moved,
                        max(abs(ours.candidate_logits[k] - v)
                            for k, v in before.candidate_logits.items()))
    # the edit changes the answer logits: a real check, not a no-op compared with itself
    assert moved > 1e-3


def test_identity_edit_is_a_no_op_bit_for_bit(checkpoint):
    engine = Engine.load(checkpoint, Settings(batch_size=3, max_new_tokens=3), readouts="all")
    prompts = [engine.prompt(q) for q in QUESTIONS[:3]]
    items = [ImagePrompts(engine.features(image), prompts) for image in IMAGES]
    plain = engine.run_images(items)
    for identity in (ImageAttentionAmplification(1.0, (0, 1)),
                     ImageAttentionTemperature(1.0, (0, 1))):
        assert engine.run_images(items, identity) == plain


def test_masking_every_image_key_makes_the_answer_independent_of_the_image(checkpoint):
    class Blind(Intervention):
        def image_attention(self, layer):
            return AttentionEdit(bias=-math.inf)

    for reuse in (True, False):
        engine = Engine.load(checkpoint, Settings(prefix_reuse=reuse, max_new_tokens=3),
                             readouts="all")
        prompts = [engine.prompt(q) for q in QUESTIONS[:2]]
        first, second = (engine.run_images([ImagePrompts(engine.features(image), prompts)],
                                           Blind())[0] for image in IMAGES)
        seen = [engine.run_images([ImagePrompts(engine.features(image), prompts)])[0]
                for image in IMAGES]
        for a, b in zip(first, second):
            assert (a.candidate_logits == pytest.approx(b.candidate_logits, abs=1e-5)
                    and a.decoded == b.decoded)
        # unmasked, the two images give different answers: the masking is what makes them equal
        assert seen[0][0].candidate_logits != pytest.approx(seen[1][0].candidate_logits, abs=1e-5)


def test_a_magnitude_edit_must_be_answer_only(checkpoint):
    class Everywhere(Intervention):
        def image_attention(self, layer):
            return AttentionEdit(magnitude=0.2)

    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    with pytest.raises(ValueError, match="layer 0: an attention edit with a magnitude term"):
        engine.answer(IMAGES[0], QUESTIONS[:1], Everywhere())


def test_an_edit_that_is_not_an_attention_edit_is_refused_naming_the_method(checkpoint):
    class Tuple(Intervention):
        def image_attention(self, layer):
            return 1.0, 0.5

    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    with pytest.raises(TypeError,
                       match=r"Tuple.image_attention\(0\) returned tuple; return an AttentionEdit"):
        engine.answer(IMAGES[0], QUESTIONS[:1], Tuple())


def test_pai_attention_default_layers_are_2_to_the_last():
    pai = PAIAttention(num_layers=32)
    assert [layer for layer in range(32)
            if pai.image_attention(layer) is not None] == list(range(2, 32))
    assert pai.image_attention(5) == AttentionEdit(magnitude=0.2, answer_only=True)
