"""`pope-fast eval` as one call: the options of a sweep (`EvalJob`) → the engine loaded, the folder
locked, the questions read (or the demo's written), the sweep run (under torchrun, this rank's
share), and for a paired run the comparison of its methods (`EvalOutcome`). It prints nothing: the
command line shows progress through the `progress` it is given, and the outcome."""
from __future__ import annotations

from collections import Counter
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, ContextManager

from .builtin import demo_inputs
from .distributed import Shard, every_rank
from .engine import Settings, Timings, load_engine, parse_method
from .coverage import protocol_for
from .hub_datasets import resolve_inputs
from .progress import watched
from .readout import READOUTS, find_question_files, format_runs, load_question_sources
from .readout.benchmarks import REGISTRY, benchmark_questions, get_benchmark
from .readout.benchmarks.asking import asked_questions, check_protocol
from .readout.benchmarks.score import format_benchmark, score_benchmark_paths
from .readout.protocols import Coverage, format_protocol_runs, get_protocol, get_template
from .readout.readouts import GENERATING, parse_readouts
from .readout.tool_steps import TOOL_STEPS
from .resume import COMPARE_FILE, check_layout
from .score_jobs import CompareJob, score_paths
from .store import RunLock, atomic_write
from .preflight import check_image_names
from .sweep import SweepResult, run_paired, run_plain

DEMO_TOKENS = 6  # the demo's continuations: its random tiny model never ends an answer

# A progress display for `total` questions of a benchmark (its title), shown where the bool says
# (rank 0): entered, it gives the callable that hears of more done.
ProgressFactory = Callable[[int, bool, str], ContextManager[Callable[[int], None]]]


@dataclass
class EvalJob:
    out_dir: Path
    model_dir: Path | None = None  # None: the built-in demo
    question_sources: tuple[str, ...] = ()
    images_dir: Path | None = None
    demo_questions: int = 60
    split: str | None = None
    dataset: str | None = None
    template: str | None = None
    readouts: str = "all"
    # NAME[:k=v,...]; more than none: a paired run, each into OUT/NAME/
    methods: tuple[str, ...] = ()
    cache_dir: Path | None = None
    skip_bad: bool = False
    settings: dict = field(default_factory=dict)  # Settings fields, the device among them
    # the first N questions in all, in the files' order (lmms-eval's --limit)
    limit: int | None = None
    # the first N of each dataset's split (a look at every split), before `limit`
    limit_per_split: int | None = None
    command: str | None = None  # the command line, recorded in meta.json
    # a published protocol (readout/protocols/): its prompt, length, image aspect
    protocol: str | None = None
    benchmark: str | None = None  # named, else told from the question data (readout/benchmarks/)
    # the hub snapshots --model and --questions named (hub_datasets.Inputs.sources), for meta.json
    hub: dict | None = None
    # engine | transformers | auto (the engine where it has the model's family)
    backend: str = "auto"

    @classmethod
    def from_options(cls, out_dir: Path, *, model_dir, question_files, images_dir, cache_dir,
                     method_specs, no_prefix_reuse, demo_questions, split, dataset, template,
                     readouts, skip_bad, limit=None, limit_per_split=None, command=None,
                     protocol=None, benchmark=None, subset=None, backend="auto",
                     **settings) -> "EvalJob":
        """The job of `pope-fast eval`'s options (every other option is a Settings field); hub ids
        among the model and questions are fetched here, or found in the cache
        (hub_datasets.resolve_inputs)."""
        def path(p):
            return None if p is None else Path(p)

        inputs = resolve_inputs(model_dir, tuple(question_files), subset, split)
        return cls(Path(out_dir), model_dir=inputs.model_dir,
                   question_sources=inputs.question_files, images_dir=path(images_dir),
                   demo_questions=demo_questions, split=inputs.split, dataset=dataset,
                   template=template, readouts=readouts, methods=tuple(method_specs),
                   cache_dir=path(cache_dir), skip_bad=skip_bad,
                   settings={**settings, "prefix_reuse": not no_prefix_reuse}, limit=limit,
                   limit_per_split=limit_per_split, command=command, protocol=protocol,
                   benchmark=benchmark, hub=inputs.sources, backend=backend)


# new tokens a text readout decodes in eval's warm-up (every decode kernel launched once)
WARMUP_TOKENS = 4


