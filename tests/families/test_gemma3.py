"""Gemma 3's quirks against transformers' Gemma3ForConditionalGeneration, the oracle (its battery is
test_battery's gemma3 cases), on a tiny random checkpoint (tinymodels.make_tiny_gemma3: 64-px images
pooled to 16 image tokens; four layers, local, local, global, local, with two RoPE bases, the global
one linearly scaled; head_dim 32 against a query_pre_attn_scalar of 24; every (1 + w) norm weight
drawn). The oracle's inputs are Gemma3Processor's (token_type_ids included, which turn on its
bidirectional image mask); the tokenizer is gemma-3-4b-it's from ../shared, or the built-in stand-in
at Gemma's ids where that is absent (the tests that need the real one skip)."""
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from familychecks import (assert_continuations_match, assert_scores_match, edited_checkpoint,
                          generated_text, transformers_oracle)
from registry import REGISTRY
from tinymodels import (QUESTIONS, SHARED_GEMMA3_TOKENIZER, make_tiny_gemma3, synthetic_image,
                        worst_difference)

from pope_fast.engine import Engine, Settings
from pope_fast.engine.utils.loader import CheckpointError
from pope_fast.coverage import protocol_for
from pope_fast.engine.models import family_class

FAMILY = "gemma3"  # whose checkpoint, model and oracle tests/families/conftest.py gives
# Every test here loads the 262k-row model at least (several seconds on 2 cores) or runs it.
pytestmark = pytest.mark.slow
IMAGES = REGISTRY[FAMILY].images
GEMMA3 = family_class(FAMILY)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The same shapes on gemma-3-4b-it's own tokenizer, for what that tokenizer renders: the
    checkpoint, its engine and Gemma3Processor, each loaded once (the tokenizer takes seconds to
    load on 2 cores)."""
    if not SHARED_GEMMA3_TOKENIZER.is_dir():
        pytest.skip(f"{SHARED_GEMMA3_TOKENIZER} is absent (the Gemma tokenizer is not bundled)")
    from transformers import AutoProcessor

    checkpoint = make_tiny_gemma3(tmp_path_factory.mktemp("gemma3_real") / "ckpt")
    return SimpleNamespace(checkpoint=checkpoint, engine=Engine.load(checkpoint, Settings()),
                           processor=AutoProcessor.from_pretrained(str(checkpoint)))


def _model(checkpoint: Path, **kwargs):
    from transformers import Gemma3ForConditionalGeneration

    return Gemma3ForConditionalGeneration.from_pretrained(str(checkpoint), dtype=torch.float32,
                                                          **kwargs).eval()


def _oracle(checkpoint: Path, prompt, images, questions, new_tokens: int = 4,
            causal: bool = False) -> dict:
    """familychecks' oracle of Gemma3ForConditionalGeneration; with causal, without token_type_ids
    (so without the bidirectional image mask: what a causal-only prefix would compute)."""
    processor = GEMMA3.reference_processor(checkpoint)

    def inputs_of(image, text):
        inputs = processor(images=image, text=text, return_tensors="pt")
        if causal:
            del inputs["token_type_ids"]
        return inputs

    return transformers_oracle(_model(checkpoint), inputs_of, prompt, images, questions, new_tokens)


def test_features_are_sixteen_pooled_tokens(checkpoint):
    engine = Engine.load(checkpoint, Settings())
    assert all(engine.features(image).shape == (16, 64) for image in IMAGES)


def test_the_oracle_continues_differently(oracle):
    """The continuation check (test_battery) compares more than one continuation: not one thing to
    everything."""
    assert len({tuple(generated) for _, generated, _ in oracle.values()}) > 1


def test_the_image_attends_both_ways_unless_image_mask_is_causal(checkpoint, oracle):
    """The bidirectional image mask matters, and Settings.image_mask 'causal' (VLMEvalKit's flash
    attention) drops it exactly: the engine so set is transformers without token_type_ids (a
    causal-only prefix) on both paths, logits and continuations, and far from the model's own mask
    (matched above)."""
    prompt = Engine.load(checkpoint, Settings()).prompt
    causal = _oracle(checkpoint, prompt, IMAGES[:2], QUESTIONS[:2], new_tokens=3, causal=True)
    for reuse in (True, False):
        engine = Engine.load(checkpoint,
                             Settings(prefix_reuse=reuse, image_mask="causal", max_new_tokens=3),
                             readouts="all")
        assert not engine.model.lm.dims.image_bidirectional
        assert_scores_match(engine, causal, IMAGES[:2], QUESTIONS[:2])
        assert_continuations_match(engine, causal, IMAGES[:2], QUESTIONS[:2])
        for answer in engine.answer(IMAGES[0], QUESTIONS[:2]):
            assert worst_difference(answer.candidate_logits,
                                    oracle[0, answer.question][0])[0] > 1e-2


def test_attention_scale_and_norms_are_gemmas(checkpoint, oracle):
    """query_pre_attn_scalar (24, not head_dim 32) scales the attention: the engine at
    head_dim**-0.5 differs."""
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1), readouts="all")
    assert engine.model.q_scale == pytest.approx((32 / 24) ** 0.5)
    for layer in engine.model.lm.layers:
        layer.q_scale = 1.0
    answer = engine.answer(IMAGES[0], QUESTIONS[:1])[0]
    assert worst_difference(answer.candidate_logits, oracle[0, QUESTIONS[0]][0])[0] > 1e-2


def test_tied_lm_head_is_the_embedding(checkpoint):
    """The published checkpoints store no lm_head: the logits are read off the (unscaled) embedding
    matrix."""
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(k.endswith("embed_tokens.weight") for k in names) \
        and not any("lm_head" in k for k in names)
    lm = Engine.load(checkpoint, Settings()).model.lm
    assert torch.equal(lm.lm_head.weight, lm.embed_tokens) \
        and lm.lm_head.weight.shape == (262208, 64)


def test_layout_is_the_processors(real):
    """With gemma-3-4b-it's tokenizer, the engine's prompt ids are Gemma3Processor's (the image
    sequence expanded, no second <bos>), the prefix runs through the last image soft token, and only
    the soft tokens are image slots (token_type_ids 1)."""
    engine, processor = real.engine, real.processor
    model = engine.model
    for q in QUESTIONS[:3]:
        prompt = engine.prompt(q)
        # as the family's reference pipeline calls it: the chat template wrote <bos> already
        inputs = processor(images=IMAGES[0], text=prompt, return_tensors="pt",
                           add_special_tokens=False)
        layout = model.layout(prompt, engine.features(IMAGES[0]))
        assert list(layout.ids) == inputs["input_ids"][0].tolist()
        assert layout.ids.count(model.tokenizer.bos_token_id) == 1
        slots = [i for i, t in enumerate(layout.ids) if t == model.image_token_id]
        assert slots == torch.nonzero(inputs["token_type_ids"][0]).flatten().tolist() \
            and len(slots) == 16
        assert layout.image_spans == ((slots[0], slots[-1] + 1),) \
            and layout.prefix_cut == slots[-1] + 1
        assert layout.ids[slots[0] - 1] == 255999 and layout.ids[slots[-1] + 1] == 256000
    with pytest.raises(ValueError, match="exactly one <start_of_image>"):
        model.layout("no image here", engine.features(IMAGES[0]))


def test_real_tokenizer_renders_the_chat_template(real):
    """With gemma-3-4b-it's tokenizer: the default prompt is its chat template's rendering, the
    processor's own apply_chat_template gives the engine's ids, and Yes/No are the bare 10784 /
    3771."""
    engine, processor = real.engine, real.processor
    question = QUESTIONS[0] + " Answer yes or no only."
    assert engine.prompt(QUESTIONS[0]) \
        == (f"<bos><start_of_turn>user\n<start_of_image>{question}<end_of_turn>\n"
            "<start_of_turn>model\n")
    content = [{"type": "image", "image": IMAGES[0]}, {"type": "text", "text": question}]
    ids = processor.apply_chat_template([{"role": "user", "content": content}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    ids = ids[0] if isinstance(ids[0], list) else ids
    assert list(engine.model.layout(engine.prompt(QUESTIONS[0]), engine.features(IMAGES[0])).ids) \
        == list(ids)
    tokenizer = engine.model.tokenizer
    assert tokenizer.encode("Yes", add_special_tokens=False) == [10784]
    assert tokenizer.encode("No", add_special_tokens=False) == [3771]
    assert engine.model.image_token_id == 262144 and 106 in engine.model.stop_ids


def test_lmms_eval_padding_changes_no_logit(real):
    """lmms-eval's gemma3 class pads every prompt to its max_length of 2048 (models/simple/gemma3.py
    l.79, l.271: padding="max_length", pad_to_multiple_of=8), on the tokenizer's side, which
    gemma-3-4b-it's sets left: the pads are masked and the positions follow the mask, so generate's
    logits are the unpadded prompt's to rounding, its tokens the same; the engine's unpadded run is
    lmms-eval's."""
    model = _model(real.checkpoint)
    assert real.processor.tokenizer.padding_side == "left"
    question = QUESTIONS[0] + "\nAnswer the question using a single word or phrase."
    messages = [[{"role": "system",
                  "content": [{"type": "text", "text": "You are a helpful assistant."}]},
                 {"role": "user", "content": [{"type": "image", "image": IMAGES[0]},
                                              {"type": "text", "text": question}]}]]
    outs = []
    for padding in ({}, dict(padding="max_length", pad_to_multiple_of=8, max_length=2048)):
        inputs = real.processor.apply_chat_template(messages, add_generation_prompt=True,
                                                    tokenize=True, return_dict=True,
                                                    return_tensors="pt", **padding)
        with torch.no_grad():
            outs.append(model.generate(**inputs, max_new_tokens=4, do_sample=False,
                                       output_logits=True, return_dict_in_generate=True))
    unpadded, padded = outs
    assert padded.sequences.shape[1] == 2048 + 4 > unpadded.sequences.shape[1]
    assert padded.sequences[0, -4:].tolist() == unpadded.sequences[0, -4:].tolist()
    assert max(float((a - b).abs().max()) for a, b in zip(unpadded.logits, padded.logits)) <= 1e-4


