"""InstructBLIP's quirks (28-px ViT, 2-layer Q-Former with 4 queries, LLaMA): its battery against
InstructBlipForConditionalGeneration is test_battery's instructblip cases."""

import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, write_pope_set

from pope_fast.engine import Engine, ImagePrompts, Settings
from pope_fast.sweep import run_plain
from pope_fast.readout import load_questions

FAMILY = "instructblip"  # whose checkpoint, model and oracle tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images


@pytest.mark.slow
def test_the_question_reaches_the_image_tokens(engine):
    """The Q-Former reads the prompt: one image's 4 query features differ from question to question.
    """
    features = engine.features(IMAGES[0])
    prompts = [engine.prompt(q) for q in QUESTIONS[:2]]
    a, b = engine.model.prompt_features([ImagePrompts(features, prompts)])[0]
    assert a.shape == b.shape == (4, engine.model.lm.dims.hidden_size) and not torch.allclose(a, b)


@pytest.mark.slow
def test_sweep_runs_the_vit_once_per_image(checkpoint, tmp_path):
    """(The CLI sweep of every family is tests/app/test_cli_families.py.)"""
    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    questions = [q for f in files for q in load_questions(f)]
    engine = Engine.load(checkpoint, Settings(image_batch=2, max_new_tokens=6), readouts="all")
    result = run_plain(engine, questions, images, tmp_path / "out")
    assert result.evaluated_prompts < len(questions)
    assert engine.counts.images_encoded == 3   # the ViT once per image, the Q-Former per prompt


@pytest.mark.slow
def test_whole_sequence_readout_is_the_papers_instructblip_string_parse(checkpoint, tmp_path):
    """string_parse_with_prompt reads what the paper's InstructBLIP adapter parsed: generate's whole
    output, prompt included, decoded (6 new tokens); the prompt's 'yes' decides every question, so
    it scores the all-yes floor (F1 0.6667 on a balanced split), the published row."""
    import json

    from PIL import Image
    from transformers import AutoProcessor, InstructBlipForConditionalGeneration

    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    questions = {q.question_id: q for q in load_questions(files[0])}
    engine = Engine.load(checkpoint, Settings(), readouts="string_parse,string_parse_with_prompt")
    [run] = run_plain(engine, list(questions.values()), images, tmp_path / "out").runs
    model = InstructBlipForConditionalGeneration.from_pretrained(str(checkpoint),
                                                                 dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    for line in (tmp_path / "out/records.jsonl").read_text().splitlines():
        r = json.loads(line)
        text = f"Question: {questions[r['question_id']].text} Answer yes or no only. Answer:"
        inputs = processor(images=Image.open(images / r["image"]), text=text, return_tensors="pt")
        with torch.no_grad():
            sequence = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0]
        assert r["decoded_sequence"] \
            == processor.tokenizer.decode(sequence, skip_special_tokens=True)
        assert r["predictions"]["string_parse_with_prompt"] == "yes"
    m = run["readouts"]["string_parse_with_prompt"]
    assert (m["tp"], m["fp"], m["tn"], m["fn"], m["f1"]) \
        == (len(questions) // 2, len(questions) // 2, 0, 0, 2 / 3)
    assert json.loads((tmp_path / "out/meta.json").read_text())["generation"] == {
        "string_parse": {"max_new_tokens": 6, "first_sentence": False},
        "string_parse_with_prompt": {"max_new_tokens": 6, "first_sentence": False}}


@pytest.mark.slow  # the registry's tiny checkpoint, written through the transformers class
def test_protocols(checkpoint):
    """VLMEvalKit runs InstructBLIP through LAVIS: the bare question, its beam search (5 beams,
    repetition penalty 1.5 over the output, max_length 256 with the prompt), fp16, the autocast's
    rounding said."""
    from pope_fast.coverage import protocol_for

    lavis = protocol_for(checkpoint, "vlmevalkit")
    assert (lavis.template, lavis.num_beams, lavis.repetition_penalty, lavis.length_penalty,
            lavis.max_length, lavis.generation_config, lavis.image_reencode, lavis.dtype) == \
        ("vlmevalkit_instructblip", 5, 1.5, 1.0, 256, "greedy_output", "rgb", "fp16")
    assert len(lavis.deviations) == 1 and "autocast" in lavis.deviations[0]
    assert protocol_for(checkpoint, "lmms-eval").num_beams == 1


@pytest.mark.slow
def test_pixels_are_lavis_blip_image_eval(checkpoint):
    """LAVIS's blip_image_eval (processors/blip_processors.py l.18-25, l.167-182: torchvision's
    Resize to the square with bicubic, which resizes a PIL image with PIL's, ToTensor, Normalize
    with CLIP's mean and std) of the RGB image is the engine's pixels, bit for bit, at the tiny
    checkpoint's size."""
    import numpy as np
    from PIL import Image

    engine = Engine.load(checkpoint, Settings(image_reencode="rgb"))
    side = engine.model.image_processor.size["height"]
    mean = torch.tensor((0.48145466, 0.4578275, 0.40821073))[:, None, None]
    std = torch.tensor((0.26862954, 0.26130258, 0.27577711))[:, None, None]
    for image in [*IMAGES, IMAGES[0].convert("P")]:
        rgb = image.convert("RGB")
        resized = np.array(rgb.resize((side, side), Image.BICUBIC))
        theirs = (torch.from_numpy(resized).permute(2, 0, 1).float().div(255) - mean) / std
        assert np.array_equal(engine.model.preprocess(rgb), theirs.numpy()), image.size
