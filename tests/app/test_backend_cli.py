"""Every command end to end on a model the engine has no family for (a tiny Idefics3 of a Mistral
language model, which no family of the engine implements: image splitting, run by the transformers
backend): eval (paired, with its notice and meta.json's backend), score, compare, report, a resume
that gives the same bytes, torchrun's weighing of its images, and bench against the reference."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from pope_fast.cli import main
from pope_fast.engine.synthetic import (Weights, builtin_questions, family_checkpoints,
                                        write_checkpoint, write_images, write_question_file)

pytestmark = pytest.mark.slow  # whole commands on a tiny checkpoint


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("backend-cli")
    tiny = family_checkpoints("idefics3").SIZES["tiny"]
    mistral = dict(tiny, text=dict(tiny["text"], model_type="mistral"))
    checkpoint = write_checkpoint("idefics3", root / "idefics3", mistral,
                                  weights=Weights(init="model", dtype=torch.float32, std=0.2))
    questions = builtin_questions(12, "demo")
    write_question_file(root / "demo_pope.json", questions)
    write_images(root / "images", [q.image for q in questions])
    args = ["eval", "--model", str(checkpoint), "--questions", str(root / "demo_pope.json"),
            "--split", "demo", "--images", str(root / "images"), "--max-new-tokens", "3",
            "--batch-size", "4", "--image-batch", "1", "--device", "cpu"]
    return root, args


def _invoke(*args, stream: str = "stdout") -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return getattr(result, stream)


def test_eval_score_compare_report_and_resume(job):
    root, args = job
    out = root / "paired"
    told = _invoke(*args, "--out", out, "--method", "none", "--method", "vcd", stream="stderr")
    assert "idefics3 (transformers): the reference path" in told
    meta = json.loads((out / "none/meta.json").read_text())
    assert meta["model"]["backend"] == "transformers" and meta["template"] == "reference_chat"
    [pair] = json.loads((out / "compare.json").read_text())["pairs"]
    assert pair["method_b"]["name"] == "vcd"
    assert "dynamic_single" in _invoke("score", out / "none")
    assert "ΔF1" in _invoke("compare", out / "none", out / "vcd")
    _invoke("report", out, "--out", root / "report", "--formats", "png")
    assert (root / "report/report.html").is_file()

    records = out / "none/records.jsonl"
    whole = records.read_bytes()
    lines = whole.splitlines(keepends=True)
    records.write_bytes(b"".join(lines[:5]))  # a run stopped after its first records
    _invoke(*args, "--out", out, "--method", "none", "--method", "vcd")
    assert records.read_bytes() == whole
    moved = CliRunner().invoke(main, [*args, "--out", str(out / "none"), "--backend", "engine"])
    assert (moved.exit_code != 0
            and "--backend transformers runs it through transformers' own class" in moved.output)


def test_torchrun_weighs_each_image_by_the_classes_own_tokens(job):
    """What torchrun's step assignment reads of a model (distributed.image_costs): the tokens the
    class's processor gives an image (Idefics3's tiles and global view) and each distinct prompt;
    the ranks' runs themselves are the engine's (tests/app/test_distributed.py)."""
    from pope_fast.distributed import image_costs
    from pope_fast.engine import Settings, load_engine
    from pope_fast.readout import load_questions

    root, args = job
    engine = load_engine(args[args.index("--model") + 1], Settings(), readouts="dynamic_single")
    questions = load_questions(root / "demo_pope.json")
    costs = image_costs(questions, engine)
    tiles = engine.model.vision_tokens(Image.new("RGB", (640, 480)))
    assert tiles == 5 * 4  # 2 x 2 tiles and the global view, 4 tokens each after the pixel shuffle
    prompts = {q.image: [] for q in questions}
    for q in questions:
        prompts[q.image].append(len(engine.model.tokenizer(engine.prompt(q.text))["input_ids"]))
    assert costs == {name: tiles + sum(lengths) for name, lengths in prompts.items()}


def test_bench_times_it_against_the_reference(job, tmp_path):
    report = json.loads(_invoke("bench", "--models", "paligemma", "--questions", "6", "--device",
                                "cpu", "--work-dir", tmp_path, "--format", "json"))
    entry = report["models"]["paligemma"]
    assert entry["reference"]["questions"] == 6 and set(entry["agreement"].values()) == {1.0}, entry


@pytest.mark.parametrize("kind", ["mllama", "paligemma", "blip2"])
def test_each_kind_runs_a_paired_eval_score_and_compare(kind, job, tmp_path):
    """The other kinds the backend was tested on (cross-attention, prefix-LM, Q-Former) through the
    same commands: a paired run (VCD beside the baseline), its scores and its comparison.
    (Qwen3-VL-MoE on the backend: its records against the class,
    tests/engine/test_transformers_backend.py; the commands above the records are the same.)"""
    root, args = job
    folder = write_checkpoint(kind, tmp_path / kind,
                              weights=Weights(init="model", dtype=torch.float32, std=0.2))
    run = [*args[:2], str(folder), *args[3:], "--backend", "transformers", "--out",
           tmp_path / "run"]
    _invoke(*run, "--method", "none", "--method", "vcd")
    assert (json.loads((tmp_path / "run/vcd/meta.json").read_text())["model"]["backend"]
            == "transformers")

    assert "dynamic_single" in _invoke("score", tmp_path / "run/none")
    assert "ΔF1" in _invoke("compare", tmp_path / "run/none", tmp_path / "run/vcd")


def test_a_llava_of_qwen2_and_siglip_is_told_and_asked_its_own_chat_template(job, tmp_path):
    """llava-interleave's kind on the default backend: one line says why the engine's LLaVA-1.5 does
    not run it, and the run is the transformers backend's with the checkpoint's own chat template
    (meta.json's prompt)."""
    from pope_fast.engine.synthetic.llava import write_interleave_checkpoint

    root, args = job
    folder = write_interleave_checkpoint(tmp_path / "interleave",
                                         weights=Weights(init="model", dtype=torch.float32))
    told = _invoke(*args[:2], folder, *args[3:], "--limit", 2, "--out", tmp_path / "run",
                   stream="stderr")
    assert ("model_type 'llava' with text_config 'qwen2' and vision_config 'siglip_vision_model': "
            "the engine's LLaVA-1.5 implements text_config 'llama' and vision_config "
            "'clip_vision_model'; it runs as a model without a family: on the transformers "
            "backend, with the checkpoint's own chat template and processor") \
        in told.splitlines()
    assert "llava (transformers): the reference path" in told
    meta = json.loads((tmp_path / "run/meta.json").read_text())
    assert (meta["template"], meta["model"]["backend"]) == ("reference_chat", "transformers")
    assert meta["prompt_example"] == ("USER: <image>\nIs there a dog in the image? Answer yes or "
                                      "no only. ASSISTANT:")