def test_pixels_match_the_image_processor(checkpoint):
    """The NumPy path (in use) gives Gemma3ImageProcessor's pixels bit for bit, alpha and odd sizes
    included."""
    from transformers import AutoImageProcessor

    engine = Engine.load(checkpoint, Settings())
    assert engine.model._fast_pixels is not None
    processor = AutoImageProcessor.from_pretrained(str(checkpoint))
    assert type(processor).__name__ == "Gemma3ImageProcessorPil" and not processor.do_pan_and_scan
    for image in IMAGES + [synthetic_image(5, (333, 251)).convert("RGBA"),
                           synthetic_image(6, (17, 200))]:
        coded = engine.model.preprocess(image)
        assert coded.codes.dtype == np.uint8  # sent to the device as uint8, normalized there
        ours = np.asarray(coded)
        theirs = processor(images=image, return_tensors="np")["pixel_values"][0]
        assert ours.dtype == np.float32 and ours.shape == (3, 64, 64) \
            and np.array_equal(ours, theirs), image.size
    assert torch.equal(engine.model.encode_images([coded])[0],
                       engine.model.encode_images([ours])[0])


def _window_checkpoint(checkpoint: Path, tmp_path: Path, window: int) -> Path:
    return edited_checkpoint(checkpoint, tmp_path / f"window{window}",
                        lambda c: c["text_config"].update(sliding_window=window))


