"""Qwen2-VL's quirks (native-resolution ViT with 2 x 2 merging, Qwen2 with M-RoPE); its battery
against Qwen2VLForConditionalGeneration is test_battery's qwen2_vl cases."""
import pytest
from registry import REGISTRY
from tinymodels import QUESTIONS

FAMILY = "qwen2_vl"  # whose checkpoint, model and oracle tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images


@pytest.mark.slow
def test_positions_follow_the_grid(engine):
    features = engine.features(IMAGES[0])  # 2 x 3
    ids = engine.model.prompt_ids(engine.prompt(QUESTIONS[0]), 6)
    streams = engine.model.positions(ids, features)
    start = ids.index(engine.model.image_token_id)
    assert streams[:, start:start + 6].tolist() == [[start] * 6,
                                                    [start + r for r in (0, 0, 0, 1, 1, 1)],
                                                    [start + c for c in (0, 1, 2, 0, 1, 2)]]
    # on from the longer side, not the count
    assert streams[:, start + 6].tolist() == [start + 3] * 3
