"""Issue 36 §3: `pope-fast verify --model DIR` holds the engine against transformers' class on the user's
checkpoint: it agrees (exit 0) on a family of each input path's tiny checkpoint, says there is nothing to compare where there is
no class or no family, and catches a wrong engine (exit 1, the first disagreement named)."""
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.engine.moe import ExpertMLP

pytestmark = pytest.mark.slow  # both the engine and transformers' class, on tiny checkpoints


def verify(*args, questions: int = 2):
    return CliRunner().invoke(main, ["verify", *map(str, args), "--device", "cpu", "--questions", str(questions)])


# One family of each input path of the reference (a batched processor, Qwen's stand-in one prompt at a time, a
# Q-Former reading the question, a chat template over tiles) and the MoE routing; every family's reference inputs are
# the battery's oracles' (registry.Family.inputs_of), and bench/device_check.sh runs verify on every family on a GPU.
@pytest.mark.parametrize("name", ["llava", "qwen2_vl", "instructblip", "internvl", "qwen3_vl_moe"])
def test_every_family_agrees_with_its_class(name, tiny):
    result = verify("--model", tiny.checkpoint(name))
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1] == "agree" and "argmax equal 2/2; continuations equal 2/2" in result.output
    assert "decisions equal: legacy_2tok 2/2, legacy_8tok 2/2, dynamic_single 2/2, template_aware 2/2" in result.output


def test_a_wrong_engine_is_caught(tiny, monkeypatch):
    """Each token routed to the experts it should not get: the logits move, verify names it and exits 1."""
    route = ExpertMLP.route

    def wrong(self, x):
        weights, experts = route(self, x)
        return weights, (experts + 1) % self.router.shape[0]

    monkeypatch.setattr(ExpertMLP, "route", wrong)
    result = verify("--model", tiny.checkpoint("qwen3_vl_moe"))
    assert result.exit_code == 1, result.output
    assert "DISAGREE: a candidate logit differs by" in result.output and "over the bound 0.0001" in result.output


def test_nothing_to_compare_without_a_class_or_a_family(tmp_path, shared):
    """mPLUG-Owl2 has no transformers class; a model_type the engine has no family for has only transformers'."""
    result = verify("--model", shared / "fixtures" / "mplug_owl2_tiny" / "checkpoint")
    assert result.exit_code == 0 and "nothing to compare (no transformers class" in result.output, result.output
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    result = verify("--model", folder)
    assert result.exit_code == 0 and "nothing to compare (model_type 'paligemma' is not supported" in result.output
    # a llava of Qwen2 and SigLIP (llava-interleave's kind) is no LLaVA-1.5: the backend is its only path
    (folder / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": {"model_type": "qwen2"},
                                                    "vision_config": {"model_type": "siglip_vision_model"}}))
    result = verify("--model", folder)
    assert result.exit_code == 0 and ("nothing to compare (model_type 'llava' with text_config 'qwen2' and "
                                      "vision_config 'siglip_vision_model': the engine's LLaVA-1.5") in result.output


def test_the_users_images_and_a_bad_images_folder(tiny, tmp_path):
    from tinymodels import synthetic_image

    images = tmp_path / "images"
    images.mkdir()
    synthetic_image(3, (80, 60)).save(images / "a.png")
    result = verify("--model", tiny.checkpoint("llava"), "--images", images)
    assert result.exit_code == 0 and result.output.strip().splitlines()[-1] == "agree", result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = verify("--model", tiny.checkpoint("llava"), "--images", empty)
    assert refused.exit_code == 1 and f"--images {empty}: 1 images wanted (JPEG or PNG), 0 found" in refused.output
