"""The throughput benchmark's own logic on the CPU (its figures are reported, never asserted)."""
import pytest
from click.testing import CliRunner

from pope_fast.bench import BenchConfig, format_report, run_bench
from pope_fast.bench.throughput import BENCH_READOUTS
from pope_fast.cli import main
from pope_fast.engine import FAMILIES, Engine
from pope_fast.engine.models import family_class

pytestmark = pytest.mark.slow  # the benchmark runs both pipelines on tiny checkpoints


# One family of each way the reference builds its inputs and runs: llava-hf's processor on a batch,
# Qwen2-VL's stand-in processor one prompt at a time, InstructBLIP's question-reading Q-Former, and
# mPLUG-Owl2 without a class. Every family's reference inputs (engine/transformers_model.py
# TransformersInputs) are the battery's oracles' too (registry.Family.inputs_of), held against its
# class there.
@pytest.mark.parametrize("name", ["llava", "qwen2_vl", "instructblip", "mplug_owl2"])
def test_bench_runs_both_pipelines_and_they_agree(name, tmp_path):
    cfg = BenchConfig(models=[name], size="tiny", device="cpu", quant="none", dtype=None,
                      n_questions=12, reference_sample=6, work_dir=tmp_path)
    report = run_bench(cfg)
    entry, table = report["models"][name], format_report(report)
    ours = entry["pope_fast"]
    assert ours["questions"] == ours["unique_prompts"] == 12
    assert f"| {name} (tiny) | 12 (12 prompts) |" in table
    if family_class(name).reference_unavailable is not None:   # mPLUG-Owl2: said, not invented
        assert ("reference" not in entry
                and "no transformers class" in entry["reference_unavailable"])
        assert "no transformers class" in table
        return
    ref = entry["reference"]
    assert ref["questions"] == 6 and ref["sampled"] and ref["extrapolated_wall_s"] > ref["wall_s"]
    # same weights, fp32, same readout functions: every decision of the paper's pipeline is ours
    assert (set(entry["agreement"]) == set(BENCH_READOUTS)
            and set(entry["agreement"].values()) == {1.0}), name
    assert entry["speedup"] > 0 and set(ours["phases_s"]) == {"image_encode", "prefix_prefill",
                                                              "question_prefill", "decode"}
    if name == "llava":
        again = run_bench(cfg)   # a kept work dir starts the sweep afresh, not resumed
        assert again["models"]["llava"]["pope_fast"]["unique_prompts"] == 12


def test_bench_cli_rejects_unknown_models():
    result = CliRunner().invoke(main, ["bench", "--models", "llava,gpt5", "--device", "cpu"])
    assert result.exit_code != 0 and "unknown model(s) gpt5" in result.output


@pytest.mark.parametrize("name", list(FAMILIES))
def test_flop_floor_is_linear_in_the_work_and_counts_every_family(name, tiny, tmp_path):
    """Linear in the work counted (a --repeat run's counts must be one run's), and for every family
    the vision side is a real share: the tower's layers and patch embedding per token it reads."""
    from dataclasses import astuple

    from registry import REGISTRY

    from pope_fast.engine import Counts, Engine, Settings
    from pope_fast.engine.synthetic import mplug_owl2

    once = Counts(images_encoded=1, vision_tokens=577, prompts=3, prefix_tokens=12, suffix_tokens=9)
    twice = Counts(*(2 * v for v in astuple(once)))
    # the registry's checkpoint; mPLUG-Owl2, which the registry lacks (no transformers class),
    # its synthetic one
    checkpoint = tiny.checkpoint(name) if name in REGISTRY \
        else mplug_owl2.write_checkpoint(tmp_path / name, "tiny")
    model = Engine.load(checkpoint, Settings()).model
    assert model.matmul_flops(twice) == 2 * model.matmul_flops(once) > model.vision_flops(once) > 0
    image_only = Counts(vision_tokens=577)
    assert model.matmul_flops(image_only) == model.vision_flops(image_only) > 0


def test_repeat_times_every_run_cold_and_reports_the_median(tmp_path):
    cfg = BenchConfig(models=["llava"], size="tiny", device="cpu", quant="none", dtype=None,
                      n_questions=6, reference=False, repeat=3, work_dir=tmp_path)
    ours = run_bench(cfg)["models"]["llava"]["pope_fast"]
    assert len(ours["runs_s"]) == 3 and ours["wall_s"] == sorted(ours["runs_s"])[1]
    assert ours["unique_prompts"] == 6   # the third run evaluated everything again: nothing resumed
    assert ours["phases_s"]["image_encode"] > 0   # nor served from the first run's feature cache


