"""A POPE sweep: questions from any number of split files → records, meta and summaries in one folder.

Identical (image, prompt) pairs are evaluated once and recorded in every split that asks them (COCO's
3 × 3,000 questions are ~5,127 prompts). Records are appended image by image; a run that stops
resumes from them, skipping every question already recorded, once it has proven that the folder holds
this run's records (the same checkpoint bytes, settings, questions and image bytes). One process
writes a folder at a time (RunLock).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from contextlib import ExitStack, nullcontext
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from ..readout import (META_FILE, Question, RecordWriter, RunLock, format_runs, make_record, read_meta, read_records,
                       score_records, write_meta)
from ..readout.records import atomic_write, leaf_differences, order_records, record_key
from .core import Engine
from .distributed import Shard, fold_parts
from .images import ImageError, check_images, embedded_path, read_image
from .methods import Method


@dataclass
class SweepResult:
    out_dir: Path
    questions: int  # in the question files
    recorded_before: int  # already on disk when this run started (resumed)
    evaluated_prompts: int  # unique (image, prompt) pairs run by this call
    error_records: int
    runs: list[dict]


# Settings that only change how work is batched, never a value; any other difference between the
# run on disk and this one (dtype, quantization, image aspect, kernels, continuation length, ...)
# would mix two runs' records in one folder.
BATCHING_ONLY = ("batch_size", "image_batch")


def _resume_fingerprint(meta: dict) -> dict:
    """What must be equal for two runs' records to share a folder: the checkpoint's files by content
    (not its path), the template, token sets, settings and tokenizer."""
    settings = {k: v for k, v in meta.get("settings", {}).items() if k not in BATCHING_ONLY}
    tokenizer = {k: meta.get("tokenizer", {}).get(k) for k in ("class", "vocab_size")}
    model = meta.get("model") or {}
    method = meta.get("method") or {}  # absent before paired runs: the model as it is
    return {"model": {"family": model.get("family"), "files": model.get("files") or {}},
            "method": {"name": method.get("name", "none"), "settings": method.get("settings") or {}},
            "template": meta.get("template"), "token_sets": meta.get("token_sets"), "settings": settings,
            "tokenizer": tokenizer, "generation": meta.get("generation") or {}}


def _check_resumable(out_dir: Path, old: dict, meta: dict) -> None:
    """Refuse to add this run's records to a folder that holds another run's, naming what differs."""
    if not old:
        return
    diffs = leaf_differences(_resume_fingerprint(old), _resume_fingerprint(meta), "recorded", "now")
    if diffs:
        more = f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else ""
        raise ValueError(f"{out_dir / META_FILE}: this folder holds records of a different run "
                         f"({'; '.join(diffs[:4])}{more}); choose a new --out")


def _check_done(writer: RecordWriter, questions: list[Question], images_dir: Path | None, embedded: dict[str, bytes],
                workers: int) -> None:
    """A recorded question must be this question, asked of these bytes: the same image name, label
    and text (another question file under the same split name, or an edited one, would otherwise be
    taken as done), and its image (a file, or the bytes a parquet row embeds) must still be the bytes
    it was answered from."""
    _check_strays(writer, questions)
    keys = {q: record_key(q.split, q.key, q.dataset) for q in questions}
    recorded = [(q, writer.done[keys[q]]) for q in questions if keys[q] in writer.done]
    for q, rec in recorded:
        where = f"{writer.path}: question {q.question_id} of split {q.split}"
        if "text" not in rec or "image_sha256" not in rec:
            raise ValueError(f"{where} was recorded without its question text or image hash (an older "
                             "pope-fast), so resuming cannot prove it is this question; choose a new --out")
        for field, now in (("image", q.image), ("label", q.label), ("text", q.text)):
            if rec.get(field) != now:
                raise ValueError(f"{where} was recorded with {field} {rec.get(field)!r}, but the question file "
                                 f"has {now!r}; choose a new --out")
    names = list(dict.fromkeys(q.image for q, _ in recorded))

    def digest(name):
        if name in embedded:
            return hashlib.sha256(embedded[name]).hexdigest()
        return _image_sha256(images_dir / name) if images_dir is not None else None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = dict(zip(names, pool.map(digest, names)))
    for q, rec in recorded:
        if digests[q.image] != rec["image_sha256"]:
            now = "missing now" if digests[q.image] is None else f"sha256 {digests[q.image][:12]} now"
            source = embedded_path(q.image) if q.image in embedded else (images_dir or Path(".")) / q.image
            raise ValueError(f"{source}: question {q.question_id} of split {q.split} was answered "
                             f"from other bytes (sha256 {rec['image_sha256'][:12]} recorded, {now}); "
                             "choose a new --out")


def _check_strays(writer: RecordWriter, questions: list[Question]) -> None:
    """Records of this run's splits that its question files lack would be counted in their summaries
    (another question file under the same split name): refused."""
    asked = {record_key(q.split, q.key, q.dataset) for q in questions}
    splits = {(q.dataset, q.split) for q in questions}
    strays = sorted(k for k in writer.recorded if k[:2] in splits and k not in asked)
    if strays:
        raise ValueError(f"{writer.path}: question {strays[0][2]} of split {strays[0][1]} is recorded here but "
                         f"not in this run's question file ({len(strays)} such); choose a new --out, or --split "
                         "for another name")


def _image_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def run_pope(engine: Engine, questions: list[Question], images_dir: str | Path | None, out_dir: str | Path, *,
             skip_bad: bool = False, progress: Callable[[int], None] | None = None,
             workers: int | None = None, lock: RunLock | None = None, shard: Shard | None = None) -> SweepResult:
    """Evaluate every question not yet recorded in out_dir; returns the scored runs. `workers`
    threads (default: one per CPU core, at most 8) check, read, decode and preprocess images ahead of
    the model. Images embedded in the questions (parquet) are read from there, the others from
    images_dir. The folder's RunLock is taken for the sweep, unless the caller holds it (`lock`). Under
    torchrun (`shard`) this rank runs its share of the images and rank 0, the one that holds the lock,
    merges the ranks' records; only rank 0's result holds the scored runs."""
    return _run(engine, questions, images_dir, Path(out_dir), None, skip_bad, progress, workers, lock, shard)[0]


def run_paired(engine: Engine, questions: list[Question], images_dir: str | Path | None, out_dir: str | Path,
                methods: list[Method], *, skip_bad: bool = False, progress: Callable[[int], None] | None = None,
                workers: int | None = None, lock: RunLock | None = None, shard: Shard | None = None
                ) -> list[SweepResult]:
    """A paired run: every method on the same questions, images and settings in one sweep, each into
    its own ordinary run folder out_dir/<method name>/ (resumable as any run), sharing the vision
    features and every pass the methods have in common (Engine.run_methods). `progress` counts
    questions once, not once per method. Under torchrun (`shard`) as run_pope, every method's share of
    an image on the same rank."""
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method {next(n for n in names if names.count(n) > 1)} is given twice; one run folder "
                         "each: name each method once")
    for m in methods:  # settings that do not fit this model are refused before any folder is touched
        m.passes(engine.model.lm.dims.num_layers)
    return _run(engine, questions, images_dir, Path(out_dir), methods, skip_bad, progress, workers, lock, shard)


def _run(engine, questions, images_dir, out_dir, methods, skip_bad, progress, workers, lock, shard
         ) -> list[SweepResult]:
    images_dir = None if images_dir is None else Path(images_dir)
    seen = set()
    for q in questions:
        key = record_key(q.split, q.key, q.dataset)
        if key in seen:
            raise ValueError(f"question {q.question_id} appears twice in split {q.split}"
                             + (f" of {q.dataset}" if q.dataset else ""))
        seen.add(key)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Rank 0 alone locks the folder under torchrun; the other ranks write only their own record parts.
    with nullcontext() if lock is not None or (shard is not None and not shard.lead) else RunLock(out_dir):
        return _sweep(engine, questions, images_dir, out_dir, methods, skip_bad, progress, workers or default_workers(),
                      shard)


@dataclass
class _Sink:
    """One run folder of a sweep: the method it records (None: the engine as it is, a plain run),
    its writer, and the questions it still lacks."""

    folder: Path
    method: Method | None
    writer: RecordWriter
    questions: list[Question]
    todo: set[tuple[str, str, str]]  # record keys not yet recorded
    readouts: list[str]  # what its summaries score (a contrastive method's: the answer position's readouts)


def _open_sink(engine: Engine, folder: Path, method: Method | None, questions: list[Question],
               images_dir: Path | None, embedded: dict[str, bytes], workers: int, stack: ExitStack,
               shard: Shard | None) -> _Sink:
    """The folder's writer (under torchrun, this rank's part) once it is proven to hold this run's
    records (or none), its meta written."""
    folder.mkdir(parents=True, exist_ok=True)
    meta = engine.meta(method)
    _check_resumable(folder, read_meta(folder / META_FILE), meta)
    if shard is None:
        fold_parts(folder)  # records a torchrun job left in rank parts count as recorded
    else:
        shard.begin(folder)
    writer = stack.enter_context(RecordWriter(folder) if shard is None else shard.writer(folder))
    if writer.done and not any(dataset for dataset, _, _ in writer.done):
        # A folder begun before records named their dataset goes on without it, as the one run it is.
        questions = [replace(q, dataset="") for q in questions]
    _check_done(writer, questions, images_dir, embedded, workers)
    if shard is None or shard.lead:
        write_meta(folder, meta)
    todo = {record_key(q.split, q.key, q.dataset) for q in questions} - set(writer.done)
    return _Sink(folder, method, writer, questions, todo, meta["readouts"])


def _sweep(engine: Engine, questions: list[Question], images_dir: Path | None, out_dir: Path,
           methods: list[Method] | None, skip_bad: bool, progress: Callable[[int], None] | None,
           workers: int, shard: Shard | None) -> list[SweepResult]:
    embedded = _embedded_images(questions)
    with ExitStack() as stack:
        folders = [(out_dir, None)] if methods is None else [(out_dir / m.name, m) for m in methods]
        sinks = [_open_sink(engine, folder, m, questions, images_dir, embedded, workers, stack, shard)
                 for folder, m in folders]
        # Every question some folder lacks, in question order (as the first folder names it: a resumed
        # pre-dataset plain run drops the dataset name, and is the only folder of its sweep).
        todo = [q for i, q in enumerate(sinks[0].questions)
                if any(record_key(s.questions[i].split, s.questions[i].key, s.questions[i].dataset) in s.todo
                       for s in sinks)]
        before = len(questions) - len(todo)
        if progress and before:
            progress(before)
        problems = check_images(images_dir, [q.image for q in todo], workers, embedded)
        if problems and not skip_bad:
            listed = "; ".join(list(problems.values())[:5])
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ImageError(f"{len(problems)} image(s) cannot be used: {listed}{more}; "
                             "fix them or pass --skip-bad to record them as errors")
        if shard is not None:  # this rank's whole image steps; the same images for every method
            todo = shard.select(todo, engine, problems)
        errors = [q for q in todo if q.image in problems]
        _write(sinks, [(q, {"error": problems[q.image]}) for q in errors], engine)
        if progress and errors:
            progress(len(errors))

        # image → prompt text → the questions (of any split) that ask it
        by_image: dict[str, dict[str, list[Question]]] = {}
        for q in todo:
            if q.image not in problems:
                by_image.setdefault(q.image, {}).setdefault(engine.prompt(q.text), []).append(q)
        evaluated = late_errors = 0
        for step in _prepared_groups(engine, images_dir, list(by_image), workers, embedded):
            # A file that passed the up-front check can still fail to decode (a PNG's chunks pass their
            # CRCs, its compressed data does not) or be refused by the model (Qwen2-VL: an aspect ratio
            # over 200): an error record under skip_bad, else the run stops.
            failed = []
            for name, failure in [(n, p) for n, p in step if isinstance(p, ImageError)]:
                if not skip_bad:
                    raise failure
                failed += [(q, {"error": str(failure)}) for qs in by_image[name].values() for q in qs]
            late_errors += len(failed)
            step = [(n, p) for n, p in step if not isinstance(p, ImageError)]
            answered = _answer(engine, step, by_image, methods) if step else []
            evaluated += sum(len(by_image[name]) for name, _ in step)
            _write(sinks, failed + answered, engine)
            if progress:
                progress(len(failed) + len(answered))

    results = []
    for sink in sinks:
        counts = (evaluated, len(errors) + late_errors)
        if shard is not None:  # the end barrier; rank 0 folds the parts into records.jsonl
            counts = shard.merge(sink.folder, counts)
            if not shard.lead:
                results.append(SweepResult(sink.folder, len(questions), before, *counts, []))
                continue
        order_records(sink.folder, canonical_order(sink.questions, engine.prompt))
        runs = write_summaries(sink.folder, sink.readouts)
        results.append(SweepResult(sink.folder, len(questions), before, *counts, runs))
    return results


def canonical_order(questions: list[Question], prompt: Callable[[str], str]) -> dict[tuple[str, str, str], int]:
    """Question key → its place in records.jsonl, whatever the batching, ranks or resumes: image by image
    as first asked, each image's prompts as first asked, then the questions asking a prompt in order (the
    order an uninterrupted single process writes, error records aside)."""
    by_image: dict[str, dict[str, list[Question]]] = {}
    for q in questions:
        by_image.setdefault(q.image, {}).setdefault(prompt(q.text), []).append(q)
    keys = [record_key(q.split, q.key, q.dataset) for prompts in by_image.values() for qs in prompts.values()
            for q in qs]
    return {key: i for i, key in enumerate(keys)}


def _answer(engine: Engine, step: list[tuple[str, object]], by_image: dict[str, dict[str, list[Question]]],
            methods: list[Method] | None) -> list[tuple[Question, dict]]:
    """(question, record fields) for every question of these images: per method when methods are
    given (fields keyed by method name), else the engine's plain results."""
    group = [name for name, _ in step]
    digests = {name: hashlib.sha256(prepared[1].data).hexdigest() for name, prepared in step}
    texts = [list(by_image[name]) for name in group]
    if methods is None:
        features = engine.encode([p for _, p in step])
        per_method = {None: engine.run_images(list(zip(features, texts)))}
    else:  # the question text of each prompt: the methods render their own prompts from it
        asked = [[by_image[name][text][0].text for text in image_texts] for name, image_texts in zip(group, texts)]
        per_method = engine.run_methods([p for _, p in step], asked, methods)
    out = []
    for i, (name, image_texts) in enumerate(zip(group, texts)):
        for j, text in enumerate(image_texts):
            fields = {m: _fields(engine, results[i][j], digests[name]) for m, results in per_method.items()}
            out += [(q, fields) for q in by_image[name][text]]
    return out