@dataclass
class EvalOutcome:
    out_dir: Path
    results: list[SweepResult]  # one per method folder (one for a plain run)
    timings: Timings
    paired: bool
    # the methods compared with the first, markdown (OUT/compare.json beside it)
    comparison: str | None
    world_size: int | None  # under torchrun: the ranks of the job
    protocol: str | None = None  # the job's published protocol: its table follows each run's
    # the job's benchmark other than POPE: its rules' numbers follow each run's
    benchmark: str | None = None

    def summary(self) -> str:
        """What the command line prints at the end of a sweep."""
        first = self.results[0]
        lines = [f"resumed: {first.recorded_before} of {first.questions} questions were already "
                 "recorded"] if first.recorded_before else []
        lines += [f"kept: {first.past_limit} records of questions past the limit, from an earlier "
                  "run with a larger one, scored with this run's"] if first.past_limit else []
        ranks = f" on {self.world_size} ranks" if self.world_size else ""
        lines.append(f"{first.evaluated_prompts} unique prompts evaluated for {_asked(first)}"
                     f"{ranks}; {first.error_records} error records; phases (s): "
                     f"{self.timings.to_json()}"
                     + (" (rank 0)" if self.world_size else ""))
        for result in self.results:
            lines += [f"\n{result.out_dir.name}:"] if self.paired else []
            # its own metrics, not POPE's yes-positive F1 (`score RUN --benchmark pope` has that)
            if self.benchmark:
                [scored] = score_benchmark_paths([str(result.out_dir)], self.benchmark)
                lines.append(format_benchmark(scored))
                continue
            lines.append(format_runs(result.runs, "table"))
            if self.protocol:
                lines.append("\n" + format_protocol_runs(score_paths([str(result.out_dir)],
                                                                     protocol=self.protocol)))
        lines += [f"\n{self.comparison}"] if self.comparison is not None else []
        lines.append(f"records, meta and summaries in {self.out_dir}"
                     + ("/<method>/" if self.paired else ""))
        return "\n".join(lines)


def _asked(result: SweepResult) -> str:
    """The questions a run's prompts were evaluated for: on a resume, those it lacked."""
    if not result.recorded_before:
        return f"{result.questions} questions"
    lacking = result.questions - result.recorded_before
    # a step of images runs whole, as a clean run batches it: its recorded questions are asked
    # again, kept as they were
    again = " (and the recorded questions that share their image steps)" \
        if result.evaluated_prompts > lacking else ""
    return f"the {lacking} question{'s' * (lacking != 1)} not yet recorded{again}"


def run_eval(job: EvalJob, shard: Shard | None, progress: ProgressFactory | None = None,
             notice: Callable[[str], None] = lambda _: None) -> EvalOutcome | None:
    """The sweep `job` describes (under torchrun, `shard` is this process's place in the job,
    joined); None on torchrun ranks other than 0 (rank 0 reports for the job)."""
    if job.model_dir is not None and not job.question_sources:
        raise ValueError("with --model, give --questions (and --images unless the questions embed "
                         "them)")
    device = job.settings["device"]
    progress = progress or no_progress
    check_protocol_options(job)  # before the folder, the demo or the model is made
    # the random model never ends a sentence
    demo_tokens = DEMO_TOKENS if job.model_dir is None else None
    options = {k: v for k, v in job.settings.items()
               if v is not None or k not in ("image_aspect",)}
    settings = Settings(**{**options, "device": shard.device(device) if shard else device,
                           "max_new_tokens": job.settings.get("max_new_tokens") or demo_tokens})
    methods = [parse_method(spec) for spec in job.methods]
    # a bad argument is refused before the folder, the demo or the model is made
    parse_readouts(job.readouts)
    _check_method_readouts(methods, job.readouts)
    check_layout(job.out_dir, paired=bool(methods))
    lead = shard is None or shard.lead
    with ExitStack() as stack:
        lock, engine, questions, images_dir, asked, every = _setup(job, settings, shard, stack,
                                                                   notice)
        # once, at the end (a failed run's too)
        stack.callback(lambda: _cache_notice(engine.cache.rejected, notice))
        # every method records each question once: the first method's folder counts the job's
        # progress
        counted = job.out_dir / methods[0].name if methods else job.out_dir
        benchmark = next((q.dataset for q in questions[:1] if q.dataset in REGISTRY), None)
        named = get_benchmark(benchmark).short_name if benchmark else "POPE"
        update = stack.enter_context(_lazy(progress, len(questions), lead, named))
        # a long continuation's progress, between recorded batches
        engine.on_decode = update.decoding
        stack.enter_context(watched(counted, update, len(questions))
                            if shard is not None and lead else nullcontext())
        provenance = {**({"command": job.command} if job.command else {}),
                      **({"hub": job.hub} if job.hub else {}),
                      **({"protocol": job.protocol} if job.protocol else {}),
                      **({"benchmark": benchmark} if benchmark else {}),
                      **({"benchmark_prompt": asked} if asked else {})}
        run = dict(skip_bad=job.skip_bad, progress=update if shard is None else None, lock=lock,
                   shard=shard, provenance=provenance or None,
                   question_file=every if job.limit or job.limit_per_split else None)
        if methods:
            results = run_paired(engine, questions, images_dir, job.out_dir, methods, **run)
        else:
            results = [run_plain(engine, questions, images_dir, job.out_dir, **run)]
        comparison = _comparison(job.out_dir, results, benchmark) \
            if len(methods) > 1 and lead else None
    if shard is not None:
        shard.leave()
    return EvalOutcome(job.out_dir, results, engine.timings, bool(methods), comparison,
                       shard.world_size if shard else None, job.protocol, benchmark) \
        if lead else None