def test_where_triton_runs_bench_sweeps_the_questions_untimed_before_timing_them_cold(
        tmp_path, monkeypatch):
    """Every Triton variant the timed run uses compiles before it: one untimed sweep of the same
    questions (a kernel compiles per shape class, which only the run's own batches make), then each
    timed run cold. Here bench is told its kernels are Triton's (the engine's own stay the torch
    references on the CPU)."""
    from pope_fast.bench import throughput

    sweeps = []
    run_plain = throughput.run_plain

    def counted(engine, questions, *args, **kwargs):
        sweeps.append((len(questions), engine.timings.synchronize))  # (questions, timed)
        return run_plain(engine, questions, *args, **kwargs)

    monkeypatch.setattr(throughput, "run_plain", counted)
    warmups = []
    warmup = Engine.warmup
    monkeypatch.setattr(Engine, "warmup", lambda self, images=None, prompts=None: (
        warmups.append((images, prompts)), warmup(self, images, prompts))[1])
    cfg = BenchConfig(models=["llava"], size="tiny", device="cpu", quant="none", dtype=None,
                      n_questions=6, reference=False, repeat=2, work_dir=tmp_path)
    run_bench(cfg)
    # the engine's warmup at the data's sizes (one image, six questions), as eval's
    assert warmups == [(1, 6)]
    assert sweeps == [(6, True)] * 2  # the torch references compile nothing: no untimed sweep
    sweeps.clear()
    monkeypatch.setattr(throughput, "resolve_backend", lambda backend, device: "triton")
    ours = run_bench(cfg)["models"]["llava"]["pope_fast"]
    assert sweeps == [(6, False), (6, True), (6, True)]
    # the timed runs cold still
    assert ours["unique_prompts"] == 6 and ours["phases_s"]["image_encode"] > 0


def test_bench_times_a_paired_run_cold_beside_the_baseline(tmp_path):
    cfg = BenchConfig(models=["llava"], size="tiny", device="cpu", quant="none", dtype=None,
                      n_questions=12, reference=False, repeat=2, work_dir=tmp_path,
                      methods=["none", "vcd"])
    report = run_bench(cfg)
    ours = report["models"]["llava"]["pope_fast"]
    paired = ours["paired"]
    assert paired["methods"] == ["none", "vcd"] and len(paired["runs_s"]) == 2
    assert paired["vs_baseline"] == round(paired["wall_s"] / ours["wall_s"], 2)
    # each timed run cold: the image and its noised copy encoded again, and the
    # noised prefixes prefilled
    assert (paired["counts"]["images_encoded"] == 2 * 2
            and paired["counts"]["prompts"] == 2 * ours["unique_prompts"])
    assert "| llava | none + vcd |" in format_report(report)
    refused = CliRunner().invoke(main, ["bench", "--models", "llava", "--device", "cpu",
                                        "--method", "dola"])
    assert refused.exit_code != 0 and "unknown method 'dola'" in refused.output


def test_eval_never_waits_on_the_phase_clock_and_bench_does(tmp_path, monkeypatch):
    """A stand-in for torch.cuda.synchronize, and every phase clock told its device is CUDA: bench's
    timed runs synchronise at each phase's start and end, a plain eval not once."""
    import torch
    from tinymodels import make_tiny_llava, write_pope_set

    from pope_fast.engine.utils import stats

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    entered = []
    init, enter = stats.Clock.__init__, stats.Clock.__enter__
    monkeypatch.setattr(stats.Clock, "__init__",
                        lambda self, t, f, d: init(self, t, f, torch.device("cuda", 0)))
    monkeypatch.setattr(stats.Clock, "__enter__",
                        lambda self: (entered.append(getattr(self.timings, "synchronize", None)),
                                      enter(self))[1])
    checkpoint = make_tiny_llava(tmp_path / "ckpt", builtin_tokenizer=True)
    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    result = CliRunner().invoke(main, ["eval", "--model", str(checkpoint), "--images", str(images),
                                       "--questions", str(files[0]), "--out", str(tmp_path / "out"),
                                       "--device", "cpu", "--readouts", "legacy_2tok"])
    assert result.exit_code == 0, result.output
    assert entered and calls == [] and not any(entered)  # phases timed, the device never waited for
    cfg = BenchConfig(models=["llava"], size="tiny", device="cpu", quant="none", dtype=None,
                      n_questions=6, reference=False, work_dir=tmp_path / "bench")
    entered.clear()
    run_bench(cfg)
    timed = entered.count(True)  # the timed run's phases (the warmup's, before it, are not)
    assert timed >= 3 and calls == [torch.device("cuda", 0)] * (2 * timed)
def test_bench_says_what_its_floor_is_and_leaks_no_transformers_warning(tmp_path):
    """transformers warned twice: of the mplug_owl2 config its AutoTokenizer read, and of the random
    Gemma 3's lm_head, stored with other values than the embeddings its config ties it to."""
    import logging

    heard = []

    class Heard(logging.Handler):
        def emit(self, record):
            heard.append(record.getMessage())

    handler = Heard(logging.WARNING)
    logging.getLogger("transformers").addHandler(handler)
    try:
        result = CliRunner().invoke(main, ["bench", "--models", "gemma3,mplug_owl2",
                                           "--questions", "2", "--reference-sample", "2",
                                           "--device", "cpu", "--work-dir", str(tmp_path)])
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert result.exit_code == 0, result.output
    assert heard == []
    assert "floor s: the time the sweep's unavoidable matmul FLOPs would take at this device's " \
           "own measured matmul rate (" in result.output \
        and "| gemma3 (tiny) | 2 (2 prompts) |" in result.output
