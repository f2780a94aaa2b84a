"""LLaVA-OneVision's quirks against transformers' LlavaOnevisionForConditionalGeneration, the oracle
(its battery is test_battery's llava_onevision cases), on a tiny random checkpoint whose crops are
42 px (3 x 3 SigLIP patch features) and whose pinpoints reach a 4 x 4 grid
(tinymodels.ONEVISION_PINPOINTS), so that both unpad directions, one-crop grids and the anyres_max_9
interpolation (a grid of over 1.1² x 9 crops' features) appear at small image sizes.
LlavaOnevisionProcessor cannot be built without torchvision; the oracle's prompt ids come from the
family's reference processor (the image processor and the processor's own replace_image_token
count), and the oracle model itself refuses a wrong image-token count."""
import json

import numpy as np
from PIL import Image
import pytest
from familychecks import (assert_answer_matches, assert_first_answers_match, assert_flops_linear,
                          assert_protocols, processor_oracle)
from registry import REGISTRY
from tinymodels import QUESTIONS, make_tiny_llava_onevision, synthetic_image

from pope_fast.engine import Engine, Settings
from pope_fast.engine.models import family_class

FAMILY = "llava_onevision"  # whose checkpoint, model and oracle tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images
REDUCED = [0, 1]  # the images whose grid anyres_max_9 interpolates
ONEVISION = family_class(FAMILY)


@pytest.mark.slow
def test_max_crops_interpolation_is_what_the_oracle_counts(checkpoint, oracle):
    """The images of REDUCED are interpolated down (without anyres_max_9 their grids would be longer
    than the oracle's prompt), the others are not (a reduction that fired too early would shorten
    them)."""
    engine = Engine.load(checkpoint, Settings())
    model = engine.model
    reduced = [model.encode_images([model.preprocess(image)])[0].shape[0] for image in IMAGES]
    model.max_crops = 10**6
    unreduced = [model.encode_images([model.preprocess(image)])[0].shape[0] for image in IMAGES]
    for i in range(len(IMAGES)):
        assert reduced[i] == oracle[i, QUESTIONS[0]][2].count(model.image_token_id)
        assert (unreduced[i] > reduced[i]) == (i in REDUCED), (i, reduced[i], unreduced[i])


@pytest.mark.slow
def test_pixels_match_the_image_processor(checkpoint):
    """The fast anyres path (in use) gives the processor's crops and size bit for bit: base view
    first, every crop of the best pinpoint, for every shape of grid."""
    from transformers import AutoImageProcessor

    engine = Engine.load(checkpoint, Settings())
    assert engine.model._fast_pixels is not None
    processor = AutoImageProcessor.from_pretrained(str(checkpoint))
    for image in IMAGES + [synthetic_image(5, (333, 251)).convert("RGBA")]:
        crops, size = engine.model.preprocess(image)
        out = processor(images=image, return_tensors="np")
        assert crops.dtype == np.float32 \
            and np.array_equal(crops, out["pixel_values"][0]), image.size
        assert size == tuple(int(v) for v in out["image_sizes"][0]) == (image.height, image.width)


@pytest.mark.slow
def test_real_tokenizer_renders_the_processor_template(shared, checkpoint):
    """With the real tokenizer, the default prompt is llava-hf's processor template
    (chat_template.json) over [image, question + suffix], and Yes/No are its bare single tokens."""
    from transformers import AutoTokenizer

    folder = shared / "tokenizers/llava_onevision/llava-onevision-qwen2-7b-ov-hf"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    engine = Engine.load(checkpoint, Settings())
    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    question = QUESTIONS[0] + " Answer yes or no only."
    messages = [{"role": "user",
                 "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        messages, chat_template=template, add_generation_prompt=True, tokenize=False)
    assert engine.prompt(QUESTIONS[0]) == expected \
        == (f"<|im_start|>user <image>\n{question}<|im_end|>"
            "<|im_start|>assistant\n")
    assert engine.model.tokenizer.encode("Yes", add_special_tokens=False) == [9454]
    assert engine.model.image_token_id == 151646 and engine.model.stop_ids == {151645}


@pytest.mark.slow
def test_vlmevalkit_prompt_is_its_chat_template_rendering(shared, checkpoint):
    """VLMEvalKit's LLaVA_OneVision_HF joins [image, question] into one text part, '<image>\\n' +
    question, and renders it with the processor's chat template: the template
    vlmevalkit_llava_onevision is that rendering, and its ids hold one image run as the processor
    expands it."""
    from transformers import AutoTokenizer

    from pope_fast.readout import get_template

    folder = shared / "tokenizers/llava_onevision/llava-onevision-qwen2-7b-ov-hf"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    conversation = [{"role": "user",
                     "content": [{"type": "text", "text": "<image>\n" + QUESTIONS[0]}]}]
    theirs = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        conversation, chat_template=template, add_generation_prompt=True, tokenize=False)
    assert get_template("vlmevalkit_llava_onevision").render(QUESTIONS[0]) == theirs
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1),
                         template=get_template("vlmevalkit_llava_onevision"), readouts="all")
    assert_first_answers_match(REGISTRY[FAMILY], checkpoint, engine, IMAGES[2], QUESTIONS[:1])


