"""Idefics3's quirks against transformers' Idefics3Processor (its battery is test_battery's idefics3 cases), on the
registry's tiny checkpoint: 56-px tiles of 4 x 4 patches, 4 tokens a view after the pixel shuffle, the resize off so
that an image within one tile is the global view alone (registry.make_tiny_idefics3)."""
import json
import shutil

import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS

from pope_fast.engine import CheckpointError, Engine, Settings
from pope_fast.engine.models import family_class

FAMILY = "idefics3"  # whose checkpoint tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images  # 2 x 2 tiles, 2 x 1 tiles, unsplit
GRIDS = [(2, 2), (2, 1), (0, 0)]


@pytest.mark.parametrize("rows, cols", [(2, 3), (3, 2), (1, 4), (0, 0)])
def test_the_features_keep_the_grid_and_the_views_order(rows, cols):
    """The cached features say the tile grid (2 x 3 and 3 x 2 are as many views), and flattened they are the
    views in the prompt's order: the tiles row by row, then the global view, the padding after every slot."""
    idefics3 = family_class(FAMILY)
    views = rows * cols + 1
    made = torch.arange(views, dtype=torch.float32)[:, None, None].expand(views, 4, 8)
    features = idefics3._grid(made, rows, cols)
    assert idefics3.grid(features) == (rows, cols)
    assert torch.equal(features.reshape(-1, 8)[:views * 4], made.reshape(-1, 8))
    assert not features.reshape(-1, 8)[views * 4:].any()


@pytest.mark.slow
def test_prompt_ids_and_pixels_are_the_processors(checkpoint):
    """Idefics3Processor's ids, token for token (tile markers, rows' newlines, <global-img>; the global view alone
    for the unsplit image), as many image tokens as features, the prefix shared up to the global view's last image
    token; and the views are its pixel_values."""
    from transformers import AutoProcessor

    engine = Engine.load(checkpoint, Settings())
    model, processor = engine.model, AutoProcessor.from_pretrained(str(checkpoint))
    prompt = engine.prompt(QUESTIONS[0])
    for image, grid in zip(IMAGES, GRIDS):
        theirs = processor(images=image, text=prompt, add_special_tokens=False, return_tensors="pt")
        features = engine.features(image)
        layout = model.layout(prompt, features)
        assert model.grid(features) == grid and list(layout.ids) == theirs["input_ids"][0].tolist()
        assert layout.ids.count(model.image_token_id) == model.image_tokens(features) == 4 * (grid[0] * grid[1] + 1)
        assert layout.prefix_cut == layout.image_spans[-1][1] and len(layout.image_spans) == grid[0] * grid[1] + 1
        assert torch.equal(torch.from_numpy(model.preprocess(image)[0]), theirs["pixel_values"][0])


@pytest.mark.slow
def test_a_processor_of_another_token_count_is_refused(checkpoint, tmp_path):
    folder = shutil.copytree(checkpoint, tmp_path / "ckpt")
    config = json.loads((folder / "processor_config.json").read_text())
    (folder / "processor_config.json").write_text(json.dumps(dict(config, image_seq_len=9)))
    with pytest.raises(CheckpointError, match="the processor writes 9 image tokens a view .image_seq_len., the model "
                                              "makes 4"):
        Engine.load(folder, Settings())
