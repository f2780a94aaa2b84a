"""InternVL3 (-hf) against transformers' InternVLForConditionalGeneration, the oracle, on a tiny random
checkpoint whose tiles are 56 px (4 x 4 InternViT patches, 2 x 2 = 4 tokens per tile after the pixel shuffle) and
whose processor cuts up to 6 tiles (tinymodels.make_tiny_internvl), so that one-tile images (no thumbnail), wide
and tall grids and the tie-break towards more tiles appear at small image sizes, each image with its own tile
count. InternVLProcessor cannot be built without torchvision; the oracle's prompt ids come from the family's
reference processor (the image processor under crop_to_patches and the processor's own replace_image_token), and
the oracle model itself refuses a wrong image-token count."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from familychecks import (assert_continuations_match, assert_probe_matches_eager, assert_run_matches,
                          assert_scores_match, image_items, processor_inputs, processor_oracle)
from tinymodels import (QUESTIONS, assert_matches_nf4_oracle, bnb_nf4_oracle, make_tiny_internvl, synthetic_image,
                        worst_difference)

from pope_fast.engine import Counts, Engine, Settings
from pope_fast.engine.models import family_class, protocol_for

# (width, height) → tiles: 2 x 1 + thumbnail, 1 x 3 + thumbnail, square 2 x 2 (the tie with 1 x 1 goes to more
# tiles for an image this large) + thumbnail, one tile, 5 x 1 + thumbnail, 3 x 2 + thumbnail
SIZES = [(200, 100), (100, 300), (120, 120), (56, 56), (300, 60), (333, 251)]
TILES = [3, 4, 5, 1, 6, 7]
IMAGES = [synthetic_image(i + 21, size) for i, size in enumerate(SIZES)]
INTERNVL = family_class("internvl")
PER_TILE = 4  # (56 / 14 * 0.5)²


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_internvl(tmp_path_factory.mktemp("tiny_internvl") / "ckpt")


def _oracle(checkpoint: Path, prompt, images, questions, new_tokens: int = 4) -> dict:
    from transformers import InternVLForConditionalGeneration

    processor = INTERNVL.reference_processor(checkpoint)
    return processor_oracle(InternVLForConditionalGeneration, checkpoint, processor, prompt, images,
                            questions, new_tokens)


@pytest.fixture(scope="module")
def oracle(checkpoint):
    """transformers' answer-position logits, greedy continuation and prompt ids per (image, question), on the
    engine's own default prompt."""
    engine = Engine.load(checkpoint, Settings())
    return _oracle(checkpoint, engine.prompt, IMAGES, QUESTIONS[:3])


@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 1), (True, 2), (True, 32), (False, 1), (False, 3)],
                         ids=["reuse-b1", "reuse-b2", "reuse-b32", "whole-b1", "whole-b3"])
def test_candidate_logits_match_transformers(checkpoint, oracle, prefix_reuse, batch_size):
    engine = Engine.load(checkpoint, Settings(batch_size=batch_size, prefix_reuse=prefix_reuse, max_new_tokens=6),
                         readouts="all")
    assert engine.template.name == "internvl_chat"
    for i, image in enumerate(IMAGES):
        features = engine.features(image)
        assert features.shape[0] == TILES[i] * PER_TILE, f"image {i}: {features.shape[0]} image tokens"
    assert_scores_match(engine, oracle, IMAGES, QUESTIONS[:3])


def test_prompt_ids_are_the_processors(checkpoint, oracle):
    """The engine's ids are InternVLProcessor's, token for token: '<img>', 256 (here 4) context tokens per tile,
    '</img>'; the shared prefix runs to the last context token, so it holds every tile of the image."""
    engine = Engine.load(checkpoint, Settings())
    model = engine.model
    start, end = (model.tokenizer.convert_tokens_to_ids(t) for t in ("<img>", "</img>"))
    for i, image in enumerate(IMAGES):
        layout = model.layout(engine.prompt(QUESTIONS[0]), engine.features(image))
        theirs = oracle[i, QUESTIONS[0]][2]
        assert list(layout.ids) == theirs
        (a, b), = layout.image_spans
        assert b - a == TILES[i] * PER_TILE and theirs[a - 1] == start and theirs[b] == end
        assert layout.prefix_cut == b