@pytest.mark.slow
def test_the_processor_chat_template_renders_the_prompt(tmp_path):
    """A checkpoint whose tokenizer carries a text-only template (as a hub tokenizer_config may) and
    whose chat_template.json holds the processor's: the processor's renders the prompt."""
    checkpoint = make_tiny_llava_onevision(tmp_path / "ckpt", seed=2)
    # where transformers 5 saves the tokenizer's
    tokenizer_template = checkpoint / "chat_template.jinja"
    processor_template = tokenizer_template.read_text()
    tokenizer_template.write_text("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                                  "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                                  "<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="exactly one <image>"):
        Engine.load(checkpoint, Settings(max_new_tokens=1)).answer(IMAGES[4], QUESTIONS[:1])
    processor_json = json.dumps({"chat_template": processor_template})
    (checkpoint / "chat_template.json").write_text(processor_json)
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1))
    assert engine.prompt(QUESTIONS[0]).startswith("<|im_start|>user <image>\nIs there a dog")
    assert engine.answer(IMAGES[4], QUESTIONS[:1])[0].question == QUESTIONS[0]


@pytest.mark.slow
def test_builtin_tokenizer_stands_in(tmp_path):
    """Without ../shared the built-in Qwen2 stand-in carries <image> and OneVision's template shape,
    and the checkpoint still matches the oracle."""
    checkpoint = make_tiny_llava_onevision(tmp_path / "ckpt", seed=4, builtin_tokenizer=True)
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1), readouts="all")
    assert engine.prompt(QUESTIONS[0]).startswith("<|im_start|>user <image>\nIs there a dog")
    oracle = processor_oracle(REGISTRY[FAMILY], checkpoint, engine.prompt, IMAGES[3:4],
                              QUESTIONS[:1], new_tokens=1)
    answer = engine.answer(IMAGES[3], QUESTIONS[:1])[0]
    logits, generated, ids = oracle[0, QUESTIONS[0]]
    assert ids.count(engine.model.image_token_id) > 0
    assert_answer_matches(answer, logits, generated, "built-in tokenizer")


@pytest.mark.slow  # the registry's tiny checkpoint, written through the transformers class
def test_protocols(checkpoint):
    assert_protocols(checkpoint, {
        "paper": dict(template="llava_onevision_chat"),
        "vlmevalkit": dict(template="vlmevalkit_llava_onevision", new_tokens=2048),
        "lmms-eval": dict(template="lmms_eval_llava_onevision", new_tokens=128,
                          image_reencode="rgb", dtype="fp16", generation_config="greedy_output",
                          deviations=())},
        refused={"llava": "protocol llava does not cover LLaVA-OneVision"})


