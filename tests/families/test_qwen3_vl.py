"""Qwen3-VL's quirks (a 4-block ViT of 16-px patches with DeepStack mergers on blocks 0 and 2, their
features added after language-model layers 0 and 1 of 3; Qwen3, q_norm and k_norm, with interleaved
M-RoPE): its battery against Qwen3VLForConditionalGeneration is test_battery's qwen3_vl cases, on
registry.GRIDS in 32-px units."""

from functools import partial

import numpy as np
import pytest
import torch
from registry import GRIDS, REGISTRY
from familychecks import (assert_qwen_answer_tokens, assert_qwen_protocol_prompts, rope_index_pairs,
                          tower_matmul_flops)
from tinymodels import QUESTIONS, SHARED_QWEN3_TOKENIZER, worst_difference
from tinymodels import qwen_inputs as _inputs, qwen_processors as _processors

from pope_fast.engine import Counts, Engine, ImagePrompts, Settings

FAMILY = "qwen3_vl"  # whose checkpoint, model and oracle tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images


@pytest.mark.slow
def test_dims_are_qwen3s(engine):
    """Qwen3's q/k norms, two DeepStack layers, interleaved M-RoPE and no qkv bias, read off the
    config."""
    assert engine.model.lm.dims.qk_norm and engine.model.lm.dims.deepstack == 2
    assert engine.model.lm.dims.mrope_interleaved and not engine.model.lm.dims.qkv_bias


@pytest.mark.slow
def test_pixels_are_the_processors_bit_for_bit(checkpoint, engine):
    """16-px patches: the fast pixel path (taken here) gives the image processor's patches and grid
    exactly."""
    _, image_processor = _processors(checkpoint)
    assert engine.model._fast_pixels is not None and image_processor.patch_size == 16
    for image, (rows, cols) in zip(IMAGES, GRIDS):
        patches, grid = engine.model.preprocess(image)
        theirs = image_processor(images=image, return_tensors="np")
        assert grid == tuple(int(v) for v in theirs["image_grid_thw"][0]) == (1, 2 * rows, 2 * cols)
        assert patches.shape[1] == 3 * 2 * 16 * 16
        assert patches.dtype == theirs["pixel_values"].dtype \
            and np.array_equal(patches, theirs["pixel_values"])


@pytest.mark.slow
def test_features_hold_the_towers_deepstack(engine, model):
    """Our features (every image in one tower call) are transformers' get_image_features of each
    image alone: the merger's output, then each DeepStack merger's, in raster order."""
    pixels = [engine.model.preprocess(image) for image in IMAGES]
    ours = engine.model.encode_images(pixels)
    assert model.config.vision_config.deepstack_visual_indexes == [0, 2]
    for feature, (patches, thw), (rows, cols) in zip(ours, pixels, GRIDS):
        with torch.no_grad():
            out = model.model.get_image_features(torch.from_numpy(patches), torch.tensor([thw]))
        theirs = torch.cat([out.pooler_output[0], *(f[0] for f in out.deepstack_features)], dim=-1)
        assert feature.shape == (rows, cols, 3 * 64)
        torch.testing.assert_close(feature.reshape(rows * cols, -1), theirs, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_deepstack_and_qk_norm_change_the_answer(engine, oracle):
    """The test sees DeepStack: with its blocks zeroed the logits move far past the tolerance (and
    the unzeroed ones are transformers'); q_norm and k_norm are drawn, so ignoring them would fail
    above."""
    for i, image in enumerate(IMAGES[:3]):
        features = engine.features(image)
        flat = features.clone()
        flat[..., 64:] = 0
        prompts = [engine.prompt(q) for q in QUESTIONS[:3]]
        plain, zeroed = (engine.run_images([ImagePrompts(f, prompts)])[0] for f in (features, flat))
        for q, a, b in zip(QUESTIONS[:3], plain, zeroed):
            logits, *_ = oracle[i, q]
            assert worst_difference(a.candidate_logits, logits)[0] <= 1e-4
            assert worst_difference(b.candidate_logits, logits)[0] > 1e-2


@pytest.mark.slow
def test_positions_and_interleaved_rotary_are_transformers(checkpoint, engine, model):
    """M-RoPE streams as get_rope_index makes them for each grid, and cos/sin of those streams as
    Qwen3VLTextRotaryEmbedding interleaves them (chunked sections, Qwen2-VL's, would differ)."""
    rotary = model.model.language_model.rotary_emb
    for _, ours, theirs in rope_index_pairs(engine, model, partial(_inputs, checkpoint), IMAGES,
                                            GRIDS):
        assert torch.equal(ours, theirs[:, 0])
        cos, sin = engine.model.lm.rotary.cos_sin_3d(ours[:, None], torch.float32)
        their_cos, their_sin = rotary(torch.zeros(1, dtype=torch.float32), theirs)
        assert torch.equal(cos, their_cos) and torch.equal(sin, their_sin)
        engine.model.lm.rotary.interleaved = False
        try:
            chunked, _ = engine.model.lm.rotary.cos_sin_3d(ours[:, None], torch.float32)
        finally:
            engine.model.lm.rotary.interleaved = True
        assert not torch.equal(chunked, cos)


@pytest.mark.slow
def test_real_tokenizer_prompt_and_answer_tokens(checkpoint):
    """With ../shared's Qwen3-VL tokenizer: its chat template's prompt (no default system turn), its
    special ids, and the bare `Yes`/`No` as the first answer tokens after
    `<|im_start|>assistant\\n`."""
    if not SHARED_QWEN3_TOKENIZER.is_dir():
        pytest.skip("../shared has no Qwen3-VL tokenizer")
    engine = Engine.load(checkpoint, Settings(), readouts="all")
    prompt = engine.prompt(QUESTIONS[0])
    assert prompt == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                      "Is there a dog in the image? "
                      "Answer yes or no only.<|im_end|>\n<|im_start|>assistant\n")
    assert_qwen_answer_tokens(engine, prompt)


