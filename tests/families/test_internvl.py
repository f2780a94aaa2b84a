"""InternVL3 (-hf)'s quirks against transformers' InternVLForConditionalGeneration, the oracle (its
battery is test_battery's internvl cases), on a tiny random checkpoint whose tiles are 56 px (4 x 4
InternViT patches, 2 x 2 = 4 tokens per tile after the pixel shuffle) and whose processor cuts up to
6 tiles (tinymodels.make_tiny_internvl), so that one-tile images (no thumbnail), wide and tall grids
and the tie-break towards more tiles appear at small image sizes, each image with its own tile
count. InternVLProcessor cannot be built without torchvision; the oracle's prompt ids come from the
family's reference processor (the image processor under crop_to_patches and the processor's own
replace_image_token), and the oracle model itself refuses a wrong image-token count."""
import json

import numpy as np
import pytest
from familychecks import assert_first_answers_match, assert_flops_linear, assert_protocols
from registry import PER_TILE, REGISTRY, TILES
from tinymodels import QUESTIONS, make_tiny_internvl, synthetic_image

from pope_fast.engine import Counts, Engine, Settings
from pope_fast.engine.models import family_class

FAMILY = "internvl"  # whose checkpoint, model and oracle tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images   # registry.INTERNVL_SIZES, each with its TILES
INTERNVL = family_class(FAMILY)


@pytest.mark.slow
def test_each_image_has_its_tile_count(checkpoint):
    engine = Engine.load(checkpoint, Settings())
    for i, image in enumerate(IMAGES):
        features = engine.features(image)
        assert features.shape[0] == TILES[i] * PER_TILE, \
            f"image {i}: {features.shape[0]} image tokens"


@pytest.mark.slow
def test_prompt_ids_are_the_processors(checkpoint, oracle):
    """The engine's ids are InternVLProcessor's, token for token: '<img>', 256 (here 4) context
    tokens per tile, '</img>'; the shared prefix runs to the last context token, so it holds every
    tile of the image."""
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


@pytest.mark.slow
def test_pixels_match_the_image_processor(checkpoint):
    """The fast tiling path (in use) gives the processor's tiles bit for bit under crop_to_patches
    (as InternVLProcessor calls it): every tile of the best grid row by row, then the thumbnail, for
    every grid."""
    from transformers import AutoImageProcessor

    engine = Engine.load(checkpoint, Settings())
    assert engine.model._fast_pixels is not None
    processor = AutoImageProcessor.from_pretrained(str(checkpoint))
    for image, tiles in zip(IMAGES + [synthetic_image(5, (333, 251)).convert("RGBA")], TILES + [7]):
        ours = engine.model.preprocess(image)
        out = processor(images=image, crop_to_patches=True, return_tensors="np")
        assert ours.dtype == np.float32 and ours.shape == (tiles, 3, 56, 56), image.size
        assert np.array_equal(ours, out["pixel_values"]) \
            and list(out["num_patches"]) == [tiles], image.size


@pytest.mark.slow
def test_a_lower_feature_layer_cuts_the_tower(tmp_path):
    """vision_feature_layer -2 (hidden_states[-2]: the tower without its last layer) matches the
    oracle, and differs from the last layer's features."""
    checkpoint = make_tiny_internvl(tmp_path / "ckpt", seed=6, feature_layer=-2)
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1), readouts="all")
    assert len(engine.model.vision.encoder.layer) == 1
    assert_first_answers_match(REGISTRY[FAMILY], checkpoint, engine, IMAGES[0], QUESTIONS[:2])


@pytest.mark.slow
def test_a_stored_head_under_a_tied_config_is_refused(checkpoint, tmp_path):
    """A config.json without top-level tie_word_embeddings reads as tied (InternVLConfig's default),
    and transformers 5 would drop a stored lm_head: the loader says so instead of choosing a head.
    """
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