def _fields(engine: Engine, result, digest: str) -> dict:
    return dict(first_token_id=result.first_token_id, candidate_logits=result.candidate_logits,
                decoded=result.decoded, texts=result.texts, decoded_sequence=result.sequence,
                predictions=engine.decide(result), probe=_recorded(result.probe, engine.settings.probe),
                image_sha256=digest)


def _write(sinks: list[_Sink], answered: list[tuple[Question, dict]], engine: Engine) -> None:
    """Each sink's records of the questions it lacks: error fields go to every sink, answers to the
    sink of their method."""
    for sink in sinks:
        records = []
        for q, fields in answered:
            if record_key(q.split, q.key, q.dataset) not in sink.todo:
                continue
            own = fields if "error" in fields else fields[sink.method.name if sink.method else None]
            records.append(make_record(q, engine.template.name, **own))
        if records:
            sink.writer.write(records)


def _recorded(probe: dict | None, setting: str) -> dict | None:
    """What a record keeps of a probe: one float per layer, and with image-attention:heads every head
    ([layers][heads]); the API's results always hold both."""
    if probe is None:
        return None
    keep = ("image_attention", "image_attention_heads") if setting.endswith(":heads") else ("image_attention",)
    return {k: probe[k] for k in keep}


def default_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _embedded_images(questions: list[Question]) -> dict[str, bytes]:
    """Image name → the bytes the questions embed; a name cannot be both embedded and a file."""
    embedded = {q.image: q.image_data for q in questions if q.image_data is not None}
    named = {q.image for q in questions if q.image_data is None} & set(embedded)
    if named:
        raise ValueError(f"image {sorted(named)[0]} is embedded in one question file and a file name in another; "
                         "evaluate the two sources in separate runs")
    return embedded