def test_prompts_past_the_sliding_window_attend_within_it(checkpoint, tmp_path):
    """transformers' sliding layers keep keys with q - k < window and AND that with OR(causal, same
    image run): with a 12-token window inside the 16-token image run (its tokens see their run's
    later tokens, the earlier ones within the window only) prompts answer as the oracle does, with a
    shared prefix (the questions reading only its last keys) and as whole prompts, beside a shorter
    question; the full window's logits differ, so the window is what is tested (the engine refused
    such prompts before)."""
    at = _window_checkpoint(checkpoint, tmp_path, 12)
    engines = {reuse: Engine.load(at, Settings(prefix_reuse=reuse),
                                  readouts="template_aware") for reuse in (1, 0)}
    questions, prompt = [QUESTIONS[0], "Is there a cat?"], engines[1].prompt
    full = _oracle(checkpoint, prompt, IMAGES[:1], questions[:1], new_tokens=1)[0, questions[0]][0]
    oracle = _oracle(at, prompt, IMAGES[:1], questions, new_tokens=1)
    assert float((oracle[0, questions[0]][0] - full).abs().max()) > 1e-4  # the window cuts keys off
    for reuse, engine in engines.items():
        for answer in engine.answer(IMAGES[0], questions):
            logits = oracle[0, answer.question][0]
            assert worst_difference(answer.candidate_logits, logits)[0] <= 1e-4, \
                (reuse, answer.question)
            assert answer.first_token_id == int(logits.argmax())


