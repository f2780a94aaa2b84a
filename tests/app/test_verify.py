"""Issue 36 §3: `pope-fast verify --model DIR` holds the engine against transformers' class on the
user's checkpoint: it agrees (exit 0) on a family of each input path's tiny checkpoint, says there
is nothing to compare where there is no class or no family (exit 3, issue 49: a gate never passes
having checked nothing), and catches a wrong engine or a non-finite logit (exit 1, the first
disagreement named)."""
import json
import math

import pytest
import torch
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.engine.core import Answer
from pope_fast.engine.layers.moe import ExpertMLP
from pope_fast.engine.synthetic import builtin_tokenizer
from pope_fast.readout import TokenSets
from pope_fast.verify import NOTHING_VERIFIED, Ours, Verdict, compare_one

slow = pytest.mark.slow  # both the engine and transformers' class, on tiny checkpoints


def verify(*args, questions: int = 2):
    return CliRunner().invoke(main, ["verify", *map(str, args), "--device", "cpu", "--questions",
                                     str(questions)])


# One family of each input path of the reference (a batched processor, Qwen's stand-in one prompt at
# a time, a Q-Former reading the question, a chat template over tiles) and the MoE routing; every
# family's reference inputs are the battery's oracles' (registry.Family.inputs_of), and
# bench/device_check.sh runs verify on every family on a GPU.
@slow
@pytest.mark.parametrize("name", ["llava", "qwen2_vl", "instructblip", "internvl", "qwen3_vl_moe"])
def test_every_family_agrees_with_its_class(name, tiny):
    result = verify("--model", tiny.checkpoint(name))
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1] == "agree" and "argmax equal 2/2; continuations equal 2/2" in result.output
    assert ("decisions equal: legacy_2tok 2/2, legacy_8tok 2/2, dynamic_single 2/2, "
            "template_aware 2/2") in result.output


@slow
def test_a_wrong_engine_is_caught(tiny, monkeypatch):
    """Each token routed to the experts it should not get: the logits move, verify names it and
    exits 1."""
    route = ExpertMLP.route

    def wrong(self, x):
        weights, experts = route(self, x)
        return weights, (experts + 1) % self.router.shape[0]

    monkeypatch.setattr(ExpertMLP, "route", wrong)
    result = verify("--model", tiny.checkpoint("qwen3_vl_moe"))
    assert result.exit_code == 1, result.output
    assert ("DISAGREE: a candidate logit differs by" in result.output
            and "over the bound 0.0001" in result.output)


def test_nothing_to_compare_is_its_own_exit_status(tmp_path, shared):
    """mPLUG-Owl2 has no transformers class; a model_type the engine has no family for has only
    transformers'."""
    result = verify("--model", shared / "fixtures" / "mplug_owl2_tiny" / "checkpoint")
    assert result.exit_code == NOTHING_VERIFIED == 3, result.output
    assert "nothing to compare (no transformers class" in result.output
    assert result.output.strip().endswith("nothing verified (exit status 3)")
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    result = verify("--model", folder)
    assert (result.exit_code == 3
            and "nothing to compare (model_type 'paligemma' is not supported" in result.output)
    # a llava of Qwen2 and SigLIP (llava-interleave's kind) is no LLaVA-1.5: the backend is its
    # only path
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llava", "text_config": {"model_type": "qwen2"},
        "vision_config": {"model_type": "siglip_vision_model"}}))
    result = verify("--model", folder)
    assert result.exit_code == 3 and ("nothing to compare (model_type 'llava' with text_config "
                                      "'qwen2' and vision_config 'siglip_vision_model': the "
                                      "engine's LLaVA-1.5") in result.output


def test_the_exit_statuses_are_in_the_help():
    shown = " ".join(CliRunner().invoke(main, ["verify", "--help"]).output.split())
    assert "exit 0 agree, 1 disagree, 3 nothing verified" in shown


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """The comparison's view of an engine: two readouts' token sets, the stand-in tokenizer,
    fp32."""
    tokenizer = builtin_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    return Ours({"legacy_2tok": TokenSets((yes,), (no,))}, {2}, tokenizer, torch.float32), yes, no


def _logits(values: dict[int, float], size: int = 400) -> torch.Tensor:
    logits = torch.full((size,), -5.0)
    for i, v in values.items():
        logits[i] = v
    return logits


def _answer(ours, logits: dict[int, float], first: int, decoded: str = "yes") -> Answer:
    return Answer(first_token_id=first, candidate_logits=logits, decoded=decoded,
                  question="Is there a dog?",
                  predictions=
{"legacy_2tok": "yes" if logits[ours[1]] > logits[ours[2]] else "no"})


def test_equal_finite_logits_agree_and_a_difference_over_the_bound_does_not(ours):
    _, yes, no = ours
    verdict = Verdict("m")
    compare_one(verdict, ours[0], "q", _answer(ours, {yes: 2.0, no: 1.0}, yes),
                _logits({yes: 2.0, no: 1.0}), [yes, 2])
    assert (verdict.agrees and verdict.worst_logit == 0.0
            and verdict.argmax_equal == verdict.continuations_equal == 1)
    compare_one(verdict, ours[0], "q", _answer(ours, {yes: 2.0, no: 1.25}, yes),
                _logits({yes: 2.0, no: 1.0}), [yes, 2])
    # the bound is the caller's: verify() fails it
    assert verdict.worst_logit == 0.25 and verdict.agrees


@pytest.mark.parametrize("side", ["here", "in transformers", "both"])
def test_a_non_finite_candidate_logit_is_a_disagreement(ours, side):
    """Issue 49: max(0.0, nan) is 0.0 and nan > bound is False, so a NaN on both sides passed as
    agreement."""
    _, yes, no = ours
    mine = {yes: math.nan if side != "in transformers" else 2.0, no: 1.0}
    theirs = {yes: math.nan if side != "here" else 2.0, no: 1.0}
    verdict = Verdict("m")
    compare_one(verdict, ours[0], "q1", _answer(ours, {yes: 2.0, no: 1.0}, yes),
                _logits({yes: 2.0, no: 1.0}), [yes, 2])
    compare_one(verdict, ours[0], "q2", _answer(ours, mine, yes), _logits(theirs), [yes, 2])
    compare_one(verdict, ours[0], "q3", _answer(ours, {yes: 2.0, no: 1.0}, yes),
                _logits({yes: 2.0, no: 1.0}), [yes, 2])
    assert (not verdict.agrees and math.isnan(verdict.worst_logit)
            and len(verdict.disagreements) == 1)
    assert verdict.disagreements[0].startswith("'q2': candidate logits not finite ")
    assert (f"here ({yes}: nan)" in verdict.disagreements[0]) == (side != "in transformers")
    assert (f"in transformers ({yes}: nan)" in verdict.disagreements[0]) == (side != "here")
    assert verdict.exit_status == 1 and "worst candidate-logit difference nan" in verdict.summary()


@slow
def test_the_users_images_and_a_bad_images_folder(tiny, tmp_path):
    from tinymodels import synthetic_image

    images = tmp_path / "images"
    images.mkdir()
    synthetic_image(3, (80, 60)).save(images / "a.png")
    result = verify("--model", tiny.checkpoint("llava"), "--images", images)
    assert (result.exit_code == 0
            and result.output.strip().splitlines()[-1] == "agree"), result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = verify("--model", tiny.checkpoint("llava"), "--images", empty)
    assert (refused.exit_code == 1
            and f"--images {empty}: 1 images wanted (JPEG or PNG), 0 found" in refused.output)
