"""The throughput benchmark's own logic on the CPU (its figures are reported, never asserted)."""
import pytest
from click.testing import CliRunner

from pope_fast.bench import BenchConfig, format_report, run_bench
from pope_fast.bench.throughput import BENCH_READOUTS
from pope_fast.cli import main
from pope_fast.engine import FAMILIES

pytestmark = pytest.mark.slow  # the benchmark runs both pipelines on tiny checkpoints


def test_bench_runs_both_pipelines_and_they_agree(tmp_path):
    cfg = BenchConfig(models=list(FAMILIES), size="tiny", device="cpu", quant="none", dtype=None,
                      n_questions=12, reference_sample=6, work_dir=tmp_path)
    report = run_bench(cfg)
    supported = {"llava", "llava_next", "instructblip", "qwen2_vl", "qwen2_5_vl", "llava_onevision",
                 "internvl", "qwen3_vl", "gemma3"}  # with a transformers reference
    assert set(report["models"]) == {*supported, "mplug_owl2"}   # every seed family runs
    owl = report["models"]["mplug_owl2"]
    assert owl["pope_fast"]["questions"] == owl["pope_fast"]["unique_prompts"] == 12
    assert "reference" not in owl and "no transformers class" in owl["reference_unavailable"]   # said, not invented
    for name in supported:
        entry = report["models"][name]
        ours, ref = entry["pope_fast"], entry["reference"]
        assert ours["questions"] == ours["unique_prompts"] == 12
        assert ref["questions"] == 6 and ref["sampled"] and ref["extrapolated_wall_s"] > ref["wall_s"]
        # same weights, fp32, same readout functions: every decision of the paper's pipeline is ours
        assert set(entry["agreement"]) == set(BENCH_READOUTS) and set(entry["agreement"].values()) == {1.0}, name
        assert entry["speedup"] > 0 and set(ours["phases_s"]) == {"image_encode", "prefix_prefill",
                                                                  "question_prefill", "decode"}
    table = format_report(report)
    assert all(f"| {name} (tiny) | 12 (12 prompts) |" in table for name in supported)
    assert "| mplug_owl2 (tiny) | 12 (12 prompts) |" in table and "no transformers class" in table
    again = run_bench(cfg)   # a kept work dir starts the sweep afresh instead of resuming it
    assert again["models"]["llava"]["pope_fast"]["unique_prompts"] == 12


def test_bench_cli_rejects_unknown_models():
    result = CliRunner().invoke(main, ["bench", "--models", "llava,gpt5", "--device", "cpu"])
    assert result.exit_code != 0 and "unknown model(s) gpt5" in result.output


def test_flop_floor_is_linear_in_the_work_and_counts_every_family(tmp_path):
    """Linear in the work counted (a --repeat run's counts must be one run's), and for every family
    the vision side is a real share: the tower's layers and patch embedding per token it reads."""
    from dataclasses import astuple

    from tinymodels import (make_tiny_gemma3, make_tiny_instructblip, make_tiny_llava, make_tiny_llava_next,
                            make_tiny_qwen2_5_vl, make_tiny_qwen2_vl, make_tiny_qwen3_vl)

    from pope_fast.engine import Engine, Settings
    from pope_fast.engine.synthetic import mplug_owl2 as mplug_owl2_checkpoints
    from pope_fast.engine import Counts

    once = Counts(images_encoded=1, vision_tokens=577, prompts=3, prefix_tokens=12, suffix_tokens=9)
    twice = Counts(*(2 * v for v in astuple(once)))
    def make_tiny_mplug_owl2(folder, builtin_tokenizer):
        return mplug_owl2_checkpoints.write_checkpoint(folder, "tiny")

    for make in (make_tiny_llava, make_tiny_llava_next, make_tiny_instructblip, make_tiny_qwen2_vl, make_tiny_mplug_owl2,
                 make_tiny_qwen2_5_vl, make_tiny_qwen3_vl, make_tiny_gemma3):
        engine = Engine.load(make(tmp_path / make.__name__, builtin_tokenizer=True), Settings())
        model = engine.model
        assert model.matmul_flops(twice) == 2 * model.matmul_flops(once) > model.vision_flops(once) > 0
        image_only = Counts(vision_tokens=577)
        assert model.matmul_flops(image_only) == model.vision_flops(image_only) > 0, make.__name__


def test_repeat_times_every_run_cold_and_reports_the_median(tmp_path):
    cfg = BenchConfig(models=["llava"], size="tiny", device="cpu", quant="none", dtype=None, n_questions=6,
                      reference=False, repeat=3, work_dir=tmp_path)
    ours = run_bench(cfg)["models"]["llava"]["pope_fast"]
    assert len(ours["runs_s"]) == 3 and ours["wall_s"] == sorted(ours["runs_s"])[1]
    assert ours["unique_prompts"] == 6   # the third run evaluated everything again: nothing resumed
    assert ours["phases_s"]["image_encode"] > 0   # nor served from the first run's feature cache


def test_bench_times_a_paired_run_cold_beside_the_baseline(tmp_path):
    cfg = BenchConfig(models=["llava"], size="tiny", device="cpu", quant="none", dtype=None, n_questions=12,
                      reference=False, repeat=2, work_dir=tmp_path, methods=["none", "vcd"])
    report = run_bench(cfg)
    ours = report["models"]["llava"]["pope_fast"]
    paired = ours["paired"]
    assert paired["methods"] == ["none", "vcd"] and len(paired["runs_s"]) == 2
    assert paired["vs_baseline"] == round(paired["wall_s"] / ours["wall_s"], 2)
    # each timed run cold: the image and its noised copy encoded again, and the noised prefixes prefilled
    assert paired["counts"]["images_encoded"] == 2 * 2 and paired["counts"]["prompts"] == 2 * ours["unique_prompts"]
    assert "| llava | none + vcd |" in format_report(report)
    refused = CliRunner().invoke(main, ["bench", "--models", "llava", "--device", "cpu", "--method", "dola"])
    assert refused.exit_code != 0 and "unknown method 'dola'" in refused.output


def test_bench_gemma3_tiny_runs_both_pipelines_and_they_agree(tmp_path):
    """Gemma 3 alone (its 262,208-row vocabulary makes it the slowest tiny family): the reference is
    Gemma3ForConditionalGeneration on Gemma3Processor's inputs (token_type_ids, no second <bos>), and every
    decision of it is ours."""
    cfg = BenchConfig(models=["gemma3"], size="tiny", device="cpu", quant="none", dtype=None, n_questions=8,
                      reference_sample=4, work_dir=tmp_path)
    entry = run_bench(cfg)["models"]["gemma3"]
    ours, ref = entry["pope_fast"], entry["reference"]
    assert ours["questions"] == ours["unique_prompts"] == 8 and ref["questions"] == 4
    assert set(entry["agreement"]) == set(BENCH_READOUTS) and set(entry["agreement"].values()) == {1.0}
