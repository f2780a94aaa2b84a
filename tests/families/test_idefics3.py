"""Idefics3's quirks against transformers' Idefics3Processor (its battery is test_battery's idefics3
cases), on the registry's tiny checkpoint: 56-px tiles of 4 x 4 patches, 4 tokens a view after the
pixel shuffle, the resize off so that an image within one tile is the global view alone
(registry.make_tiny_idefics3)."""
import json
import shutil

import pytest
import torch
from registry import LLAMA3_ROPE, REGISTRY
from tinymodels import QUESTIONS

from pope_fast.engine import CheckpointError, Engine, Settings
from pope_fast.engine.models import family_class

FAMILY = "idefics3"  # whose checkpoint tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images  # 2 x 2 tiles, 2 x 1 tiles, unsplit
GRIDS = [(2, 2), (2, 1), (0, 0)]


@pytest.mark.parametrize("rows, cols", [(2, 3), (3, 2), (1, 4), (0, 0)])
def test_the_features_keep_the_grid_and_the_views_order(rows, cols):
    """The cached features say the tile grid (2 x 3 and 3 x 2 are as many views), and flattened they
    are the views in the prompt's order: the tiles row by row, then the global view, the padding
    after every slot."""
    idefics3 = family_class(FAMILY)
    views = rows * cols + 1
    made = torch.arange(views, dtype=torch.float32)[:, None, None].expand(views, 4, 8)
    features = idefics3._grid(made, rows, cols)
    assert idefics3.grid(features) == (rows, cols)
    assert torch.equal(features.reshape(-1, 8)[:views * 4], made.reshape(-1, 8))
    assert not features.reshape(-1, 8)[views * 4:].any()


def test_llama3_rope_frequencies_are_transformers():
    """Idefics3-8B's language model (Llama 3.1's) scales RoPE as rope_type "llama3": the frequencies
    the decoder reads off its config are transformers' own, bit for bit, in all three bands (kept,
    blended, divided)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from pope_fast.engine.layers.dims import DecoderDims
    from pope_fast.engine.layers.ops import Rotary

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=2048,
                         rope_parameters=LLAMA3_ROPE)
    dims = DecoderDims.from_config(config)
    ours = Rotary(dims.head_dim, dims.rope_theta, torch.device("cpu"),
                  llama3=dims.rope_llama3).inv_freq
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    plain = Rotary(dims.head_dim, dims.rope_theta, torch.device("cpu")).inv_freq
    assert torch.equal(ours, theirs)
    assert (ours == plain).sum() == 1 and (ours == plain / 8).sum() == 5


@pytest.mark.slow
def test_prompt_ids_and_pixels_are_the_processors(checkpoint):
    """Idefics3Processor's ids, token for token (tile markers, rows' newlines, <global-img>; the
    global view alone for the unsplit image), as many image tokens as features, the prefix shared up
    to the global view's last image token; and the views are its pixel_values."""
    from transformers import AutoProcessor

    engine = Engine.load(checkpoint, Settings())
    model, processor = engine.model, AutoProcessor.from_pretrained(str(checkpoint))
    prompt = engine.prompt(QUESTIONS[0])
    for image, grid in zip(IMAGES, GRIDS):
        theirs = processor(images=image, text=prompt, add_special_tokens=False, return_tensors="pt")
        features = engine.features(image)
        layout = model.layout(prompt, features)
        assert model.grid(features) == grid and list(layout.ids) == theirs["input_ids"][0].tolist()
        assert layout.ids.count(model.image_token_id) == model.image_tokens(features) \
            == 4 * (grid[0] * grid[1] + 1)
        assert layout.prefix_cut == layout.image_spans[-1][1] \
            and len(layout.image_spans) == grid[0] * grid[1] + 1
        assert torch.equal(torch.from_numpy(model.preprocess(image)[0]), theirs["pixel_values"][0])


@pytest.mark.slow
def test_a_processor_of_another_token_count_is_refused(checkpoint, tmp_path):
    folder = shutil.copytree(checkpoint, tmp_path / "ckpt")
    config = json.loads((folder / "processor_config.json").read_text())
    (folder / "processor_config.json").write_text(json.dumps(dict(config, image_seq_len=9)))
    with pytest.raises(CheckpointError,
                       match="the processor writes 9 image tokens a view .image_seq_len., "
                             "the model makes 4"):
        Engine.load(folder, Settings())