def _prepared_groups(engine: Engine, images_dir: Path | None, names: list[str], workers: int,
                     embedded: dict[str, bytes]) -> Iterator[list[tuple[str, object]]]:
    """(image name, engine.prepare output or the ImageError that stopped it) per image, a model step's
    images at a time, in order. File reads, decoding and the processor are CPU work that releases the
    GIL: `workers` threads run them image by image, at most one batch plus one image per worker ahead
    of the model, so memory stays bounded."""
    def prepare(name):
        data = embedded.get(name)
        path = images_dir / name if data is None else embedded_path(name)
        try:
            return engine.prepare([read_image(path, verify=False, data=data)])[0]
        except ImageError as err:  # missing since the check, passed it but not the decoder, refused by the model
            return err if str(err).startswith(str(path)) else ImageError(f"{path}: {err}")
        except Exception as err:  # a preprocessing failure is not the file's fault: stop, naming it
            raise ValueError(f"{path}: preprocessing failed ({err!r})") from err

    # Whole image batches, not a ramp of 1, 2, 4, ... images that would start the model sooner:
    # the small first steps cost more than the wait (60 built-in questions on 2 cores: 0.15 s vs 0.125 s).
    step = engine.settings.image_batch
    pending: deque = deque()
    queue = iter(names)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(names), step):
            size = min(step, len(names) - start)
            while len(pending) < size + step + workers and (name := next(queue, None)) is not None:
                pending.append((name, pool.submit(prepare, name)))
            yield [(name, future.result()) for name, future in (pending.popleft() for _ in range(size))]


def write_summaries(out_dir: Path, readouts: list[str]) -> list[dict]:
    """summary.json (the shape of `pope-fast score --format json`) and summary.md, from the records."""
    runs = score_records(read_records(out_dir), readouts)
    atomic_write(out_dir / "summary.json", json.dumps({"runs": runs}, indent=2) + "\n")
    atomic_write(out_dir / "summary.md", format_runs(runs, "markdown") + "\n")
    return runs