def _setup(job: EvalJob, settings: Settings, shard: Shard | None, stack: ExitStack, notice):
    """The folder's lock (rank 0's), the engine loaded and warmed up, the questions and their
    images: each a step every rank takes, so a failure on one stops all, naming it."""
    lead = shard is None or shard.lead
    lock, benchmark, questions = _read_questions(job, shard, stack, notice)
    with every_rank(shard):
        model_dir, images_dir = job.model_dir, job.images_dir
        if model_dir is None:
            model_dir, questions, images_dir = demo_inputs(job.out_dir, questions, images_dir,
                                                           job.demo_questions, job.split, notice)
        elif images_dir is None and any(q.image and q.image_data is None for q in questions):
            raise ValueError("the question files name image files: give --images (parquet files "
                             "embed their images)")
        check_image_names(questions, images_dir)  # before the model loads
        template, settings, lengths = _under_protocol(job, model_dir, settings)
        # a protocol demo in seconds
        if job.model_dir is None and lengths and max(lengths.values()) > DEMO_TOKENS:
            notice(f"demo: continuations capped at {DEMO_TOKENS} tokens (--protocol {job.protocol} "
                   f"generates up to {max(lengths.values())}, which the random model, never ending "
                   "its answer, would fill); `score --protocol` names the difference")
            lengths = {name: min(n, DEMO_TOKENS) for name, n in lengths.items()}
        asked = None
        # the tool's task prompt, inside its model class's template
        if benchmark is not None and job.protocol:
            questions, asked = asked_questions(benchmark, job.protocol, questions, template)
        engine = load_engine(model_dir, settings, backend=job.backend,
                             template=template and get_template(template), readouts=job.readouts,
                             cache_dir=job.cache_dir, lengths=lengths)
        if engine.model.backend == "transformers" and lead:
            # a family's model_type holding another language model or tower
            if engine.model.misfit:
                notice(f"{engine.model.misfit}; it runs as a model without a family: on the "
                       "transformers backend, with the checkpoint's own chat template and "
                       "processor")
            notice(f"{engine.model.name}: the reference path (transformers' own class, every "
                   "prompt whole: no prefix reuse, no feature cache)")
        every, questions = questions, limited(questions, job.limit, job.limit_per_split)
        per_image = Counter(q.image for q in questions)
        # the data's sizes; a few decode steps, not a protocol's whole length: eval times nothing
        engine.warmup(images=len(per_image), prompts=max(per_image.values(), default=1),
                      decode_tokens=WARMUP_TOKENS)
    return lock, engine, questions, images_dir, asked, every


def _read_questions(job: EvalJob, shard: Shard | None, stack: ExitStack, notice):
    """The folder's lock (rank 0's), the benchmark the question data names (benchmark_questions)
    and the questions, read on every rank; rank 0 writes the demo's inputs."""
    lead = shard is None or shard.lead
    # rank 0 locks the folder before the load and writes the demo's inputs
    with every_rank(shard):
        # a second run here is refused at once
        lock = stack.enter_context(RunLock(job.out_dir)) if lead else None
        if job.split and sum(len(find_question_files(s)) for s in job.question_sources) > 1:
            raise ValueError("--split names the split of a single question file")
        skipped: list = []
        benchmark, questions = benchmark_questions(job.question_sources, job.benchmark)
        if benchmark is not None and (job.split or job.dataset):
            raise ValueError(f"--split/--dataset: {benchmark}'s data names its own groups")
        if benchmark is not None and job.protocol:
            check_protocol(benchmark, job.protocol)  # before the model loads
        if questions is None:
            questions = load_question_sources(job.question_sources, job.split, job.dataset, skipped)
        for path, reason in skipped if lead else []:
            notice(f"{path}: skipped, {reason}")
        if job.model_dir is None and lead:
            demo_inputs(job.out_dir, questions, job.images_dir, job.demo_questions, job.split,
                        notice)
    return lock, benchmark, questions


def _cache_notice(rejected: list[tuple[Path, str]], notice) -> None:
    """One line for the disk entries the run recomputed rather than served, their proof failing (see
    VisionCache)."""
    if rejected:
        reasons = "; ".join(f"{n} {why}" for why, n in Counter(why for _, why in rejected).items())
        entries = "1 entry" if len(rejected) == 1 else f"{len(rejected)} entries"
        notice(f"--cache-dir {rejected[0][0].parent}: {entries} recomputed, not served ({reasons}; "
               f"the first: {rejected[0][0].name})")


