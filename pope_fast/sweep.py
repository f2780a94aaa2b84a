"""A POPE sweep: questions from any number of split files → records, meta and summaries in run
folders.

One sweep records one or more methods on the same questions, each into its own run folder (a plain
run is the baseline alone, into the folder given; `run_paired` puts each method into
OUT/<method>/), all sharing the vision features and every pass they have in common
(Engine.run_methods). Identical (image, prompt) pairs are evaluated once and recorded in every split
that asks them (COCO's 3 × 3,000 questions are ~5,127 prompts). Records are appended image step by
image step; a run that stops resumes from them, skipping every question already recorded, once it
has proven that the folder holds this run's records (`resume`). One process writes a folder at a
time (RunLock); under torchrun each rank writes its own part of every folder and rank 0 folds them
(`distributed`).
"""
from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from . import __version__
from .coverage import protocol_coverage
from .distributed import Shard
from .engine import Engine, ImageError, Intervention, check_images
from .engine.methods import METHODS, Intervened, Method
from .prefetch import default_workers, embedded_images, prepared_steps
from .preflight import check_image_names, check_prompt_lengths
from .readout import META_FILE, Question, format_runs, read_meta, read_records, score_records
from .readout.records import record_key
from .replies import Outcome, answers
from .resume import check_done, check_has_meta, check_resumable, held_counts, question_counts
from .store import RecordWriter, RunLock, atomic_write, fold_parts, order_records, write_meta

Progress = Callable[[int], None]  # told how many more questions are recorded


@dataclass
class SweepResult:
    out_dir: Path
    questions: int  # in the question files
    recorded_before: int  # already on disk when this run started (resumed)
    evaluated_prompts: int  # unique (image, prompt) pairs run by this call
    error_records: int
    runs: list[dict]
    # records kept of questions past --limit (an earlier run's, with a larger one)
    past_limit: int = 0


@dataclass(frozen=True)
class RunFolder:
    """Where one method's records of a sweep go."""

    path: Path
    method: Method


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep runs, whichever methods it runs (run_plain's, run_paired's and run_sweep's
    keywords).

    `skip_bad`: record an unusable image's questions as errors instead of stopping. `progress`: told
    of the questions done (once per question, not per method). `workers`: threads (default one per
    CPU core, at most 8) that check, read, decode and preprocess images ahead of the model. `lock`:
    the folder's RunLock when the caller holds it (else the sweep takes it). `shard`: under
    torchrun, this rank's share of the images; rank 0, the one that holds the lock, merges the
    ranks' records, and only its results hold the scored runs. `provenance`: what meta.json says
    beside the engine (the command line that made the run, say). `question_file`: every question of
    the files, where the questions asked are the first --limit of each split (records of the rest
    stay)."""

    skip_bad: bool = False
    progress: Progress | None = None
    workers: int | None = None
    lock: RunLock | None = None
    shard: Shard | None = None
    provenance: dict | None = None
    question_file: list[Question] | None = None


def run_plain(engine: Engine, questions: list[Question], images_dir: str | Path | None,
              out_dir: str | Path, *, intervention: Intervention | None = None,
              **options) -> SweepResult:
    """Evaluate every question not yet recorded in out_dir with the model as it is (under
    `intervention`, an engine.Intervention, where given); returns the scored run. Images embedded in
    the questions (parquet) are read from there, the others from images_dir. `options`:
    SweepOptions' fields."""
    method = METHODS["none"]() if intervention is None else Intervened(intervention)
    return run_sweep(engine, questions, images_dir, Path(out_dir),
                     [RunFolder(Path(out_dir), method)], SweepOptions(**options))[0]


def run_paired(engine: Engine, questions: list[Question], images_dir: str | Path | None,
               out_dir: str | Path, methods: list[Method], **options) -> list[SweepResult]:
    """A paired run: every method on the same questions, images and settings in one sweep, each into
    its own ordinary run folder out_dir/<method name>/ (resumable as any run); under torchrun every
    method's share of an image on the same rank. `options`: SweepOptions' fields."""
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method {next(n for n in names if names.count(n) > 1)} is given twice; "
                         "one run folder each: name each method once")
    folders = [RunFolder(Path(out_dir) / m.name, m) for m in methods]
    return run_sweep(engine, questions, images_dir, Path(out_dir), folders,
                     SweepOptions(**options))