def test_images_of_different_tile_counts_in_one_batch(checkpoint, oracle):
    """A batch whose images have different prefix lengths, and whose question rows span images."""
    engine = Engine.load(checkpoint, Settings(batch_size=4, max_new_tokens=6), readouts="all")
    items = image_items(engine, IMAGES, QUESTIONS[:3])
    assert len({item.features.shape[0] for item in items}) == len(IMAGES)
    assert_run_matches(engine, oracle, items, QUESTIONS[:3])


@pytest.mark.parametrize("prefix_reuse", [True, False], ids=["reuse", "whole"])
def test_continuation_matches_generate(checkpoint, oracle, prefix_reuse):
    engine = Engine.load(checkpoint, Settings(max_new_tokens=4, prefix_reuse=prefix_reuse, batch_size=2),
                         readouts="string_parse")
    assert_continuations_match(engine, oracle, IMAGES, QUESTIONS[:3])


def test_pixels_match_the_image_processor(checkpoint):
    """The fast tiling path (in use) gives the processor's tiles bit for bit under crop_to_patches (as
    InternVLProcessor calls it): every tile of the best grid row by row, then the thumbnail, for every grid."""
    from transformers import AutoImageProcessor

    engine = Engine.load(checkpoint, Settings())
    assert engine.model._fast_pixels is not None
    processor = AutoImageProcessor.from_pretrained(str(checkpoint))
    for image, tiles in zip(IMAGES + [synthetic_image(5, (333, 251)).convert("RGBA")], TILES + [7]):
        ours = engine.model.preprocess(image)
        out = processor(images=image, crop_to_patches=True, return_tensors="np")
        assert ours.dtype == np.float32 and ours.shape == (tiles, 3, 56, 56), image.size
        assert np.array_equal(ours, out["pixel_values"]) and list(out["num_patches"]) == [tiles], image.size


def test_a_lower_feature_layer_cuts_the_tower(tmp_path):
    """vision_feature_layer -2 (hidden_states[-2]: the tower without its last layer) matches the oracle, and
    differs from the last layer's features."""
    checkpoint = make_tiny_internvl(tmp_path / "ckpt", seed=6, feature_layer=-2)
    engine = Engine.load(checkpoint, Settings(), readouts="all")
    assert len(engine.model.vision.encoder.layer) == 1
    oracle = _oracle(checkpoint, engine.prompt, IMAGES[:1], QUESTIONS[:2], new_tokens=1)
    for answer in engine.score(IMAGES[0], QUESTIONS[:2]):
        logits, _, _ = oracle[0, answer.question]
        worst, at = worst_difference(answer.candidate_logits, logits)
        assert worst <= 1e-4 and answer.first_token_id == int(logits.argmax()), (answer.question, at, worst)


def test_tied_embeddings_read_the_logits_off_the_embedding(tmp_path):
    """A checkpoint without lm_head (InternVL3-1B/2B tie it) loads and matches the oracle."""
    checkpoint = make_tiny_internvl(tmp_path / "ckpt", seed=3, tied=True)
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(k.endswith("embed_tokens.weight") for k in names) and not any("lm_head" in k for k in names)
    engine = Engine.load(checkpoint, Settings(), readouts="all")
    oracle = _oracle(checkpoint, engine.prompt, IMAGES[3:4], QUESTIONS[:2], new_tokens=1)
    for answer in engine.score(IMAGES[3], QUESTIONS[:2]):
        logits, _, _ = oracle[0, answer.question]
        worst, at = worst_difference(answer.candidate_logits, logits)
        assert worst <= 1e-4 and answer.first_token_id == int(logits.argmax()), (answer.question, at, worst)


def test_a_stored_head_under_a_tied_config_is_refused(checkpoint, tmp_path):
    """A config.json without top-level tie_word_embeddings reads as tied (InternVLConfig's default), and transformers
    5 would drop a stored lm_head: the loader says so instead of choosing a head."""
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("tie_word_embeddings", None)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="ties lm_head to the embeddings .* stores an lm_head"):
        Engine.load(folder, Settings())


def _real_tokenizer(shared):
    from transformers import AutoTokenizer

    folder = shared / "tokenizers/internvl3/internvl3-8b-hf"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    return AutoTokenizer.from_pretrained(str(folder))