def check_protocol_options(job: EvalJob) -> None:
    """ValueError where the job's options set what its protocol decides (checked before anything
    loads)."""
    if job.protocol is None:
        return
    protocol = get_protocol(job.protocol)
    for option, value in (("--template", job.template),
                          ("--max-new-tokens", job.settings.get("max_new_tokens")),
                          ("--image-aspect", job.settings.get("image_aspect"))):
        if value is not None:
            raise ValueError(f"{option}: --protocol {protocol.name} decides the prompt, the "
                             "generation length and the image preprocessing; drop the option, or "
                             "run without --protocol")
    if job.readouts.strip() != "all" \
            and protocol.readout not in [n.strip() for n in job.readouts.split(",")]:
        raise ValueError(f"--readouts {job.readouts}: --protocol {protocol.name} answers by "
                         f"{protocol.readout}; add it")


def _under_protocol(job: EvalJob, model_dir: Path, settings: Settings):
    """The template, settings and text lengths of the job: its own, or its protocol's for this
    checkpoint."""
    if job.protocol is None:
        return job.template, settings, None
    coverage = protocol_for(model_dir, job.protocol)
    readout = get_protocol(job.protocol).readout
    lengths = {readout: coverage.new_tokens} \
        if coverage.new_tokens and READOUTS[readout].kind in GENERATING else None
    return coverage.template, protocol_settings(settings, coverage), lengths


def protocol_settings(settings: Settings, coverage: Coverage) -> Settings:
    """`settings` as the tool runs the checkpoint: its image handling and steps, and its dtype
    unless --dtype names one (a GPU without bf16, say: `score --protocol` then names the difference)
    or NF4 is asked for with a tool's fp32, which NF4 cannot compute in (and no tool quantizes)."""
    steps = {name: getattr(coverage, name) for name in TOOL_STEPS}
    if settings.dtype is None and coverage.dtype is not None \
            and not (settings.quant == "nf4" and coverage.dtype == "fp32"):
        steps["dtype"] = coverage.dtype
    return replace(settings, image_aspect=coverage.image_aspect, **steps)


def limited(questions: list, limit: int | None, per_split: int | None = None) -> list:
    """`eval --limit-per-split` then `--limit`: the first `per_split` questions of each dataset's
    split, then the first `limit` of those, in the order the files hold them (a split, as
    HallusionBench's categories, can be small: a limit in all is what lmms-eval's --limit means)."""
    seen: dict[tuple[str, str], int] = {}
    kept = []
    for q in questions:
        count = seen.get((q.dataset, q.split), 0)
        if per_split is None or count < per_split:
            kept.append(q)
            seen[q.dataset, q.split] = count + 1
    return kept[:limit]


def _check_method_readouts(methods, readouts: str) -> None:
    """A contrastive method reads the answer position only: refuse text readouts asked for by
    name."""
    contrastive = [m.name for m in methods if m.contrastive]
    named = [] if readouts.strip() == "all" else [n.strip() for n in readouts.split(",")]
    text = [n for n in named if n in READOUTS and READOUTS[n].kind in GENERATING]
    if contrastive and text:
        raise ValueError(f"--readouts {','.join(text)}: method {contrastive[0]} combines logits at "
                         "the answer position, so its runs take logit and first-token readouts "
                         "only")


def _comparison(out: Path, results: list[SweepResult], benchmark: str | None) -> str:
    """OUT/compare.json: every method against the first, as `pope-fast compare` compares them (a
    benchmark's runs on its own metrics, POPE's by ΔF1), and its markdown."""
    job = CompareJob(tuple(str(r.out_dir) for r in results), "json", benchmark=benchmark)
    atomic_write(out / COMPARE_FILE, job.run() + "\n")
    return replace(job, fmt="markdown").run()


@contextmanager
def no_progress(total: int, lead: bool, benchmark: str):
    yield lambda n: None


@contextmanager
def _lazy(progress: ProgressFactory, total: int, lead: bool, benchmark: str):
    """progress's display, opened when the sweep first tells of its questions: a run refused
    before it starts (a resume of another run into this folder, say) shows no bar at 0% first."""
    with ExitStack() as stack:
        update = None

        def opened():
            nonlocal update
            if update is None:
                update = stack.enter_context(progress(total, lead, benchmark))
            return update

        def tell(n: int) -> None:
            opened()(n)

        def decoding(steps: int, most: int, rows: int) -> None:
            # a display that shows a continuation's progress
            shown = getattr(opened(), "decoding", None)
            if shown is not None:
                shown(steps, most, rows)

        tell.decoding = decoding
        yield tell