def test_a_continuation_past_the_sliding_window_attends_as_the_sliding_layers_do(checkpoint,
                                                                                 tmp_path):
    """A prompt 3 tokens inside the window takes all 12 new tokens (not cut at the window's 4): from
    the 5th on (read off a query `window` tokens in) the sliding layers drop the oldest keys, and
    the continuation is still generate's, alone and beside a shorter question (whose keys leave the
    window later), with and without a shared prefix; the windowed generate's scores differ from the
    full-attention one's there, so the window is what is tested."""
    probe = Engine.load(checkpoint, Settings())
    length = len(probe.model.layout(probe.prompt(QUESTIONS[0]), probe.features(IMAGES[0])))
    folder = _window_checkpoint(checkpoint, tmp_path, length + 3)
    short = "Is there a cat?"
    inputs = GEMMA3.reference_processor(folder)(images=IMAGES[0], text=probe.prompt(QUESTIONS[0]),
                                                return_tensors="pt")
    assert inputs["input_ids"].shape[1] == length
    runs = {}
    for name, at in (("windowed", folder), ("full", checkpoint)):
        with torch.no_grad():
            out = _model(at).generate(**inputs, max_new_tokens=12, do_sample=False,
                                      output_scores=True, return_dict_in_generate=True)
        runs[name] = out.sequences[0, length:].tolist(), torch.stack(out.scores)[:, 0]
    theirs, scores = runs["windowed"]
    assert len(theirs) == 12 and not set(theirs[:5]) & probe.model.stop_ids
    # within the window: full attention
    assert float((scores[:4] - runs["full"][1][:4]).abs().max()) <= 1e-5
    assert float((scores[4:] - runs["full"][1][4:]).abs().max()) > 1e-3
    for reuse in (True, False):
        engine = Engine.load(folder, Settings(max_new_tokens=12, prefix_reuse=reuse),
                             readouts="string_parse")
        for questions in ([QUESTIONS[0]], [QUESTIONS[0], short]):
            answer = engine.answer(IMAGES[0], questions)[0]
            # all 12, not 4
            assert answer.decoded == generated_text(engine, theirs), (reuse, questions)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["text_config"].update(final_logit_softcapping=30.0),
     "final_logit_softcapping is set"),
    (lambda c: c["text_config"].update(attn_logit_softcapping=50.0),
     "attn_logit_softcapping is set"),
    (lambda c: c["text_config"]["rope_parameters"]["full_attention"].update(rope_type="dynamic"),
     "full_attention rope_type 'dynamic' is not supported"),
], ids=["final-softcap", "attn-softcap", "rope-dynamic"])
def test_unsupported_configs_are_refused(checkpoint, tmp_path, edit, message):
    with pytest.raises(CheckpointError, match=message):
        Engine.load(edited_checkpoint(checkpoint, tmp_path / "edited", edit), Settings())


def test_pan_and_scan_is_refused(checkpoint, tmp_path):
    import shutil

    folder = tmp_path / "pas"
    shutil.copytree(checkpoint, folder, copy_function=os.link)
    path = folder / "processor_config.json"
    if not path.is_file():
        path = folder / "preprocessor_config.json"
    config = json.loads(path.read_text())
    (config.get("image_processor", config))["do_pan_and_scan"] = True
    path.unlink()  # a hard link to the checkpoint's own file: write a new one
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="do_pan_and_scan is on"):
        Engine.load(folder, Settings())


