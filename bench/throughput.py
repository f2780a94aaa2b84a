"""`pope-fast bench`: pope-fast against the pipeline the paper ran, side by side on the same questions.

The reference is the transformers model itself, one question at a time,
`generate(max_new_tokens=1, output_scores=True)` with the logits read from `scores[0]` (bitsandbytes NF4
on CUDA, as published); pope-fast is the engine's sweep, records and summaries included. The two never
share code beyond the readout functions that turn logits into decisions.
"""
from __future__ import annotations

import gc
import json
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..engine import FAMILIES, Counts, Engine, Settings, Shard, parse_method, run_paired, run_pope
from ..engine.models import family_class
from ..engine.synthetic import builtin_questions, write_images
from ..readout import READOUTS, Question, load_questions
from ..readout.protocols import FIRST_TOKEN, LOGIT
from ..readout.records import json_lines

BENCH_READOUTS = [n for n, r in READOUTS.items() if r.kind in (LOGIT, FIRST_TOKEN)]


@dataclass
class BenchConfig:
    models: list[str]
    size: str  # tiny | 7b
    device: str
    quant: str  # none | nf4 (both sides)
    dtype: str | None
    n_questions: int
    pope_dir: Path | None = None
    reference: bool = True
    reference_sample: int | None = None  # questions the reference runs (None: all)
    repeat: int = 1  # timed runs of each pipeline; the median counts
    batch_size: int = 32
    probe: str = "none"  # image-attention: pope-fast records the probe too (what it costs shows in the wall time)
    work_dir: Path | None = None
    model_dirs: dict[str, Path] = field(default_factory=dict)
    tokenizer_dir: Path | None = None
    shard: Shard | None = None  # under torchrun: each rank times its share of the questions
    methods: list[str] = field(default_factory=list)  # --method specs: a paired run timed beside the baseline