def test_real_tokenizer_renders_the_chat_template(shared, checkpoint):
    """With InternVL3-8B-hf's tokenizer, the default prompt is its chat template over [image, question + suffix]
    (the image as '<IMG_CONTEXT>\\n', no system turn), Yes/No are bare single tokens, and the image tokens carry the
    config's ids."""
    tokenizer = _real_tokenizer(shared)
    engine = Engine.load(checkpoint, Settings())
    question = QUESTIONS[0] + " Answer yes or no only."
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert engine.prompt(QUESTIONS[0]) == expected == (f"<|im_start|>user\n<IMG_CONTEXT>\n{question}<|im_end|>\n"
                                                       "<|im_start|>assistant\n")
    model = engine.model
    assert model.tokenizer.encode("Yes", add_special_tokens=False) == [9454]
    assert model.tokenizer.encode("No", add_special_tokens=False) == [2753]
    assert model.image_token_id == 151667 and model.stop_ids == {151645}
    assert [model.tokenizer.convert_tokens_to_ids(t) for t in ("<img>", "</img>")] == [151665, 151666]


def test_lmms_eval_prompt_is_its_chat_template_rendering(shared, checkpoint):
    """lmms-eval's internvl_hf renders the task's [image, question + post_prompt] message with the processor's chat
    template: the template lmms_eval_internvl_hf is that rendering, and it runs as the oracle does."""
    from pope_fast.readout import get_template

    tokenizer = _real_tokenizer(shared)
    text = QUESTIONS[0] + "\nAnswer the question using a single word or phrase."
    messages = [{"role": "user", "content": [{"type": "image", "url": None}, {"type": "text", "text": text}]}]
    theirs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert get_template("lmms_eval_internvl_hf").render(QUESTIONS[0], tokenizer) == theirs
    engine = Engine.load(checkpoint, Settings(), template="lmms_eval_internvl_hf", readouts="all")
    oracle = _oracle(checkpoint, engine.prompt, IMAGES[2:3], QUESTIONS[:1], new_tokens=1)
    answer = engine.score(IMAGES[2], QUESTIONS[:1])[0]
    logits, _, _ = oracle[0, QUESTIONS[0]]
    worst, at = worst_difference(answer.candidate_logits, logits)
    assert worst <= 1e-4 and answer.first_token_id == int(logits.argmax()), (at, worst)


def test_builtin_tokenizer_stands_in(tmp_path):
    """Without ../shared the built-in Qwen2 stand-in carries <img>, </img>, <IMG_CONTEXT> and InternVL's template
    shape, and the checkpoint still matches the oracle."""
    checkpoint = make_tiny_internvl(tmp_path / "ckpt", seed=4, builtin_tokenizer=True)
    engine = Engine.load(checkpoint, Settings(), readouts="all")
    assert engine.prompt(QUESTIONS[0]).startswith("<|im_start|>user\n<IMG_CONTEXT>\nIs there a dog")
    oracle = _oracle(checkpoint, engine.prompt, IMAGES[1:2], QUESTIONS[:1], new_tokens=1)
    answer = engine.score(IMAGES[1], QUESTIONS[:1])[0]
    logits, _, ids = oracle[0, QUESTIONS[0]]
    worst, at = worst_difference(answer.candidate_logits, logits)
    assert worst <= 1e-4 and answer.first_token_id == int(logits.argmax()), (at, worst)
    assert ids.count(engine.model.image_token_id) == TILES[1] * PER_TILE


def test_pad_aspect_is_refused(checkpoint):
    with pytest.raises(ValueError, match="InternVL3 tiles every image"):
        Engine.load(checkpoint, Settings(image_aspect="pad"))


def test_protocols(checkpoint):
    assert protocol_for(checkpoint, "paper").template == "internvl_chat"
    lmms = protocol_for(checkpoint, "lmms-eval")
    assert (lmms.template, lmms.new_tokens) == ("lmms_eval_internvl_hf", 128)
    for name in ("vlmevalkit", "llava"):
        with pytest.raises(ValueError, match=f"protocol {name} does not cover InternVL3"):
            protocol_for(checkpoint, name)