def test_protocols(real):
    """lmms-eval v0.7.2 models/simple/gemma3.py: a system message (l.242), then [image, question +
    POPE's post_prompt] (l.263-266) through the chat template, 128 new tokens, each image re-encoded
    as JPEG quality 85 (l.176-183), nothing left unreproduced; VLMEvalKit's Gemma3: its system
    prompt, the bare question, 4,096 new tokens, the image attending causally (its flash attention),
    nothing else left unreproduced; LLaVA's script refused, saying why."""
    from pope_fast.readout import get_template
    from pope_fast.readout.templates import SHORT_ANSWER

    # the tools' prompts as gemma-3-4b-it's own chat template renders them
    checkpoint = real.checkpoint
    assert protocol_for(checkpoint, "paper").template == "gemma3_chat"
    tokenizer = real.engine.model.tokenizer
    q = "Is there a dog in the image?"
    messages = [{"role": "system",
                 "content": [{"type": "text", "text": "You are a helpful assistant."}]},
                {"role": "user",
                 "content": [{"type": "image"}, {"type": "text", "text": q + SHORT_ANSWER}]}]
    coverage = protocol_for(checkpoint, "lmms-eval")
    theirs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert get_template(coverage.template).render(q, tokenizer) == theirs \
        and coverage.new_tokens == 128
    assert "You are a helpful assistant." in theirs and coverage.image_reencode == "jpeg85"
    # its padding changes no logit: test_lmms_eval_padding_changes_no_logit
    assert coverage.deviations == ()
    # VLMEvalKit e8e78f05 vlm/gemma.py: its system prompt (l.108), then [image, the bare question]
    # (l.116-129)
    vlmeval = [{"role": "system",
                "content": [{"type": "text", "text": "You are a helpful assistant. "}]},
               {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
    coverage = protocol_for(checkpoint, "vlmevalkit")
    theirs = tokenizer.apply_chat_template(vlmeval, add_generation_prompt=True, tokenize=False)
    assert get_template(coverage.template).render(q, tokenizer) == theirs \
        and coverage.new_tokens == 4096
    assert coverage.image_mask == "causal" and coverage.deviations == ()
    with pytest.raises(ValueError, match="protocol llava does not cover Gemma 3: .*LLaVA-1.5"):
        protocol_for(checkpoint, "llava")


def test_flop_floor(checkpoint):
    """Linear in the work; per patch the SigLIP layers and patch embedding, per pooled token the
    projection; the lm_head's argmax pass over all 262,208 rows per prompt."""
    from pope_fast.engine import Counts

    model = Engine.load(checkpoint, Settings()).model
    pixels = model.preprocess(IMAGES[0])
    assert model.vision_tokens(pixels) == 64
    once = Counts(images_encoded=1, vision_tokens=64, prompts=3, prefix_tokens=12, suffix_tokens=9)
    twice = Counts(images_encoded=2, vision_tokens=128, prompts=6, prefix_tokens=24,
                   suffix_tokens=18)
    assert model.matmul_flops(twice) == 2 * model.matmul_flops(once) > model.vision_flops(once) > 0
    d, h = 32, 64
    per_patch = 2 * 2 * (4 * d * d + 2 * d * 64) + 2 * 3 * 8 * 8 * d + 2 * d * h * 16 / 64
    assert model.vision_flops(Counts(vision_tokens=10)) == pytest.approx(10 * per_patch)
    assert model.matmul_flops(Counts(prompts=1)) == 2 * h * 262208


def test_builtin_tokenizer_stands_in(checkpoint):
    """Without ../shared (and in the registry's checkpoint, which the battery matches against the
    oracle), the built-in stand-in carries Gemma's special-token ids, Yes/No ids and turn format."""
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1), readouts="all")
    assert engine.prompt(QUESTIONS[0]).startswith("<bos><start_of_turn>user\n"
                                                  "<start_of_image>Is there a dog")
    tokenizer = engine.model.tokenizer
    # a placeholder row: not gemma-3-4b-it's
    assert tokenizer.convert_ids_to_tokens(200000) == "<unused200000>"
    tokens = ("<start_of_image>", "<end_of_image>", "<image_soft_token>", "Yes", "No")
    assert [tokenizer.convert_tokens_to_ids(t) for t in tokens] \
        == [255999, 256000, 262144, 10784, 3771]
