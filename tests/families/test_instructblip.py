"""InstructBLIP against transformers' InstructBlipForConditionalGeneration, the oracle, on a tiny random
checkpoint (28-px ViT, 2-layer Q-Former with 4 queries, LLaMA)."""

import pytest
import torch
from familychecks import (assert_continuations_match, assert_nf4_matches, assert_run_matches, assert_scores_match,
                          image_items, processor_inputs, processor_oracle)
from tinymodels import QUESTIONS, bnb_nf4_oracle, make_tiny_instructblip, synthetic_image, write_pope_set

from pope_fast.engine import Engine, ImagePrompts, Settings
from pope_fast.sweep import run_pope
from pope_fast.readout import load_questions

IMAGES = [synthetic_image(i + 31, size) for i, size in enumerate([(90, 40), (40, 90), (60, 60)])]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_instructblip(tmp_path_factory.mktemp("tiny_instructblip") / "ckpt")


@pytest.fixture(scope="module")
def oracle(checkpoint):
    """transformers' answer-position logits, greedy continuation and prompt ids per (image, question), on
    InstructBLIP's prompt as written here."""
    from transformers import AutoProcessor, InstructBlipForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(checkpoint))
    return processor_oracle(InstructBlipForConditionalGeneration, checkpoint, processor,
                            lambda q: f"Question: {q} Answer yes or no only. Answer:", IMAGES, QUESTIONS[:4])


@pytest.mark.parametrize("batch_size", [1, 5, 32])
def test_candidate_logits_match_transformers(checkpoint, oracle, batch_size):
    engine = Engine.load(checkpoint, Settings(batch_size=batch_size, max_new_tokens=6), readouts="all")
    assert engine.template.name == "instructblip"
    assert_scores_match(engine, oracle, IMAGES, QUESTIONS[:4])


def test_the_question_reaches_the_image_tokens(checkpoint):
    """The Q-Former reads the prompt: one image's 4 query features differ from question to question."""
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    features = engine.features(IMAGES[0])
    a, b = engine.model.prompt_features([ImagePrompts(features, [engine.prompt(q) for q in QUESTIONS[:2]])])[0]
    assert a.shape == b.shape == (4, engine.model.lm.dims.hidden_size) and not torch.allclose(a, b)


def test_images_and_questions_in_one_batch(checkpoint, oracle):
    engine = Engine.load(checkpoint, Settings(batch_size=7, max_new_tokens=6), readouts="all")
    items = image_items(engine, IMAGES, QUESTIONS[:4])
    assert_run_matches(engine, oracle, items, QUESTIONS[:4])


def test_continuation_matches_generate(checkpoint, oracle):
    engine = Engine.load(checkpoint, Settings(max_new_tokens=4), readouts="string_parse")
    assert_continuations_match(engine, oracle, IMAGES, QUESTIONS[:4])


def test_sweep_runs_the_vit_once_per_image(checkpoint, tmp_path):
    """(The CLI sweep of every family is tests/app/test_cli_families.py.)"""
    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    questions = [q for f in files for q in load_questions(f)]
    engine = Engine.load(checkpoint, Settings(image_batch=2, max_new_tokens=6), readouts="all")
    result = run_pope(engine, questions, images, tmp_path / "out")
    assert result.evaluated_prompts < len(questions)
    assert engine.counts.images_encoded == 3   # the ViT once per image, the Q-Former per prompt


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


def test_nf4_decisions_match_transformers_bnb(tmp_path):
    """NF4 as transformers quantizes InstructBLIP (every Linear but lm_head: ViT, Q-Former, projection,
    LM; query_tokens stay fp32), against transformers + bitsandbytes on CPU (see engine/test_engine_nf4)."""
    import bitsandbytes as bnb
    from transformers import AutoProcessor, InstructBlipForConditionalGeneration

    checkpoint = make_tiny_instructblip(tmp_path / "ckpt", vision_hidden=64, qformer_hidden=64, seed=7)
    model = bnb_nf4_oracle(InstructBlipForConditionalGeneration, checkpoint)
    quantized = {n.split(".")[0] for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized == {"vision_model", "qformer", "language_projection", "language_model"}
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    engine = Engine.load(checkpoint, Settings(quant="nf4", dtype="fp16", max_new_tokens=6), readouts="all")
    inputs_of = processor_inputs(processor)
    assert_nf4_matches(engine, model, inputs_of, IMAGES[:2], QUESTIONS[:3])