def test_flop_floor_counts_the_internvit_tower(checkpoint):
    """Linear in the work, the vision side a real share: per token it reads (patches + class token per tile), the
    tower's layers and patch embedding; per tile, the projector over its shuffled features."""
    engine = Engine.load(checkpoint, Settings())
    model = engine.model
    pixels = model.preprocess(IMAGES[0])
    assert model.vision_tokens(pixels) == TILES[0] * 17
    once = Counts(images_encoded=1, vision_tokens=model.vision_tokens(pixels), prompts=3, prefix_tokens=12,
                  suffix_tokens=9)
    twice = Counts(images_encoded=2, vision_tokens=2 * once.vision_tokens, prompts=6, prefix_tokens=24,
                   suffix_tokens=18)
    assert model.matmul_flops(twice) == 2 * model.matmul_flops(once) > model.vision_flops(once) > 0
    d, h = 32, 64  # the tiny tower's and language model's widths
    per_token = 2 * 2 * (4 * d * d + 2 * d * 64) + 2 * 3 * 14 * 14 * d
    per_tile = PER_TILE * 2 * (4 * d * h + h * h)
    assert model.vision_flops(Counts(vision_tokens=2 * 17)) == 2 * 17 * per_token + 2 * per_tile


def test_nf4_decisions_match_transformers_bnb(tmp_path):
    """NF4 as transformers quantizes InternVL3 (the LM's, projector's and InternViT's Linears; the projector's
    LayerNorm, the layer scales and the patch embedding stay fp16), against transformers + bitsandbytes on CPU
    (see engine/test_engine_nf4 for the two CPU caveats), on a one-tile image and a many-tile one."""
    from transformers import InternVLForConditionalGeneration

    checkpoint = make_tiny_internvl(tmp_path / "ckpt", vision_hidden=64, seed=5)
    model = bnb_nf4_oracle(InternVLForConditionalGeneration, checkpoint)
    processor = INTERNVL.reference_processor(checkpoint)
    engine = Engine.load(checkpoint, Settings(quant="nf4", dtype="fp16", max_new_tokens=6), readouts="all")
    assert torch.equal(engine.model.projector_norm[0], model.model.multi_modal_projector.layer_norm.weight.data)
    for image in (IMAGES[3], IMAGES[5]):
        for answer in engine.score(image, QUESTIONS[:3]):
            inputs = processor(images=image, text=engine.prompt(answer.question), return_tensors="pt")
            inputs["pixel_values"] = inputs["pixel_values"].half()
            with torch.no_grad():
                theirs = model(**inputs).logits[0, -1].float()
            assert_matches_nf4_oracle(engine, answer, theirs)


@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 1), (False, 2)], ids=["reuse-b1", "whole-b2"])
def test_probe_equals_eager_attention_on_the_image_span(checkpoint, prefix_reuse, batch_size):
    """The image-attention probe at the answer position, per layer and head, against transformers' eager
    attention over the context tokens (not <img> / </img>), on a one-tile image and a many-tile one."""
    from transformers import InternVLForConditionalGeneration

    model = InternVLForConditionalGeneration.from_pretrained(str(checkpoint), dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    processor = INTERNVL.reference_processor(checkpoint)
    engine = Engine.load(checkpoint, Settings(probe="image-attention", prefix_reuse=prefix_reuse,
                                              batch_size=batch_size), readouts="template_aware")
    images = [IMAGES[5], IMAGES[3]]
    inputs_of = processor_inputs(processor)
    assert_probe_matches_eager(engine, model, inputs_of, images, QUESTIONS[:2])


def test_every_method_matches_its_formula_on_transformers(checkpoint):
    """VCD, PAI and ICD as test_methods checks them on LLaVA, here over dynamic tiles (noise on every tile and the
    thumbnail), the chat template (ICD's instruction as a system turn) and the text-only prompt without the image."""
    from test_methods import _check_methods, _oracle
    from transformers import InternVLForConditionalGeneration

    def inputs_of(folder):
        processor = INTERNVL.reference_processor(folder)
        return lambda image, prompt: dict(processor(images=image, text=prompt, return_tensors="pt"))

    oracle = _oracle(checkpoint, InternVLForConditionalGeneration, inputs_of)
    _check_methods(Engine.load(checkpoint, Settings(batch_size=2), readouts="template_aware"), oracle)