def median_run(runs: list, key=None):
    """The run in the middle (the lower of the two middle ones for an even count): a run that
    happened, so its phases belong to its wall time."""
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator counter, or on Linux the process's VmHWM (writing 5 to
    /proc/self/clear_refs resets it), so each pipeline's peak is its own."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # elsewhere the peak stays the process's lifetime peak


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak allocated; CPU: peak resident set since the last reset (VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().split("\n"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measured_bf16_tflops(device: torch.device) -> float:
    """The device's dense bf16 matmul rate, measured (8192³, best of 10)."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * 8192**3 / best / 1e12


def _questions(cfg: BenchConfig) -> list[Question]:
    if cfg.pope_dir is None:
        return builtin_questions(cfg.n_questions)
    files = sorted(Path(cfg.pope_dir).glob("*pope*.json"))  # the RUCAIBox names; not PROVENANCE.json & co
    if not files:
        raise FileNotFoundError(f"{cfg.pope_dir}: no POPE question files (*pope*.json)")
    questions = [q for f in files for q in load_questions(f)]
    return questions[: cfg.n_questions] if cfg.n_questions else questions


@dataclass
class ReadoutSpec:
    """What the reference needs of the engine, so the engine's weights can be freed first."""

    prompts: dict[str, str]
    candidate_ids: list[int]
    token_sets: dict
    readouts: list[str]


def _reference(checkpoint: Path, spec: ReadoutSpec, questions: list[Question], images: Path, settings: Settings,
               repeat: int, progress: Callable[[int], None] | None) -> tuple[dict, dict]:
    """The paper's pipeline, one question at a time; returns its figures and its decisions."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig

    device = settings.torch_device
    kwargs = {"dtype": settings.torch_dtype}
    if settings.quant == "nf4":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=settings.torch_dtype)
        kwargs["device_map"] = str(device)
    reset_peak_memory(device)
    model = AutoModelForImageTextToText.from_pretrained(str(checkpoint), **kwargs).eval()
    if settings.quant != "nf4":
        model.to(device)
    processor = family_class(model.config.model_type).reference_processor(checkpoint)

    def answer(q: Question):
        inputs = processor(images=Image.open(images / q.image), text=spec.prompts[q.text], return_tensors="pt")
        inputs = {k: v.to(device) for k, v in inputs.items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(settings.torch_dtype)
        with torch.inference_mode():
            return model.generate(**inputs, max_new_tokens=1, do_sample=False, output_scores=True,
                                  return_dict_in_generate=True)

    answer(questions[0])  # untimed, as pope-fast's warmup: one-time costs are not per-question costs
    walls = []
    for _ in range(repeat):
        decisions = {}
        start = time.perf_counter()
        for q in questions:
            out = answer(q)
            scores = out.scores[0][0].float()
            logits = {i: float(scores[i]) for i in spec.candidate_ids}
            first = int(out.sequences[0, -1])
            decisions[q.split, q.key] = {n: READOUTS[n](spec.token_sets.get(n), logits, first, None)
                                         for n in spec.readouts if READOUTS[n].kind in (LOGIT, FIRST_TOKEN)}
            if progress:
                progress(1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        walls.append(time.perf_counter() - start)
    wall = median_run(walls)
    figures = {"questions": len(questions), "wall_s": round(wall, 3), "questions_per_s": round(len(questions) / wall, 2),
               "runs_s": [round(w, 3) for w in walls], "peak_memory_mb": round(peak_memory_mb(device), 1)}
    return figures, decisions


def bench_model(name: str, cfg: BenchConfig, work: Path, progress: Callable[[str, int, int], None] | None = None
                ) -> dict:
    settings = Settings(device=cfg.device, dtype=cfg.dtype, quant=cfg.quant, batch_size=cfg.batch_size,
                        probe=cfg.probe)
    checkpoint = cfg.model_dirs.get(name)
    if checkpoint is None:
        checkpoint = family_class(name).write_checkpoint(
            work / f"{name}-{cfg.size}", cfg.size, tokenizer_dir=cfg.tokenizer_dir,
            dtype=torch.float32 if settings.torch_dtype == torch.float32 else torch.float16,
            device=cfg.device if cfg.size == "7b" else "cpu")
    questions = _questions(cfg)
    images = write_images(work / "images", [q.image for q in questions])
    device = settings.torch_device

    reset_peak_memory(device)
    load_start = time.perf_counter()
    # The reference pipeline reads one token (max_new_tokens=1), so both sides run the readouts that
    # need no continuation: every logit readout and first_token.
    engine = Engine.load(checkpoint, settings, readouts=BENCH_READOUTS)
    engine.warmup()
    engine.meta()  # hashes the checkpoint's files once (what a resume is proven by), outside the timed runs
    load_s = time.perf_counter() - load_start
    if cfg.shard is not None:
        return _bench_shard(name, cfg, engine, questions, images, work, load_s)
    tick = (lambda n: progress(f"{name} pope-fast", n, len(questions) * cfg.repeat)) if progress else None
    records_dir = work / f"{name}-records"
    runs = []  # (wall, phases, counts) per timed run
    for _ in range(cfg.repeat):
        # Every run starts cold: no records to resume (a kept --work-dir too), no cached image features.
        shutil.rmtree(records_dir, ignore_errors=True)
        engine.reset(clear_cache=True)
        start = time.perf_counter()
        result = run_pope(engine, questions, images, records_dir, progress=tick)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        runs.append((time.perf_counter() - start, engine.timings.to_json(), engine.counts))
    wall, phases, counts = median_run(runs, key=lambda r: r[0])
    ours = {"questions": len(questions), "unique_prompts": result.evaluated_prompts, "wall_s": round(wall, 3),
            "questions_per_s": round(len(questions) / wall, 2), "runs_s": [round(r[0], 3) for r in runs],
            "load_s": round(load_s, 2),  # warmup included
            "phases_s": phases, "peak_memory_mb": round(peak_memory_mb(device), 1),
            "settings": settings.to_json()}
    if cfg.methods:
        tick = (lambda n: progress(f"{name} paired", n, len(questions) * cfg.repeat)) if progress else None
        ours["paired"] = _bench_paired(cfg, engine, questions, images, work / f"{name}-paired", ours["wall_s"], tick)
    flops = engine.model.matmul_flops(counts)
    if device.type == "cuda":
        rate = measured_bf16_tflops(device)
        floor = flops / (rate * 1e12)
        ours.update({"matmul_tflop": round(flops / 1e12, 2), "device_bf16_tflops": round(rate, 1),
                     "floor_s": round(floor, 2), "ratio_to_floor": round(wall / floor, 2)})
    entry = {"checkpoint": str(checkpoint), "size": cfg.size if name not in cfg.model_dirs else "checkpoint",
             "pope_fast": ours}
    unavailable = family_class(name).reference_unavailable
    if not cfg.reference or unavailable:
        if cfg.reference:
            entry["reference_unavailable"] = unavailable
        return entry

    sample = questions[: cfg.reference_sample] if cfg.reference_sample else questions
    spec = ReadoutSpec({q.text: engine.prompt(q.text) for q in sample}, engine.candidate_ids, engine.token_sets,
                       engine.readouts)
    del engine, result  # the reference's peak memory must not include our weights
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    tick = (lambda n: progress(f"{name} reference", n, len(sample) * cfg.repeat)) if progress else None
    ref, ref_decisions = _reference(checkpoint, spec, sample, images, settings, cfg.repeat, tick)
    ref["extrapolated_wall_s"] = round(ref["wall_s"] * len(questions) / len(sample), 3)
    ref["sampled"] = len(sample) < len(questions)
    records = {(r["split"], str(r["question_id"])): r["predictions"]
               for r in (json.loads(line) for _, line in json_lines((records_dir / "records.jsonl").read_text()))}
    names = list(next(iter(ref_decisions.values())))
    agreement = {n: round(sum(records[k][n] == d[n] for k, d in ref_decisions.items()) / len(ref_decisions), 4)
                 for n in names}
    entry.update({"reference": ref, "speedup": round(ref["extrapolated_wall_s"] / wall, 2), "agreement": agreement})
    return entry


def _bench_paired(cfg: BenchConfig, engine: Engine, questions: list[Question], images: Path, out: Path,
                  baseline_wall: float, tick) -> dict:
    """The methods as one paired sweep (`eval --method`), each timed run cold as the baseline's, and its
    cost against the baseline sweep timed just before in the same process."""
    methods = [parse_method(spec) for spec in cfg.methods]
    runs = []
    for _ in range(cfg.repeat):
        shutil.rmtree(out, ignore_errors=True)
        engine.reset(clear_cache=True)
        start = time.perf_counter()
        run_paired(engine, questions, images, out, methods, progress=tick)
        if engine.settings.torch_device.type == "cuda":
            torch.cuda.synchronize(engine.settings.torch_device)
        runs.append((time.perf_counter() - start, engine.timings.to_json(), engine.counts))
    wall, phases, counts = median_run(runs, key=lambda r: r[0])
    wall = round(wall, 3)  # the ratio of the two walls as reported, so the report reads consistently
    return {"methods": [m.name for m in methods], "wall_s": wall, "runs_s": [round(r[0], 3) for r in runs],
            "vs_baseline": round(wall / baseline_wall, 2), "phases_s": phases,
            "counts": {"images_encoded": counts.images_encoded, "prompts": counts.prompts,
                       "prefix_tokens": counts.prefix_tokens, "suffix_tokens": counts.suffix_tokens}}


def _bench_shard(name: str, cfg: BenchConfig, engine: Engine, questions: list[Question], images: Path, work: Path,
                 load_s: float) -> dict:
    """Under torchrun: each rank times its share (whole image steps, as `eval` shards them), every timed
    run started together; the aggregate is all the questions over the slowest rank's wall time. The
    reference pipeline is a single-process baseline: `pope-fast bench` without torchrun."""
    shard, device = cfg.shard, engine.settings.torch_device
    mine = shard.select(questions, engine, {})
    records_dir = work / f"{name}-records-rank{shard.rank}"
    walls = []  # per timed run: every rank's wall time
    for _ in range(cfg.repeat):
        shutil.rmtree(records_dir, ignore_errors=True)
        engine.reset(clear_cache=True)
        shard.gather(None)  # a barrier: the ranks start each timed run together
        start = time.perf_counter()
        prompts = run_pope(engine, mine, images, records_dir).evaluated_prompts if mine else 0  # more ranks than steps
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        walls.append(shard.gather(time.perf_counter() - start))
    wall = median_run([max(run) for run in walls])
    rank_walls = [median_run(list(w)) for w in zip(*walls)]  # each rank's own median
    shares = shard.gather((len(mine), prompts, round(peak_memory_mb(device), 1)))
    ranks = [{"rank": r, "questions": n, "unique_prompts": p, "wall_s": round(w, 3),
              "questions_per_s": round(n / w, 2) if n else 0.0, "peak_memory_mb": m}
             for r, ((n, p, m), w) in enumerate(zip(shares, rank_walls))]
    ours = {"questions": len(questions), "unique_prompts": sum(r["unique_prompts"] for r in ranks),
            "wall_s": round(wall, 3), "questions_per_s": round(len(questions) / wall, 2),
            "runs_s": [round(max(run), 3) for run in walls], "load_s": round(load_s, 2),
            "phases_s": engine.timings.to_json(), "peak_memory_mb": max(r["peak_memory_mb"] for r in ranks),
            "settings": engine.settings.to_json(), "ranks": ranks}
    return {"checkpoint": str(engine.model.folder), "size": cfg.size if name not in cfg.model_dirs else "checkpoint",
            "pope_fast": ours, "reference_unavailable": "not run under torchrun (the single-process baseline: "
                                                        "pope-fast bench without torchrun)"}


def run_bench(cfg: BenchConfig, progress: Callable[[str, int, int], None] | None = None) -> dict:
    unknown = [m for m in cfg.models if m not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    report = {"device": _device_name(cfg.device), "size": cfg.size, "models": {}}
    with tempfile.TemporaryDirectory(prefix="pope-fast-bench-") as tmp:
        work = Path(cfg.work_dir or tmp)
        if cfg.shard is not None and cfg.work_dir:  # each rank writes its own checkpoints and records
            work = work / f"rank{cfg.shard.rank}"
        for name in cfg.models:
            report["models"][name] = bench_model(name, cfg, work, progress)
    return report


def _device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def format_report(report: dict) -> str:
    """The markdown table printed at the end of a run."""
    lines = [f"device: {report['device']}; size: {report['size']}", "",
             "| model | questions | pope-fast q/s | pope-fast s | reference q/s | reference s | speedup | "
             "agreement (min over readouts) | peak MB (ours / ref) | phases s (encode / prefix / questions / decode) "
             "| floor s (ratio) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in report["models"].items():
        ours, ref = e["pope_fast"], e.get("reference")
        p = ours["phases_s"]
        phases = f"{p['image_encode']:.2f} / {p['prefix_prefill']:.2f} / {p['question_prefill']:.2f} / {p['decode']:.2f}"
        floor = f"{ours['floor_s']} ({ours['ratio_to_floor']}×)" if "floor_s" in ours else "-"
        if ref:
            ref_s = f"{ref['extrapolated_wall_s']}" + (f" (from {ref['questions']})" if ref["sampled"] else "")
            worst = min(e["agreement"], key=e["agreement"].get)
            agree = f"{e['agreement'][worst]:.4f} ({worst})"
            cols = [f"{ref['questions_per_s']}", ref_s, f"{e['speedup']}×", agree,
                    f"{ours['peak_memory_mb']:.0f} / {ref['peak_memory_mb']:.0f}"]
        else:
            why = e.get("reference_unavailable", "-")
            cols = [why, "-", "-", "-", f"{ours['peak_memory_mb']:.0f} / -"]
        lines.append(f"| {name} ({e['size']}) | {ours['questions']} ({ours['unique_prompts']} prompts) | "
                     f"{ours['questions_per_s']} | {ours['wall_s']} | " + " | ".join(cols) + f" | {phases} | {floor} |")
    paired = [(name, e["pope_fast"]["paired"]) for name, e in report["models"].items() if "paired" in e["pope_fast"]]
    if paired:
        lines += ["", "paired methods: one sweep of all of them, cold, against the baseline sweep above", "",
                  "| model | methods | s | vs baseline | images encoded | prompts | prefix tokens |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {name} | {' + '.join(p['methods'])} | {p['wall_s']} | {p['vs_baseline']}× | "
                  f"{p['counts']['images_encoded']} | {p['counts']['prompts']} | {p['counts']['prefix_tokens']} |"
                  for name, p in paired]
    ranked = [(name, e["pope_fast"]) for name, e in report["models"].items() if "ranks" in e["pope_fast"]]
    if ranked:
        lines += ["", "torchrun: each rank's share; the row above is all of them (all questions over the slowest "
                      "rank's wall time)", "",
                  "| model | rank | questions | q/s | s | peak MB |", "|---|---|---|---|---|---|"]
        for name, ours in ranked:
            lines += [f"| {name} | {r['rank']} | {r['questions']} ({r['unique_prompts']} prompts) | "
                      f"{r['questions_per_s']} | {r['wall_s']} | {r['peak_memory_mb']:.0f} |" for r in ours["ranks"]]
            lines.append(f"| {name} | all {len(ours['ranks'])} | {ours['questions']} | {ours['questions_per_s']} | "
                         f"{ours['wall_s']} | {ours['peak_memory_mb']:.0f} |")
    return "\n".join(lines)
