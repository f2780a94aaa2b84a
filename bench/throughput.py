"""`pope-fast bench`: pope-fast against the pipeline the paper ran (`reference`), side by side on
the same questions: pope-fast is the engine's sweep, records and summaries included; both sides'
decisions are compared, and pope-fast's wall time is set beside its floor, the unavoidable matmul
FLOPs at the device's measured rate (`measure`).
"""
from __future__ import annotations

import gc
import json
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..distributed import Shard
from ..engine import FAMILIES, Engine, Settings, load_engine, parse_method
from ..engine.models import family_class
from ..engine.synthetic import REFERENCE_ONLY, builtin_questions, write_checkpoint, write_images
from ..hub import TOKENIZER_FILES, local_or_hub
from ..kernels import resolve_backend
from ..readout import READOUTS, Question, load_questions
from ..readout.readouts import FIRST_TOKEN, LOGIT
from ..readout.records import json_lines
from ..sweep import run_paired, run_plain
from .measure import device_name, floor_figures, median_run, peak_memory_mb, reset_peak_memory
from .reference import ReferenceSpec, run_reference

# The reference pipeline reads one token (max_new_tokens=1), so both sides run the readouts that
# need no continuation: every logit readout and first_token.
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
    batch_size: int | None = None  # None: the device's budget (engine/utils/budget.py), as eval's
    # image-attention: pope-fast records the probe too (what it costs shows in the wall time)
    probe: str = "none"
    work_dir: Path | None = None
    model_dirs: dict[str, Path] = field(default_factory=dict)
    tokenizer_dir: Path | None = None
    shard: Shard | None = None  # under torchrun: each rank times its share of the questions
    # --method specs: a paired run timed beside the baseline
    methods: list[str] = field(default_factory=list)

    @classmethod
    def from_options(cls, *, models: str, model_dirs, size, n_questions, pope_dir, device: str,
                     quant, dtype, batch_size, probe, method_specs, no_reference, repeat,
                     reference_sample, tokenizer_dir, work_dir, shard: Shard | None
                     ) -> "BenchConfig":
        """The benchmark `pope-fast bench`'s options describe; ValueError naming a bad one. Defaults
        follow the device: 7B dims, NF4 and a 200-question reference sample on CUDA; tiny, fp32 and
        all of them on the CPU."""
        if n_questions == 0 and pope_dir is None:
            raise ValueError("--questions 0 means all of --pope's questions; without --pope give a "
                             "number of built-in questions")
        for spec in method_specs:
            parse_method(spec)
        if shard is not None and method_specs:
            raise ValueError("bench --method times a paired sweep in one process; run it without "
                             "torchrun")
        dirs = {}
        for item in model_dirs:
            name, sep, path = item.partition("=")
            if not sep:
                raise ValueError(f"--model takes NAME=DIR, got {item!r}")
            dirs[name] = local_or_hub(path, "--model")[0]  # a checkpoint folder or a hub id
        tokenizer = (local_or_hub(tokenizer_dir, "--tokenizer", TOKENIZER_FILES)[0]
                     if tokenizer_dir else None)
        names = (list(FAMILIES) if models.strip() == "all"
                 else [m.strip() for m in models.split(",") if m.strip()])
        on_cuda = device.startswith("cuda")
        return cls(models=names, size=size or ("7b" if on_cuda else "tiny"),
                   device=shard.device(device) if shard else device,
                   quant=quant or ("nf4" if on_cuda else "none"), dtype=dtype,
                   n_questions=n_questions, pope_dir=Path(pope_dir) if pope_dir else None,
                   reference=not no_reference,
                   reference_sample=reference_sample or (200 if on_cuda else None),
                   repeat=repeat, batch_size=batch_size, probe=probe,
                   work_dir=Path(work_dir) if work_dir else None,
                   model_dirs=dirs, tokenizer_dir=tokenizer, shard=shard,
                   methods=list(method_specs))


def _questions(cfg: BenchConfig) -> list[Question]:
    if cfg.pope_dir is None:
        return builtin_questions(cfg.n_questions)
    # the RUCAIBox names; not PROVENANCE.json & co
    files = sorted(Path(cfg.pope_dir).glob("*pope*.json"))
    if not files:
        raise FileNotFoundError(f"{cfg.pope_dir}: no POPE question files (*pope*.json)")
    questions = [q for f in files for q in load_questions(f)]
    return questions[: cfg.n_questions] if cfg.n_questions else questions