@pytest.mark.slow
def test_real_tokenizer_renders_the_chat_template(shared, checkpoint):
    """With InternVL3-8B-hf's tokenizer, the default prompt is its chat template over [image,
    question + suffix] (the image as '<IMG_CONTEXT>\\n', no system turn), Yes/No are bare single
    tokens, and the image tokens carry the config's ids."""
    tokenizer = _real_tokenizer(shared)
    engine = Engine.load(checkpoint, Settings())
    question = QUESTIONS[0] + " Answer yes or no only."
    messages = [{"role": "user",
                 "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert engine.prompt(QUESTIONS[0]) == expected \
        == (f"<|im_start|>user\n<IMG_CONTEXT>\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")
    model = engine.model
    assert model.tokenizer.encode("Yes", add_special_tokens=False) == [9454]
    assert model.tokenizer.encode("No", add_special_tokens=False) == [2753]
    assert model.image_token_id == 151667 and model.stop_ids == {151645}
    assert [model.tokenizer.convert_tokens_to_ids(t) for t in ("<img>", "</img>")] \
        == [151665, 151666]


@pytest.mark.slow
def test_lmms_eval_prompt_is_its_chat_template_rendering(shared, checkpoint):
    """lmms-eval's internvl_hf renders the task's [image, question + post_prompt] message with the
    processor's chat template: the template lmms_eval_internvl_hf is that rendering, and it runs as
    the oracle does."""
    from pope_fast.readout import get_template

    tokenizer = _real_tokenizer(shared)
    text = QUESTIONS[0] + "\nAnswer the question using a single word or phrase."
    messages = [{"role": "user",
                 "content": [{"type": "image", "url": None}, {"type": "text", "text": text}]}]
    theirs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert get_template("lmms_eval_internvl_hf").render(QUESTIONS[0], tokenizer) == theirs
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1),
                         template=get_template("lmms_eval_internvl_hf"), readouts="all")
    assert_first_answers_match(REGISTRY[FAMILY], checkpoint, engine, IMAGES[2], QUESTIONS[:1])


@pytest.mark.slow
def test_builtin_tokenizer_stands_in(tmp_path):
    """Without ../shared the built-in Qwen2 stand-in carries <img>, </img>, <IMG_CONTEXT> and
    InternVL's template shape, and the checkpoint still matches the oracle."""
    checkpoint = make_tiny_internvl(tmp_path / "ckpt", seed=4, builtin_tokenizer=True)
    engine = Engine.load(checkpoint, Settings(max_new_tokens=1), readouts="all")
    assert engine.prompt(QUESTIONS[0]).startswith("<|im_start|>user\n<IMG_CONTEXT>\nIs there a dog")
    oracle = assert_first_answers_match(REGISTRY[FAMILY], checkpoint, engine, IMAGES[1],
                                        QUESTIONS[:1])
    _, _, ids = oracle[0, QUESTIONS[0]]
    assert ids.count(engine.model.image_token_id) == TILES[1] * PER_TILE


@pytest.mark.slow  # the registry's tiny checkpoint, written through the transformers class
def test_protocols(checkpoint):
    assert_protocols(checkpoint, {
        "paper": dict(template="internvl_chat"),
        "lmms-eval": dict(template="lmms_eval_internvl_hf", new_tokens=128),
        "vlmevalkit": dict(template="vlmevalkit_internvl", new_tokens=4096, processor_patches="1:6",
                           image_reencode="rgb", generation_config="none", deviations=())},
        refused={"llava": "protocol llava does not cover InternVL3"})


def _internvl_load_image(image, size: int, max_num: int) -> np.ndarray:
    """VLMEvalKit's InternVL load_image (vlmeval/vlm/internvl/utils.py l.19-93, e8e78f05), as its
    lines state it: RGB; of the grids of 1..max_num tiles (sorted by tile count), the one whose
    aspect ratio is closest to the image's, a later one of equal distance taken while the image's
    area exceeds half the grid's; the image resized to it by PIL's default filter (bicubic), cut row
    by row, the whole image resized to one more tile where there are several; each tile through
    ToTensor (/255 in float32) and Normalize with ImageNet's mean and std (its Resize to `size`
    leaves a tile of that size as it is)."""
    import torch

    image = image.convert("RGB")
    width, height = image.size
    grids = sorted({(i, j) for n in range(1, max_num + 1) for i in range(1, n + 1)
                    for j in range(1, n + 1) if 1 <= i * j <= max_num}, key=lambda g: g[0] * g[1])
    best, distance = (1, 1), float("inf")
    for grid in grids:
        d = abs(width / height - grid[0] / grid[1])
        if d < distance:
            best, distance = grid, d
        elif d == distance and width * height > 0.5 * size * size * grid[0] * grid[1]:
            best = grid
    resized = image.resize((size * best[0], size * best[1]))
    tiles = [resized.crop((c * size, r * size, (c + 1) * size, (r + 1) * size))
             for r in range(best[1]) for c in range(best[0])]
    if len(tiles) != 1:
        tiles.append(image.resize((size, size)))
    mean = torch.tensor((0.485, 0.456, 0.406))[:, None, None]
    std = torch.tensor((0.229, 0.224, 0.225))[:, None, None]
    return torch.stack([(torch.from_numpy(np.array(t)).permute(2, 0, 1).float().div(255) - mean)
                        / std for t in tiles]).numpy()


