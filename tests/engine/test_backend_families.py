"""The newest families on the transformers backend (issue 53 §3), each a tiny random checkpoint with its own chat
template, image processor and tokenizer: GLM-4.1V, LLaVA-OneVision-1.5, Ovis2.5 and InternVL3.5-hf's layout (an
`internvl` checkpoint of a Qwen3 language model, which the engine's InternVL3 does not implement). Their processors
hold a video processor that needs torchvision, which pope-fast does not install: the backend builds the class's
image half (engine/image_processor.py). The oracle is the class itself, one prompt at a time, unpadded; the commands
run end to end on each."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from tinymodels import QUESTIONS, make_tiny_internvl, synthetic_image

from pope_fast.cli import main
from pope_fast.engine import Settings, load_engine, parse_method
from pope_fast.engine.image_processor import image_half
from pope_fast.engine.synthetic import (Weights, builtin_questions, write_checkpoint, write_images,
                                        write_question_file)

pytestmark = pytest.mark.slow  # each loads transformers' class of a tiny checkpoint and runs whole commands

BOUND = 1e-4  # fp32: four steps at the logits' scale (pope_fast.verify.BOUND); padding changes only the rounding
WEIGHTS = dict(weights=Weights(init="model", dtype=torch.float32, std=0.2))  # candidate logits apart by more than
# rounding
# name -> (writer, the processor class the checkpoint's model_type maps to)
KINDS = {
    "glm4v": (lambda folder: write_checkpoint("glm4v", folder, **WEIGHTS), "Glm4vProcessor"),
    "llava_onevision1_5": (lambda folder: write_checkpoint("llava_onevision1_5", folder, **WEIGHTS),
                           "Exaone4_5_Processor"),  # transformers maps llava_onevision1_5 to it
    "ovis2_5": (lambda folder: write_checkpoint("ovis2_5", folder, **WEIGHTS), "Ovis2_5Processor"),
    "internvl3_5": (lambda folder: make_tiny_internvl(folder, language="qwen3"), "InternVLProcessor"),
}
IMAGES = [synthetic_image(5, (90, 60)), synthetic_image(6, (50, 110))]
ASKED = [QUESTIONS[0], QUESTIONS[3], QUESTIONS[5]]  # two lengths a batch of four pads, across the two images


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root, folders = tmp_path_factory.mktemp("families"), {}

    def checkpoint(kind: str):
        if kind not in folders:
            folders[kind] = KINDS[kind][0](root / kind)
        return folders[kind]
    return checkpoint


@pytest.mark.parametrize("kind", KINDS)
def test_records_equal_the_class_one_prompt_at_a_time(kind, made):
    from transformers import AutoModelForImageTextToText

    folder = made(kind)
    engine = load_engine(folder, Settings(batch_size=4, max_new_tokens=4), backend="transformers", readouts="all")
    processor = engine.model.inputs.processor
    assert type(processor).__mro__[1].__name__ == KINDS[kind][1] and processor.video_processor is None
    assert engine.template.name == "reference_chat"  # the checkpoint's own chat template
    answers = engine.run_methods(engine.prepare(IMAGES), [ASKED] * len(IMAGES), [parse_method("none")])["none"]
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    oracle, lengths = image_half(folder), set()
    for image, row in zip(IMAGES, answers):
        for question, answer in zip(ASKED, row):
            inputs = oracle(images=image, text=engine.prompt(question), return_tensors="pt")
            lengths.add(inputs["input_ids"].shape[1])
            with torch.inference_mode():
                logits = model(**inputs).logits[0, -1]
            ids = sorted(answer.candidate_logits)
            scale = max(1.0, float(logits[ids].abs().max()))
            worst = max(abs(answer.candidate_logits[i] - float(logits[i])) for i in ids)
            assert worst <= BOUND * scale, (kind, question, worst)
            assert answer.first_token_id == int(logits.argmax())
    assert len(lengths) >= 2  # the batches padded prompts of different lengths


def _invoke(*args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("kind", KINDS)
def test_eval_score_compare_and_verify(kind, made, tmp_path):
    """A paired run (VCD beside the baseline, VCD noising the processor's pixels), its scores and comparison, and
    verify holding the backend's batched run against the class one prompt at a time, continuations included."""
    folder = made(kind)
    questions = builtin_questions(6, "demo")
    write_question_file(tmp_path / "demo_pope.json", questions)
    write_images(tmp_path / "images", [q.image for q in questions])
    _invoke("eval", "--model", folder, "--questions", tmp_path / "demo_pope.json", "--split", "demo", "--images",
            tmp_path / "images", "--max-new-tokens", 3, "--batch-size", 4, "--device", "cpu", "--backend",
            "transformers", "--out", tmp_path / "run", "--method", "none", "--method", "vcd")
    meta = json.loads((tmp_path / "run/none/meta.json").read_text())
    assert (meta["model"]["backend"], meta["template"]) == ("transformers", "reference_chat")
    assert "dynamic_single" in _invoke("score", tmp_path / "run/none")
    assert "ΔF1" in _invoke("compare", tmp_path / "run/none", tmp_path / "run/vcd")
    told = _invoke("verify", "--model", folder, "--backend", "transformers", "--questions", 2, "--device", "cpu")
    assert "2 questions through the transformers backend and transformers' class" in told
    assert "argmax equal 2/2; continuations equal 2/2" in told and told.strip().endswith("agree")