def bench_model(name: str, cfg: BenchConfig, work: Path,
                progress: Callable[[str, int, int], None] | None = None) -> dict:
    """One family's figures: pope-fast's median cold sweep (and paired sweep), its floor, and the
    reference's, with the decisions of both compared."""
    settings = Settings(device=cfg.device, dtype=cfg.dtype, quant=cfg.quant,
                        batch_size=cfg.batch_size, probe=cfg.probe)
    checkpoint = cfg.model_dirs.get(name)
    if checkpoint is None:
        checkpoint = write_checkpoint(
            name, work / f"{name}-{cfg.size}", cfg.size, tokenizer_dir=cfg.tokenizer_dir,
            dtype=torch.float32 if settings.torch_dtype == torch.float32 else torch.float16,
            device=cfg.device if cfg.size == "7b" else "cpu")
    questions = _questions(cfg)
    images = write_images(work / "images", [q.image for q in questions])
    reset_peak_memory(settings.torch_device)
    load_start = time.perf_counter()
    # a model without a family: transformers'
    engine = load_engine(checkpoint, settings, readouts=BENCH_READOUTS)
    # the data's sizes bound the warmup's batch, as eval's
    per_image = Counter(q.image for q in questions)
    engine.warmup(images=len(per_image), prompts=max(per_image.values(), default=1))
    # hashes the checkpoint's files once (what a resume is proven by), outside the timed runs
    engine.meta()
    load_s = time.perf_counter() - load_start
    if cfg.shard is not None:
        return _bench_shard(name, cfg, engine, questions, images, work, load_s)
    records_dir = work / f"{name}-records"
    ours, counts = _bench_ours(name, cfg, engine, questions, images, records_dir, progress)
    ours["load_s"] = round(load_s, 2)  # warmup included
    if cfg.methods:
        tick = ((lambda n: progress(f"{name} paired", n, len(questions) * cfg.repeat))
                if progress else None)
        ours["paired"] = _bench_paired(cfg, engine, questions, images, work / f"{name}-paired",
                                       ours["wall_s"], tick)
    ours.update(floor_figures(engine.model.matmul_flops(counts), ours["wall_s"],
                              settings.torch_device))
    entry = {"checkpoint": str(checkpoint),
             "size": cfg.size if name not in cfg.model_dirs else "checkpoint", "pope_fast": ours}
    unavailable = family_class(name).reference_unavailable if name in FAMILIES else None
    if not cfg.reference or unavailable:
        if cfg.reference:
            entry["reference_unavailable"] = unavailable
        return entry
    sample = questions[: cfg.reference_sample] if cfg.reference_sample else questions
    spec = ReferenceSpec({q.text: engine.prompt(q.text) for q in sample}, engine.readout)
    del engine  # the reference's peak memory must not include our weights
    gc.collect()
    if settings.torch_device.type == "cuda":
        torch.cuda.empty_cache()
    tick = ((lambda n: progress(f"{name} reference", n, len(sample) * cfg.repeat))
            if progress else None)
    ref, decisions = run_reference(checkpoint, spec, sample, images, settings, cfg.repeat, tick)
    ref["extrapolated_wall_s"] = round(ref["wall_s"] * len(questions) / len(sample), 3)
    ref["sampled"] = len(sample) < len(questions)
    entry.update({"reference": ref,
                  "speedup": round(ref["extrapolated_wall_s"] / ours["wall_s"], 2),
                  "agreement": _agreement(records_dir, decisions)})
    return entry


def _bench_ours(name: str, cfg: BenchConfig, engine: Engine, questions: list[Question],
                images: Path, records_dir: Path, progress) -> tuple[dict, object]:
    """pope-fast's figures over cfg.repeat timed sweeps, each cold: no records to resume (a kept
    --work-dir too), no cached image features; the median run's, and its work counts."""
    device = engine.settings.torch_device
    tick = ((lambda n: progress(f"{name} pope-fast", n, len(questions) * cfg.repeat))
            if progress else None)
    runs = []  # (wall, phases, counts) per timed run
    warm_variants(engine, records_dir, lambda: run_plain(engine, questions, images, records_dir))
    for _ in range(cfg.repeat):
        shutil.rmtree(records_dir, ignore_errors=True)
        engine.reset(clear_cache=True, timed=True)
        start = time.perf_counter()
        result = run_plain(engine, questions, images, records_dir, progress=tick)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        runs.append((time.perf_counter() - start, engine.timings.to_json(), engine.counts))
    wall, phases, counts = median_run(runs, key=lambda r: r[0])
    return {"questions": len(questions), "unique_prompts": result.evaluated_prompts,
            "wall_s": round(wall, 3), "questions_per_s": round(len(questions) / wall, 2),
            "runs_s": [round(r[0], 3) for r in runs],
            "phases_s": phases, "peak_memory_mb": round(peak_memory_mb(device), 1),
            "settings": engine.settings.to_json()}, counts