@pytest.mark.slow
def test_vlmevalkit_tiles_are_internvls_load_image(checkpoint):
    """VLMEvalKit's InternVLChat tiles with InternVL's own load_image (max_num 6 for POPE); under
    its protocol (image_reencode rgb, processor_patches 1:max_num) the engine's tiles are those bit
    for bit, on every image of the family's sizes and on a palette image, at 6 tiles and at 2 (which
    cuts the bigger grids another way)."""
    from PIL import Image

    from pope_fast.engine.inputs.images import reencoded

    images = [*IMAGES, synthetic_image(3, (150, 60)).convert("P")]
    for max_num in (6, 2):
        engine = Engine.load(checkpoint,
                             Settings(image_reencode="rgb", processor_patches=f"1:{max_num}"))
        # the tile: InternVL3's 448, the tiny checkpoint's 56
        size = engine.model.image_processor.size.height
        for image in images:
            ours = engine.model.preprocess(reencoded(image, engine.settings.image_reencode))
            theirs = _internvl_load_image(image, size, max_num)
            assert ours.shape == theirs.shape and np.array_equal(ours, theirs), \
                (max_num, image.size)
    wide = Image.new("RGB", (6 * size, size))
    assert _internvl_load_image(wide, size, 6).shape[0] == 7 \
        and _internvl_load_image(wide, size, 2).shape[0] == 3


@pytest.mark.slow
def test_vlmevalkit_prompt_is_internvls_conversation(shared, checkpoint):
    """InternVL's chat renders the internvl2_5 template (MPT style: system, then each role and
    message, each ended by '<|im_end|>\\n') over '<image>\\n' + the question, then puts '<img>' +
    the context tokens + '</img>' for '<image>': vlmevalkit_internvl under InternVL3-8B-hf's chat
    template is that text with '<IMG_CONTEXT>' for '<image>', which the engine expands the same way.
    """
    from pope_fast.readout import get_template
    from pope_fast.readout.protocols.vlmevalkit import INTERNVL_SYSTEM

    tokenizer = _real_tokenizer(shared)
    theirs = (f"<|im_start|>system\n{INTERNVL_SYSTEM}<|im_end|>\n"
              f"<|im_start|>user\n<image>\n{QUESTIONS[0]}<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert get_template("vlmevalkit_internvl").render(QUESTIONS[0], tokenizer) \
        == theirs.replace("<image>", "<IMG_CONTEXT>")


@pytest.mark.slow
def test_flop_floor_counts_the_internvit_tower(checkpoint):
    """Linear in the work, the vision side a real share: per token it reads (patches + class token
    per tile), the tower's layers and patch embedding; per tile, the projector over its shuffled
    features."""
    engine = Engine.load(checkpoint, Settings())
    model = engine.model
    pixels = model.preprocess(IMAGES[0])
    assert model.vision_tokens(pixels) == TILES[0] * 17
    assert_flops_linear(model, pixels)
    d, h = 32, 64  # the tiny tower's and language model's widths
    per_token = 2 * 2 * (4 * d * d + 2 * d * 64) + 2 * 3 * 14 * 14 * d
    per_tile = PER_TILE * 2 * (4 * d * h + h * h)
    assert model.vision_flops(Counts(vision_tokens=2 * 17)) == 2 * 17 * per_token + 2 * per_tile
