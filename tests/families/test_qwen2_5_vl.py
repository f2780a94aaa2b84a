"""Qwen2.5-VL's quirks (a 4-block windowed ViT: windows of 2 x 2 merged tokens, whole-image
attention in blocks 1 and 3; Qwen2 with M-RoPE): its battery against
Qwen2_5_VLForConditionalGeneration is test_battery's qwen2_5_vl cases, on registry.GRIDS."""

from functools import partial

import numpy as np
import pytest
import torch
from registry import GRIDS, REGISTRY
from familychecks import (assert_qwen_answer_tokens, assert_qwen_protocol_prompts, rope_index_pairs,
                          tower_matmul_flops)
from tinymodels import QUESTIONS, SHARED_QWEN2_5_TOKENIZER
from tinymodels import qwen_inputs as _inputs, qwen_processors as _processors

from pope_fast.bench.tower import CallCounter, random_tower
from pope_fast.engine import Counts, Engine, Settings
from pope_fast.engine.models.qwen2_5_vl import TowerPlan, windowed_tower

FAMILY = "qwen2_5_vl"  # whose checkpoint, model and oracle tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images
# (t, h, w) patch grids: a 640 x 480 image's (17 x 23 merged tokens: windows of 4 x 4, 4 x 3, 1 x 4,
# 1 x 3 at 112 px), one its windows divide evenly (8 x 8), a one-row one, a two-frame one; several
# in one call
LAYOUT_GRIDS = [[(1, 34, 46)], [(1, 16, 16)], [(1, 2, 30)], [(2, 12, 10)],
                [(1, 34, 46), (1, 16, 16), (1, 6, 10)]]


def _config(window_size: int):
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    return Qwen2_5_VLVisionConfig(window_size=window_size, patch_size=14, spatial_merge_size=2)


@pytest.mark.parametrize("window_size", [28, 56, 112, 140], ids=lambda w: f"window{w}px")
@pytest.mark.parametrize("grids", LAYOUT_GRIDS,
                         ids=lambda g: "+".join("x".join(map(str, v)) for v in g))
def test_tower_plan_is_transformers_layout(grids, window_size):
    """The plan made on the CPU holds transformers' window order, positions and merger order for the
    grids, and its groups are exactly the windows, each group one length, put back in order by
    `inverse`."""
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    plan = TowerPlan.of(grids, _config(window_size), torch.device("cpu"))
    grid = torch.tensor(grids)
    window_index, cu_windows = get_vision_window_index(grid, spatial_merge_size=2,
                                                       window_size=window_size, patch_size=14)
    assert torch.equal(plan.order[::4] // 4, window_index)
    assert torch.equal(plan.order.view(-1, 4), plan.order[::4, None] + torch.arange(4))
    assert torch.equal(plan.reverse, torch.argsort(window_index))
    assert torch.equal(plan.positions, get_vision_position_ids(grid, 2))
    # per patch, in order
    window_of = torch.repeat_interleave(torch.arange(len(cu_windows) - 1), cu_windows.diff())
    order = plan.windows.order if plan.windows.order is not None else torch.arange(len(window_of))
    grouped, start = window_of[order], 0
    for length, count in zip(plan.windows.lengths, plan.windows.counts):
        runs = grouped[start:start + length * count].view(count, length)
        assert (runs == runs[:, :1]).all() and (cu_windows.diff()[runs[:, 0]] == length).all()
        start += length * count
    assert start == len(window_of) and len(set(plan.windows.lengths)) == len(plan.windows.lengths)
    assert sum(plan.windows.counts) == len(cu_windows) - 1
    if plan.windows.order is not None:
        assert torch.equal(order[plan.windows.inverse], torch.arange(len(order)))
    assert plan.whole.lengths == tuple(h * w for t, h, w in grids for _ in range(t))


def test_tower_plan_refuses_a_window_under_one_merged_token():
    with pytest.raises(ValueError, match="vision_config.window_size 14 is under one merged token"):
        TowerPlan.of([(1, 4, 4)], _config(14), torch.device("cpu"))


@pytest.mark.parametrize("grids, dtype",
                         [([(1, 18, 14)], torch.float32), ([(1, 18, 14)], torch.bfloat16),
                          ([(1, 16, 16)], torch.float32), ([(2, 12, 10)], torch.float32),
                          ([(1, 18, 14), (1, 16, 16), (1, 6, 10)], torch.float32)],
                         ids=["9x7", "9x7-bf16", "8x8", "two-frames", "three-images"])
def test_windowed_tower_is_transformers_bit_for_bit(grids, dtype):
    """The engine's tower forward gives transformers' Qwen2_5_VisionTransformerPretrainedModel's
    features bit for bit, windows ragged (9 x 7 merged tokens: windows of 4 x 4, 4 x 3, 1 x 4 and 1
    x 3, as a 640 x 480 image's) or not (8 x 8), two frames, several images in one call, in one SDPA
    call per window length and block."""
    tower = random_tower(width=32, depth=4, fullatt_block_indexes=[1, 3]).to(dtype)
    patches = torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 14 * 14, dtype=dtype)
    plan = TowerPlan.of(grids, tower.config, torch.device("cpu"))
    with torch.inference_mode(), CallCounter() as counter:
        ours = windowed_tower(tower, patches, plan)
    with torch.inference_mode():
        theirs = tower(hidden_states=patches, grid_thw=torch.tensor(grids)).pooler_output
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    assert counter.counts \
        == {"attention_calls": 2 * len(plan.windows.lengths) + 2 * len(plan.whole.lengths)}


