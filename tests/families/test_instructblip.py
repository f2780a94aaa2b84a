"""InstructBLIP's quirks (28-px ViT, 2-layer Q-Former with 4 queries, LLaMA): its battery against
InstructBlipForConditionalGeneration is test_battery's instructblip cases."""

import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, write_pope_set

from pope_fast.engine import Engine, ImagePrompts, Settings
from pope_fast.sweep import run_pope
from pope_fast.readout import load_questions

IMAGES = REGISTRY["instructblip"].images


@pytest.fixture(scope="module")
def checkpoint(tiny):
    return tiny.checkpoint("instructblip")


@pytest.mark.slow
def test_the_question_reaches_the_image_tokens(checkpoint):
    """The Q-Former reads the prompt: one image's 4 query features differ from question to question."""
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    features = engine.features(IMAGES[0])
    a, b = engine.model.prompt_features([ImagePrompts(features, [engine.prompt(q) for q in QUESTIONS[:2]])])[0]
    assert a.shape == b.shape == (4, engine.model.lm.dims.hidden_size) and not torch.allclose(a, b)


@pytest.mark.slow
def test_sweep_runs_the_vit_once_per_image(checkpoint, tmp_path):
    """(The CLI sweep of every family is tests/app/test_cli_families.py.)"""
    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    questions = [q for f in files for q in load_questions(f)]
    engine = Engine.load(checkpoint, Settings(image_batch=2, max_new_tokens=6), readouts="all")
    result = run_pope(engine, questions, images, tmp_path / "out")
    assert result.evaluated_prompts < len(questions)
    assert engine.counts.images_encoded == 3   # the ViT once per image, the Q-Former per prompt


@pytest.mark.slow
def test_whole_sequence_readout_is_the_papers_instructblip_string_parse(checkpoint, tmp_path):
    """string_parse_with_prompt reads what the paper's InstructBLIP adapter parsed: generate's whole
    output, prompt included, decoded (6 new tokens); the prompt's 'yes' decides every question, so it
    scores the all-yes floor (F1 0.6667 on a balanced split), the published row."""
    import json

    from PIL import Image
    from transformers import AutoProcessor, InstructBlipForConditionalGeneration

    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    questions = {q.question_id: q for q in load_questions(files[0])}
    engine = Engine.load(checkpoint, Settings(), readouts="string_parse,string_parse_with_prompt")
    [run] = run_pope(engine, list(questions.values()), images, tmp_path / "out").runs
    model = InstructBlipForConditionalGeneration.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    for line in (tmp_path / "out/records.jsonl").read_text().splitlines():
        r = json.loads(line)
        text = f"Question: {questions[r['question_id']].text} Answer yes or no only. Answer:"
        inputs = processor(images=Image.open(images / r["image"]), text=text, return_tensors="pt")
        with torch.no_grad():
            sequence = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0]
        assert r["decoded_sequence"] == processor.tokenizer.decode(sequence, skip_special_tokens=True)
        assert r["predictions"]["string_parse_with_prompt"] == "yes"
    m = run["readouts"]["string_parse_with_prompt"]
    assert (m["tp"], m["fp"], m["tn"], m["fn"], m["f1"]) == (len(questions) // 2, len(questions) // 2, 0, 0, 2 / 3)
    assert json.loads((tmp_path / "out/meta.json").read_text())["generation"] == {
        "string_parse": {"max_new_tokens": 6, "first_sentence": False},
        "string_parse_with_prompt": {"max_new_tokens": 6, "first_sentence": False}}