def run_sweep(engine: Engine, questions: list[Question], images_dir: str | Path | None,
              out_dir: Path, folders: list[RunFolder],
              options: SweepOptions = SweepOptions()) -> list[SweepResult]:
    """The sweep of run_plain and run_paired: every folder's method on the questions, out_dir
    locked. A rerun with a smaller --limit (`question_file` holds more than `questions`) keeps what
    a folder recorded past it, proven to be the file's questions, in its place: it is scored and
    counted as the folder's, and nothing of it is asked again."""
    # settings that do not fit this model (or its backend) are refused before any folder is touched
    for f in folders:
        engine.check_method(f.method)
    seen = set()
    for q in questions:
        key = record_key(q.split, q.key, q.dataset)
        if key in seen:
            raise ValueError(f"question {q.question_id} appears twice in split {q.split}"
                             + (f" of {q.dataset}" if q.dataset else ""))
        seen.add(key)
    check_image_names(questions, images_dir)
    check_prompt_lengths(engine, questions)
    text_only = sum(not q.image for q in questions)
    refusals = [why for f in folders if text_only and (why := engine.text_only_refusal(f.method))]
    # a method's refusal of those questions stops the run, as an image's does
    if refusals and not options.skip_bad:
        raise ImageError(f"{text_only} question(s) are asked without an image: {refusals[0]}; pass "
                         "--skip-bad to record them as that method's errors")
    out_dir.mkdir(parents=True, exist_ok=True)
    shard = options.shard
    sweep = _Sweep(engine, None if images_dir is None else Path(images_dir),
                   embedded_images(questions), options.skip_bad, options.progress,
                   options.workers or default_workers(), shard, options.provenance or {},
                   options.question_file)
    # Rank 0 alone locks the folder under torchrun; the other ranks write only their own record
    # parts.
    with nullcontext() if options.lock is not None or (shard is not None and not shard.lead) \
            else RunLock(out_dir):
        return sweep.run(questions, folders)


@dataclass
class _Sink:
    """One run folder of a sweep: its method, its writer, and the questions it still lacks."""

    folder: Path
    method: Method
    writer: RecordWriter
    questions: list[Question]
    todo: set[tuple[str, str, str]]  # record keys not yet recorded
    # what its summaries score (a contrastive method's: the answer position's readouts)
    readouts: list[str]
    # in the files' order: the questions asked, and those recorded past --limit
    held: list[Question]