def _llava_next_anyres(image, side: int, pinpoints, mean, std) -> np.ndarray:
    """LLaVA-NeXT's process_anyres_image (llava/mm_utils.py l.119-293 at df17966) with its
    SigLipImageProcessor (multimodal_encoder/siglip_encoder.py), as their lines state it: of the
    pinpoints, read as (width, height), the one that keeps the most of the image at its fitted
    scale, then wastes the least; the image resized to fit it (the limiting side to the pinpoint,
    the other rounded up, PIL's default filter) and pasted at the centre of a black canvas; the
    canvas cut row by row into crops; the whole image resized to one crop first; each crop resized
    to the processor's size (a crop of that size is copied), rescaled in float64 by 1/255 to float32
    and normalized."""
    import math

    width, height = image.size
    best, kept, wasted = None, 0, float("inf")
    for w, h in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        if effective > kept or (effective == kept and w * h - effective < wasted):
            best, kept, wasted = (w, h), effective, w * h - effective
    w, h = best
    # in this order: 100 * (168 / 300) rounds up to 57, 100 * 168 / 300 not
    scale_w, scale_h = w / width, h / height
    if scale_w < scale_h:
        size = (w, min(math.ceil(height * scale_w), h))
    else:
        size = (min(math.ceil(width * scale_h), w), h)
    canvas = Image.new("RGB", (w, h), (0, 0, 0))
    canvas.paste(image.resize(size), ((w - size[0]) // 2, (h - size[1]) // 2))
    crops = [image.resize((side, side))] + [canvas.crop((x, y, x + side, y + side))
                                             for y in range(0, h, side) for x in range(0, w, side)]
    mean, std = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
    return np.stack([(((np.asarray(c.resize((side, side))).astype(np.float64) / 255)
                       .astype(np.float32) - mean) / std)
                     .transpose(2, 0, 1) for c in crops])


@pytest.mark.slow
def test_lmms_eval_crops_are_llava_next_anyres(checkpoint):
    """lmms-eval's llava_onevision class hands LLaVA-NeXT's process_images (anyres_max_9) the task's
    RGB image: the engine's crops under its protocol are those bit for bit, for every shape of grid
    and a palette image."""
    engine = Engine.load(checkpoint, Settings(image_reencode="rgb"))
    p = engine.model.image_processor
    # the -hf list; a symmetric set either way it is read
    pinpoints = [(h, w) for h, w in p.image_grid_pinpoints]
    assert sorted(pinpoints) == sorted((w, h) for h, w in pinpoints)
    for image in IMAGES + [synthetic_image(5, (333, 251)).convert("P")]:
        rgb = image.convert("RGB")
        crops, _ = engine.model.preprocess(rgb)
        theirs = _llava_next_anyres(rgb, p.size.height, pinpoints, p.image_mean, p.image_std)
        assert crops.shape == theirs.shape and np.array_equal(crops, theirs), image.size


@pytest.mark.slow
def test_lmms_eval_prompt_is_llava_next_conv_qwen(shared):
    """lmms-eval's llava_onevision asks '<image>\\n' + question + post_prompt in LLaVA-NeXT's conv
    qwen_1_5 and splits the text at '<image>' (tokenizer_image_token): lmms_eval_llava_onevision's
    ids under the real tokenizer are the chunks' ids joined by the image token, as that function
    joins them."""
    from transformers import AutoTokenizer

    from pope_fast.readout import get_template

    folder = shared / "tokenizers/llava_onevision"
    folder = next((f for f in folder.iterdir() if (f / "tokenizer_config.json").is_file()),
                  folder) \
        if folder.is_dir() else folder
    if not (folder / "tokenizer_config.json").is_file():
        pytest.skip(f"{folder} holds no tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompt = get_template("lmms_eval_llava_onevision").render(QUESTIONS[0])
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                      f"<|im_start|>user\n<image>\n{QUESTIONS[0]}\n"
                      "Answer the question using a single word or phrase.<|im_end|>\n"
                      "<|im_start|>assistant\n")
    image = tokenizer.convert_tokens_to_ids("<image>")
    head, tail = (tokenizer(chunk).input_ids for chunk in prompt.split("<image>"))
    assert tokenizer(prompt).input_ids == head + [image] + tail


@pytest.mark.slow
def test_flop_floor_counts_the_siglip_tower(checkpoint):
    """Linear in the work, the vision side a real share: per token it reads, the tower's layers and
    patch embedding (no class token: a crop is side² tokens) and the projector."""
    from pope_fast.engine import Counts

    engine = Engine.load(checkpoint, Settings())
    model = engine.model
    pixels = model.preprocess(IMAGES[0])
    assert model.vision_tokens(pixels) == pixels[0].shape[0] * 9
    assert_flops_linear(model, pixels)
    d, h = 32, 64  # the tiny tower's and language model's widths
    per_token = 2 * 2 * (4 * d * d + 2 * d * 64) + 2 * 3 * 14 * 14 * d + 2 * (d * h + h * h)
    assert model.vision_flops(Counts(vision_tokens=10)) == 10 * per_token


@pytest.mark.slow  # copies two tiny checkpoints and loads each three times (5 s on 2 cores)
@pytest.mark.parametrize("name", ["llava_next", "llava_onevision"])
def test_grid_pinpoints_that_hold_no_grid_are_refused_at_load(name, tiny, tmp_path):
    """LLaVA-NeXT and OneVision cut every image to one of image_grid_pinpoints: none (an empty list,
    or a grid of one side) is refused at load naming the field, where it would fail in the first
    image's preprocessing."""
    import json
    import shutil

    from pope_fast.engine.utils.loader import CheckpointError

    for bad in ([], [[42]]):
        folder = shutil.copytree(tiny.checkpoint(name), tmp_path / f"{name}{len(bad)}")
        config = json.loads((folder / "config.json").read_text())
        config["image_grid_pinpoints"] = bad
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(CheckpointError,
                           match=r"image_grid_pinpoints .* holds no grid of \[height, width\]"):
            Engine.load(folder, Settings())