@pytest.mark.slow
def test_pixels_are_the_processors_bit_for_bit(checkpoint, engine):
    """The fast pixel path (taken here) gives the image processor's patches and grid exactly."""
    _, image_processor = _processors(checkpoint)
    assert engine.model._fast_pixels is not None
    for image, (rows, cols) in zip(IMAGES, GRIDS):
        patches, grid = engine.model.preprocess(image)
        theirs = image_processor(images=image, return_tensors="np")
        assert grid == tuple(int(v) for v in theirs["image_grid_thw"][0]) == (1, 2 * rows, 2 * cols)
        assert patches.dtype == theirs["pixel_values"].dtype \
            and np.array_equal(patches, theirs["pixel_values"])


@pytest.mark.slow
def test_features_are_the_towers_and_the_windows_matter(engine, model):
    """Our features (every image in one tower call, windows batched by length) are transformers'
    tower's on the same call bit for bit, and its get_image_features of each image alone, in raster
    order; the images do span several windows, partial ones included, and attending over the whole
    image in every block instead would change the features. A tower whose attention is not SDPA runs
    transformers' forward."""
    from transformers.vision_utils import get_vision_window_index

    pixels = [engine.model.preprocess(image) for image in IMAGES]
    with CallCounter() as counter:
        ours = engine.model.encode_images(pixels)
    # windows of 4, 2 and 1 merged tokens: one call each in blocks 0 and 2; one per image in blocks
    # 1 and 3
    assert counter.counts == {"attention_calls": 2 * 3 + 2 * len(IMAGES)}
    vision = model.model.visual
    patches = torch.from_numpy(np.concatenate([p for p, _ in pixels]))
    grid = torch.tensor([g for _, g in pixels])
    with torch.no_grad():
        together = vision(patches, grid_thw=grid).pooler_output
    assert torch.equal(torch.cat([f.reshape(-1, 64) for f in ours]), together)
    engine.model.vision.config._attn_implementation = "eager"
    with CallCounter() as counter:
        eager = engine.model.encode_images(pixels)
    assert counter.counts["attention_calls"] == 0
    assert all(torch.allclose(e, o, rtol=0, atol=1e-5) for e, o in zip(eager, ours))
    assert vision.fullatt_block_indexes == [1, 3] and len(vision.blocks) == 4
    grid = torch.tensor([g for _, g in pixels])
    _, cu_windows = get_vision_window_index(grid, spatial_merge_size=2,
                                            window_size=vision.window_size, patch_size=14)
    windows = (cu_windows.diff() // 4).tolist()   # merged tokens per window, image by image
    assert windows == [4, 2] + [4, 2] + [4] + [2, 2, 2, 1] + [4, 4, 2, 4, 4, 2, 2, 2, 1]
    alone = []
    for feature, (patches, thw), (rows, cols) in zip(ours, pixels, GRIDS):
        with torch.no_grad():
            theirs = model.model.get_image_features(torch.from_numpy(patches),
                                                    torch.tensor([thw])).pooler_output[0]
        assert feature.shape == (rows, cols, 64)
        torch.testing.assert_close(feature.reshape(rows * cols, -1), theirs, rtol=0, atol=1e-5)
        alone.append(theirs)
    vision.fullatt_block_indexes = [0, 1, 2, 3]
    try:
        with torch.no_grad():
            unwindowed = vision(torch.from_numpy(np.concatenate([p for p, _ in pixels])),
                                grid_thw=grid).pooler_output
    finally:
        vision.fullatt_block_indexes = [1, 3]
    assert float((unwindowed - torch.cat(alone)).abs().max()) > 1e-2


@pytest.mark.slow
def test_positions_are_transformers_rope_index(checkpoint, engine, model):
    """M-RoPE streams as get_rope_index makes them for each grid; a still image's temporal stream
    stays at its start (tokens_per_second and second_per_grid_ts space video frames only)."""
    assert model.config.vision_config.tokens_per_second == 2
    streams = rope_index_pairs(engine, model, partial(_inputs, checkpoint), IMAGES, GRIDS,
                               second_per_grid_ts=torch.tensor([5.0]))
    for (rows, cols), (ids, ours, theirs) in zip(GRIDS, streams):
        assert torch.equal(ours, theirs[:, 0])
        start = ids.index(engine.model.image_token_id)
        assert set(ours[0, start:start + rows * cols].tolist()) == {start}
        assert ours[:, start + rows * cols].tolist() == [start + max(rows, cols)] * 3


@pytest.mark.slow
def test_real_tokenizer_prompt_and_answer_tokens(shared, checkpoint):
    """With ../shared's Qwen2.5-VL tokenizer: its chat template's prompt, its special ids, and the
    bare `Yes`/`No` (no leading space) as the first answer tokens after `<|im_start|>assistant\\n`.
    """
    if not (shared / "tokenizers/qwen2_5_vl/qwen2.5-vl-7b-instruct").is_dir() \
            or not SHARED_QWEN2_5_TOKENIZER.is_dir():
        pytest.skip("../shared has no Qwen2.5-VL tokenizer")
    engine = Engine.load(checkpoint, Settings(), readouts="all")
    assert len(engine.model.tokenizer) == 151665
    prompt = engine.prompt(QUESTIONS[0])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
        "Is there a dog in the image? Answer yes or no only.<|im_end|>\n<|im_start|>assistant\n")
    assert_qwen_answer_tokens(engine, prompt)


