"""The newest families on the transformers backend (issue 53 §3), each a tiny random checkpoint with
its own chat template, image processor and tokenizer: GLM-4.1V, LLaVA-OneVision-1.5, Ovis2.5 and
InternVL3.5-hf's layout (an `internvl` checkpoint of a Qwen3 language model, which the engine's
InternVL3 does not implement). Their processors hold a video processor that needs torchvision, which
pope-fast does not install: the backend builds the class's image half (engine/image_processor.py).
The commands run end to end on each, verify holding the backend's answers against the class itself,
one prompt at a time, unpadded."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from click.testing import CliRunner
from tinymodels import make_tiny_internvl

from pope_fast.cli import main
from pope_fast.engine import CheckpointError, Settings, load_engine
from pope_fast.engine.image_processor import load_processor
from pope_fast.engine.transformers_model import TransformersInputs
from pope_fast.engine.synthetic import (Weights, builtin_chat_tokenizer, builtin_questions,
                                        write_checkpoint, write_images, write_question_file)

# fp32 weights wide enough that the candidate logits differ by more than rounding (decisions
# that mean something)
WEIGHTS = dict(weights=Weights(init="model", dtype=torch.float32, std=0.2))
# name -> (writer, the processor class the checkpoint's model_type maps to)
KINDS = {
    "glm4v": (lambda folder: write_checkpoint("glm4v", folder, **WEIGHTS), "Glm4vProcessor"),
    "llava_onevision1_5": (lambda folder: write_checkpoint("llava_onevision1_5", folder, **WEIGHTS),
                           "Exaone4_5_Processor"),  # transformers maps llava_onevision1_5 to it
    "ovis2_5": (lambda folder: write_checkpoint("ovis2_5", folder, **WEIGHTS), "Ovis2_5Processor"),
    # the stand-in tokenizer (InternVL's tokens and template on Qwen's format): the shared
    # InternVL3-8B-hf one takes seconds a load, and it is no more InternVL3.5's (Qwen3's vocabulary)
    # than the stand-in
    "internvl3_5": (lambda folder: make_tiny_internvl(folder, language="qwen3",
                                                      builtin_tokenizer=True),
                    "InternVLProcessor"),
}


def _invoke(*args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow  # transformers' class of a tiny checkpoint, whole commands
@pytest.mark.parametrize("kind", KINDS)
def test_eval_score_compare_and_verify(kind, tmp_path):
    """The class's own processor without its video half; a paired run (VCD beside the baseline, VCD
    noising the processor's pixels) with the checkpoint's chat template, its scores and comparison;
    and verify holding the backend's batched, left-padded answers (questions of different lengths
    about an image) against the class run one prompt at a time: candidate logits within fp32's
    bound, argmax, every readout's decision and the continuation."""
    folder = KINDS[kind][0](tmp_path / kind)
    processor = load_processor(folder)
    assert (type(processor).__mro__[1].__name__ == KINDS[kind][1]
            and processor.video_processor is None)
    questions = builtin_questions(6, "demo")
    write_question_file(tmp_path / "demo_pope.json", questions)
    write_images(tmp_path / "images", [q.image for q in questions])
    _invoke("eval", "--model", folder, "--questions", tmp_path / "demo_pope.json", "--split",
            "demo", "--images", tmp_path / "images", "--max-new-tokens", 3, "--batch-size", 4,
            "--device", "cpu", "--backend", "transformers", "--out", tmp_path / "run",
            "--method", "none", "--method", "vcd")
    meta = json.loads((tmp_path / "run/none/meta.json").read_text())
    assert (meta["model"]["backend"], meta["template"]) == ("transformers", "reference_chat")
    assert "dynamic_single" in _invoke("score", tmp_path / "run/none")
    assert "ΔF1" in _invoke("compare", tmp_path / "run/none", tmp_path / "run/vcd")
    told = _invoke("verify", "--model", folder, "--backend", "transformers", "--questions", 4,
                   "--max-new-tokens", 3, "--device", "cpu")
    assert "4 questions through the transformers backend and transformers' class" in told
    assert "argmax equal 4/4; continuations equal 4/4" in told and told.strip().endswith("agree")


# OpenGVLab's InternVL3.5 (not its -HF conversion): its classes are its own code
REMOTE = {"model_type": "internvl_chat", "auto_map": {
    "AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
    "AutoModel": "modeling_internvl_chat.InternVLChatModel",
    "AutoModelForCausalLM": "modeling_internvl_chat.InternVLChatModel"}}


@pytest.mark.parametrize("backend", ["auto", "engine", "transformers"])
def test_a_checkpoint_of_its_own_code_is_refused_naming_it(backend, tmp_path):
    """A model class that is the checkpoint's own code (config.json's auto_map) runs nowhere here:
    one line says so, on every backend, before any weight is read."""
    (tmp_path / "config.json").write_text(json.dumps(REMOTE))
    with pytest.raises(CheckpointError) as err:
        load_engine(tmp_path, Settings(), backend=backend)
    found = "model_type 'internvl_chat' has no image-text-to-text class in transformers" \
        if backend == "transformers" else "model_type 'internvl_chat' is not supported (supported: "
    assert str(err.value).startswith(f"{tmp_path}/config.json: {found}"), err.value
    assert str(err.value).endswith(
        "; its model class is the checkpoint's own code (config.json's auto_map: "
        "modeling_internvl_chat.InternVLChatModel), which pope-fast does not run "
        "(trust_remote_code)")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                    reason="torchvision builds Molmo2's images")
def test_a_processor_whose_image_half_needs_torchvision_is_refused_naming_it(tmp_path):
    """Molmo2's image processor itself is torchvision's (no PIL variant): neither its processor nor
    its image half loads, and the one line names the package."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "molmo2"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Molmo2ImageProcessor", "processor_class": "Molmo2Processor"}))
    builtin_chat_tokenizer(["<|image|>"], eos="<|im_end|>",
                           pad="<|endoftext|>").save_pretrained(str(tmp_path))
    with pytest.raises(CheckpointError) as err:
        TransformersInputs(tmp_path, Settings())
    assert str(err.value) == (f"{tmp_path}: transformers' processor does not load (Could not load "
                              f"any image processor class for {tmp_path}; missing package: "
                              f"torchvision; nor without its video processor)")