def warm_variants(engine: Engine, folder: Path, sweep: Callable[[], object]) -> bool:
    """Where Triton kernels run, one untimed sweep of the run's own questions (into `folder`,
    dropped after) before the timed ones: a kernel compiles a variant per shape class (block sizes
    chosen by rows, integer arguments specialised on divisibility by 16), and only the run's own
    batches make every variant it uses (the engine's warmup makes one: bench/RESULTS.md found the
    others compiling inside the timed run). Whether it ran."""
    settings = engine.settings
    if resolve_backend(settings.kernels, settings.torch_device) != "triton":
        return False  # the torch references: nothing compiles per shape
    shutil.rmtree(folder, ignore_errors=True)
    engine.reset(clear_cache=True)
    sweep()
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _agreement(records_dir: Path, decisions: dict) -> dict[str, float]:
    """Per readout, the share of the reference's decisions that pope-fast's records hold too."""
    lines = json_lines((records_dir / "records.jsonl").read_text())
    records = {(r["split"], str(r["question_id"])): r["predictions"]
               for r in (json.loads(line) for _, line in lines)}
    names = list(next(iter(decisions.values())))
    return {n: round(sum(records[k][n] == d[n] for k, d in decisions.items()) / len(decisions), 4)
            for n in names}


def _bench_paired(cfg: BenchConfig, engine: Engine, questions: list[Question], images: Path,
                  out: Path, baseline_wall: float, tick) -> dict:
    """The methods as one paired sweep (`eval --method`), each timed run cold as the baseline's, and
    its cost against the baseline sweep timed just before in the same process."""
    methods = [parse_method(spec) for spec in cfg.methods]
    runs = []
    warm_variants(engine, out, lambda: run_paired(engine, questions, images, out, methods))
    for _ in range(cfg.repeat):
        shutil.rmtree(out, ignore_errors=True)
        engine.reset(clear_cache=True, timed=True)
        start = time.perf_counter()
        run_paired(engine, questions, images, out, methods, progress=tick)
        if engine.settings.torch_device.type == "cuda":
            torch.cuda.synchronize(engine.settings.torch_device)
        runs.append((time.perf_counter() - start, engine.timings.to_json(), engine.counts))
    wall, phases, counts = median_run(runs, key=lambda r: r[0])
    # the ratio of the two walls as reported, so the report reads consistently
    wall = round(wall, 3)
    return {"methods": [m.name for m in methods], "wall_s": wall,
            "runs_s": [round(r[0], 3) for r in runs],
            "vs_baseline": round(wall / baseline_wall, 2), "phases_s": phases,
            "counts": {"images_encoded": counts.images_encoded, "prompts": counts.prompts,
                       "prefix_tokens": counts.prefix_tokens,
                       "suffix_tokens": counts.suffix_tokens}}


def _bench_shard(name: str, cfg: BenchConfig, engine: Engine, questions: list[Question],
                 images: Path, work: Path, load_s: float) -> dict:
    """Under torchrun: each rank times its share (whole image steps, as `eval` shards them),
    every timed run started together; the aggregate is all the questions over the slowest
    rank's wall time. The reference pipeline is a single-process baseline: `pope-fast bench`
    without torchrun."""
    shard, device = cfg.shard, engine.settings.torch_device
    names, batch = list(dict.fromkeys(q.image for q in questions)), engine.settings.step_images
    steps = shard.share([names[i:i + batch] for i in range(0, len(names), batch)], questions,
                        engine)
    mine = [q for q in questions if any(q.image in step for step in steps)]
    records_dir = work / f"{name}-records-rank{shard.rank}"
    walls = []  # per timed run: every rank's wall time
    if mine:
        warm_variants(engine, records_dir, lambda: run_plain(engine, mine, images, records_dir))
    for _ in range(cfg.repeat):
        shutil.rmtree(records_dir, ignore_errors=True)
        engine.reset(clear_cache=True, timed=True)
        shard.gather(None)  # a barrier: the ranks start each timed run together
        start = time.perf_counter()
        # 0 where there are more ranks than steps
        prompts = run_plain(engine, mine, images, records_dir).evaluated_prompts if mine else 0
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
            "phases_s": engine.timings.to_json(),
            "peak_memory_mb": max(r["peak_memory_mb"] for r in ranks),
            "settings": engine.settings.to_json(), "ranks": ranks}
    return {"checkpoint": str(engine.model.folder),
            "size": cfg.size if name not in cfg.model_dirs else "checkpoint", "pope_fast": ours,
            "reference_unavailable": "not run under torchrun (the single-process baseline: "
                                     "pope-fast bench without torchrun)"}


def run_bench(cfg: BenchConfig, progress: Callable[[str, int, int], None] | None = None) -> dict:
    known = [*FAMILIES, *REFERENCE_ONLY]  # the families, then models the transformers backend runs
    unknown = [m for m in cfg.models if m not in known and m not in cfg.model_dirs]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    report = {"device": device_name(cfg.device), "size": cfg.size, "models": {}}
    with tempfile.TemporaryDirectory(prefix="pope-fast-bench-") as tmp:
        work = Path(cfg.work_dir or tmp)
        # each rank writes its own checkpoints and records
        if cfg.shard is not None and cfg.work_dir:
            work = work / f"rank{cfg.shard.rank}"
        for name in cfg.models:
            report["models"][name] = bench_model(name, cfg, work, progress)
    return report