@pytest.mark.slow
def test_vision_flops_are_the_towers_weight_matmuls(engine):
    """vision_flops counts what the tower's Linears and patch-embedding Conv3d multiply (2 x weights
    x rows), per patch: the blocks, the merger and both DeepStack mergers over a quarter of the
    rows."""
    patches, counted = tower_matmul_flops(engine, IMAGES)
    assert patches == 4 * sum(r * c for r, c in GRIDS)
    assert engine.model.vision_flops(Counts(vision_tokens=patches)) \
        == pytest.approx(counted, rel=1e-12)


@pytest.mark.slow  # the registry's tiny checkpoint, written through the transformers class
def test_protocol_prompts_are_the_tools_messages(checkpoint):
    """lmms-eval v0.7.2 models/simple/qwen3_vl.py: a system message (l.84), then [image, question +
    POPE's post_prompt] (l.328), 128 new tokens. VLMEvalKit e8e78f05 Qwen3VLChat (config.py
    l.1451-1462, use_custom_prompt=False): image_base.py l.329-336's [image, question], no system
    message (model.py l.360-363), 16384 new tokens, sampled: said as a deviation. Both through the
    checkpoint's chat template."""
    from pope_fast.coverage import protocol_for

    if not SHARED_QWEN3_TOKENIZER.is_dir():
        pytest.skip("../shared has no Qwen3-VL tokenizer")
    tokenizer, _ = _processors(checkpoint)
    q = QUESTIONS[0]
    theirs = assert_qwen_protocol_prompts(checkpoint, tokenizer, q, vlmevalkit_tokens=16384)
    # Qwen3-VL's template opens with no system turn
    assert theirs == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                      "Is there a dog in the image?<|im_end|>\n<|im_start|>assistant\n")
    deviations = protocol_for(checkpoint, "vlmevalkit").deviations
    assert any("samples" in d and "greedy" in d for d in deviations)


@pytest.mark.slow  # copies the tiny checkpoint and loads it (3 s on 2 cores)
def test_a_deepstack_index_outside_the_tower_is_refused_at_load(checkpoint, tmp_path):
    """A DeepStack block is one of the tower's blocks: an index past its depth (or below 0) names
    none, refused at load naming the field, where it would fail in the first image's encoding."""
    import json
    import shutil

    from pope_fast.engine.utils.loader import CheckpointError

    for bad in ([0, 99], [-1]):
        folder = shutil.copytree(checkpoint, tmp_path / f"ds{len(bad)}")
        config = json.loads((folder / "config.json").read_text())
        config["vision_config"]["deepstack_visual_indexes"] = bad
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(CheckpointError,
                           match=r"vision_config.deepstack_visual_indexes \[.*\] names blocks "
                                 r"outside the tower's \d+"):
            Engine.load(folder, Settings())