@pytest.mark.slow  # the registry's tiny checkpoint, written through the transformers class
def test_protocol_prompts_are_the_tools_messages(shared, checkpoint):
    """lmms-eval qwen2_5_vl: a system message, then [image, question + post_prompt]; VLMEvalKit
    Qwen2VLChat for Qwen2.5-VL (use_custom_prompt=False): no system message, [image, the bare
    question]; both through the checkpoint tokenizer's chat template."""
    from pope_fast.coverage import protocol_for
    from pope_fast.readout import get_template

    if not SHARED_QWEN2_5_TOKENIZER.is_dir():
        pytest.skip("../shared has no Qwen2.5-VL tokenizer")
    tokenizer, _ = _processors(checkpoint)
    q = QUESTIONS[0]
    assert_qwen_protocol_prompts(checkpoint, tokenizer, q, vlmevalkit_tokens=2048)
    assert get_template("vlmevalkit_qwen2_5_vl").render(q, tokenizer).endswith(
        "<|vision_end|>Is there a dog in the image?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="does not cover Qwen2.5-VL: LLaVA's pope.sh"):
        protocol_for(checkpoint, "llava")


@pytest.mark.slow
def test_vision_flops_are_the_towers_weight_matmuls(engine):
    """vision_flops counts what the tower's Linears and patch-embedding Conv3d multiply (2 x weights
    x rows), per patch: the windowed blocks, the gated MLP, the merger over a quarter of the rows.
    """
    patches, counted = tower_matmul_flops(engine, IMAGES)
    assert patches == 4 * sum(r * c for r, c in GRIDS)
    assert engine.model.vision_flops(Counts(vision_tokens=patches)) \
        == pytest.approx(counted, rel=1e-12)