@dataclass
class _Sweep:
    engine: Engine
    images_dir: Path | None
    embedded: dict[str, bytes]
    skip_bad: bool
    progress: Progress | None
    workers: int
    shard: Shard | None
    provenance: dict
    # every question of the files, where --limit asks the first of each split
    question_file: list[Question] | None
    evaluated: int = 0
    errors: int = 0

    def run(self, questions: list[Question], folders: list[RunFolder]) -> list[SweepResult]:
        # a run refused for its images writes nothing: no meta, no records
        problems = self._problems(questions)
        with ExitStack() as stack:
            sinks = [self._open(f, questions, stack) for f in folders]
            # The questions as the first folder names them (a plain run resumed into a folder whose
            # records name no dataset asks them without one, and is the only folder of its sweep),
            # and those some folder lacks.
            asked = sinks[0].questions
            pending = {_key(q) for i, q in enumerate(asked)
                       if any(_key(s.questions[i]) in s.todo for s in sinks)}
            before = len(questions) - len(pending)
            if self.progress:  # told even of none: the run is proven this folder's, it starts now
                self.progress(before)
            steps = self._steps(asked, pending, sinks, problems)
            self._evaluate(steps, asked, pending, sinks)
        return [self._finish(sink, len(questions), before) for sink in sinks]

    def _problems(self, questions: list[Question]) -> dict[str, str]:
        """Image name -> why it cannot be used ("" for the text-only questions a model refuses);
        with skip_bad off, any at all stops the run here, naming them."""
        problems = check_images(self.images_dir, [q.image for q in questions], self.workers,
                                self.embedded)
        if any(not q.image for q in questions) and (why := self.engine.text_only_refusal()):
            problems[""] = why
        if problems and not self.skip_bad:
            listed = "; ".join(list(problems.values())[:5])
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ImageError(f"{len(problems)} image(s) cannot be used: {listed}{more}; "
                             "fix them or pass --skip-bad to record them as errors")
        return problems

    def _steps(self, asked: list[Question], pending: set, sinks: list[_Sink],
               problems: dict[str, str]) -> list[list[str]]:
        """The image steps this process runs: every usable image of the questions, first asked
        first, in steps of image_batch, as a clean run forms them whatever is recorded already; the
        steps that hold a question some folder lacks, each to be run whole (under torchrun, this
        rank's share of them). The questions of unusable images (`problems`) are error records."""
        text_only = any(not q.image for q in asked)
        names = list(dict.fromkeys(q.image for q in asked if q.image and q.image not in problems))
        batch = self.engine.settings.step_images
        lacking = {q.image for q in asked if _key(q) in pending}
        # the questions asked without an image are one step of their own, after the images'
        # (text-only prompts, batched with each other)
        steps = [step for step in [*(names[i:i + batch] for i in range(0, len(names), batch)),
                                   *([[""]] if text_only and "" not in problems else [])]
                 if lacking & set(step)]
        if self.shard is None or self.shard.lead:
            errors = [q for q in asked if q.image in problems and _key(q) in pending]
            self._write(sinks, [Outcome(q, error=problems[q.image]) for q in errors])
            self.errors += len(errors)
            self._tell(len(errors))
        # this rank's whole image steps; the same images for every method
        if self.shard is not None:
            steps = self.shard.share(steps, asked, self.engine)
        return steps

    def _tell(self, n: int) -> None:
        if self.progress and n:
            self.progress(n)

    def _open(self, run: RunFolder, questions: list[Question], stack: ExitStack) -> _Sink:
        """The folder's writer (under torchrun, this rank's part) once it is proven to hold this
        run's records (or none), its meta written."""
        folder, engine, shard = run.path, self.engine, self.shard
        folder.mkdir(parents=True, exist_ok=True)
        old = read_meta(folder / META_FILE)
        meta = {**engine.meta(run.method),
                "protocol_coverage": protocol_coverage(engine.model.folder),
                "questions": question_counts(questions), **self.provenance,
                "pope_fast_version": __version__, "created": old.get("created") or _now(),
                "updated": _now()}
        check_resumable(folder, old, meta)
        check_has_meta(folder)
        if shard is None:
            fold_parts(folder)  # records a torchrun job left in rank parts count as recorded
        else:
            shard.begin(folder)
        writer = stack.enter_context(RecordWriter(folder) if shard is None
                                     else shard.writer(folder))
        every = self.question_file or questions
        if writer.done and not any(dataset for dataset, _, _ in writer.done):
            # A folder whose records name no dataset goes on without one, as the one run it is.
            questions, every = ([replace(q, dataset="") for q in group]
                                for group in (questions, every))
        # records past --limit: the file's
        check_done(writer, every, self.images_dir, self.embedded, self.workers)
        asked = {_key(q) for q in questions}
        held = [q for q in every if _key(q) in asked or _key(q) in writer.recorded]
        meta["questions"] = held_counts(old.get("questions"), held, every)
        if shard is None or shard.lead:
            write_meta(folder, meta)
        return _Sink(folder, run.method, writer, questions, asked - set(writer.done),
                     meta["readouts"], held)

    def _evaluate(self, steps: list[list[str]], asked: list[Question], pending: set,
                  sinks: list[_Sink]) -> None:
        """Every step's images with all their questions, recorded as each step ends (a folder's
        records of the questions it lacks): a step runs whole, so each prompt is computed in the
        batches a clean run computes it in, bit for bit."""
        engine = self.engine
        wanted = {name for step in steps for name in step}
        # image → prompt → the questions (any split) asking it
        by_image: dict[str, dict[str, list[Question]]] = {}
        for q in asked:
            if q.image in wanted:
                by_image.setdefault(q.image, {}).setdefault(engine.prompt(q.text), []).append(q)
        methods = [s.method for s in sinks]
        for step in prepared_steps(engine, self.images_dir, steps, self.workers, self.embedded):
            # A file that passed the up-front check can still fail to decode (a PNG's chunks pass
            # their CRCs, its compressed data does not) or be refused by the model (Qwen2-VL: an
            # aspect ratio over 200): an error record under skip_bad, else the run stops.
            failed = []
            for name, failure in [(n, p) for n, p in step if isinstance(p, ImageError)]:
                if not self.skip_bad:
                    raise failure
                failed += [Outcome(q, error=str(failure)) for qs in by_image[name].values()
                           for q in qs]
            step = [(n, p) for n, p in step if not isinstance(p, ImageError)]
            answered = answers(engine, step, by_image, methods) if step else []
            self.evaluated += sum(len(by_image[name]) for name, _ in step)
            self._write(sinks, failed + answered)
            self.errors += sum(_key(o.question) in pending for o in failed + answered
                               if o.error or o.refused)
            self._tell(sum(_key(o.question) in pending for o in failed + answered))

    def _write(self, sinks: list[_Sink], answered: list[Outcome]) -> None:
        """Each sink's records of the questions it lacks: error fields go to every sink, answers (or
        a method's own error, a text-only question it refuses) to the sink of their method."""
        for sink in sinks:
            own = [(o.question, o.reply(sink.method.name)) for o in answered]
            records = [reply.record(q, self.engine.template.name)
                       for q, reply in own if _key(q) in sink.todo
                       # a rerun that meets the same error again records nothing new
                       and not (reply.error is not None
                                and sink.writer.errors.get(_key(q)) == reply.error)]
            if records:
                sink.writer.write(records)

    def _finish(self, sink: _Sink, questions: int, before: int) -> SweepResult:
        """The folder's records in their canonical order and its summaries (under torchrun after the
        end barrier, on rank 0, once it has folded every rank's part in)."""
        counts = (self.evaluated, self.errors)
        if self.shard is not None:
            counts = self.shard.merge(sink.folder, counts)
            if not self.shard.lead:
                return SweepResult(sink.folder, questions, before, *counts, [])
        order_records(sink.folder, canonical_order(sink.held, self.engine.prompt))
        return SweepResult(sink.folder, questions, before, *counts,
                           write_summaries(sink.folder, sink.readouts),
                           len(sink.held) - len(sink.questions))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _key(q: Question) -> tuple[str, str, str]:
    return record_key(q.split, q.key, q.dataset)


def canonical_order(questions: list[Question],
                    prompt: Callable[[str], str]) -> dict[tuple[str, str, str], int]:
    """Question key → its place in records.jsonl, whatever the batching, ranks or resumes: image by
    image as first asked, each image's prompts as first asked, then the questions asking a prompt in
    order (the order an uninterrupted single process writes, error records aside)."""
    by_image: dict[str, dict[str, list[Question]]] = {}
    for q in questions:
        by_image.setdefault(q.image, {}).setdefault(prompt(q.text), []).append(q)
    keys = [record_key(q.split, q.key, q.dataset) for prompts in by_image.values()
            for qs in prompts.values() for q in qs]
    return {key: i for i, key in enumerate(keys)}


def write_summaries(out_dir: Path, readouts: list[str]) -> list[dict]:
    """summary.json (the shape of `pope-fast score --format json`) and summary.md, from the
    records."""
    runs = score_records(read_records(out_dir), readouts)
    atomic_write(out_dir / "summary.json", format_runs(runs, "json") + "\n")
    atomic_write(out_dir / "summary.md", format_runs(runs, "markdown") + "\n")
    return runs
