"""Qwen3.5-MoE's quirks (Qwen3.5's hybrid decoder, every MLP 4 experts, 2 a token, and a shared
expert): its battery against Qwen3_5MoeForConditionalGeneration is test_battery's qwen3_5_moe cases,
on the checkpoint as transformers saves it (one tensor an expert); here the fused layout the
published checkpoints store."""
import os
import re

import pytest
import torch
from registry import REGISTRY
from safetensors.torch import load_file, save_file
from tinymodels import QUESTIONS

from pope_fast.engine import Engine, Settings

FAMILY = "qwen3_5_moe"  # whose checkpoint, model and oracle tests/families/conftest.py gives
ONE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def _fused(checkpoint, folder):
    """The checkpoint with each layer's experts stored as the published ones are: gate_up [E, 2 x
    width, hidden] (each expert's gate rows above its up rows) and down [E, hidden, width]; the
    other files hard links."""
    folder.mkdir()
    for path in checkpoint.iterdir():
        if path.name != "model.safetensors":
            os.link(path, folder / path.name)
    tensors, experts = {}, {}
    for name, tensor in load_file(checkpoint / "model.safetensors").items():
        if (match := ONE.match(name)) is None:
            tensors[name] = tensor
        else:
            experts.setdefault(match[1], {}).setdefault(match[3], {})[int(match[2])] = tensor
    for prefix, parts in experts.items():
        order = sorted(parts["down"])
        tensors[prefix + ".gate_up_proj"] = torch.stack([torch.cat([parts["gate"][j],
                                                                    parts["up"][j]])
                                                         for j in order])
        tensors[prefix + ".down_proj"] = torch.stack([parts["down"][j] for j in order])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.slow
def test_the_fused_experts_of_the_published_checkpoints_answer_as_the_saved_ones(checkpoint,
                                                                                 tmp_path):
    """The same weights stored fused give the same answers, bit for bit, as stored one tensor an
    expert."""
    fused = _fused(checkpoint, tmp_path / "fused")
    assert not any(".experts.0." in n for n in load_file(fused / "model.safetensors"))
    image = REGISTRY[FAMILY].images[0]
    answers = [Engine.load(folder, Settings(), readouts="template_aware")
               .answer(image, QUESTIONS[:2]) for folder in (checkpoint, fused)]
    assert [a.candidate_logits for a in answers[0]] == [a.candidate_logits for a in answers[1]]
    assert [a.first_token_id for a in answers[0]] == [a.first_token_id for a in answers[1]]
