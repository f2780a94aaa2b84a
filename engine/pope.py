"""A POPE sweep: questions from any number of split files → records, meta and summaries in one folder.

Identical (image, prompt) pairs are evaluated once and recorded in every split that asks them (COCO's
3 × 3,000 questions are ~5,127 prompts). Records are appended image by image; a run that stops
resumes from them, skipping every question already recorded.
"""
from __future__ import annotations

import json
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from ..readout import (META_FILE, Question, RecordWriter, format_runs, make_record, read_records, score_records,
                       write_meta)
from ..readout.records import record_key
from .core import Engine
from .images import ImageError, check_images, embedded_path, read_image


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
    settings = {k: v for k, v in meta.get("settings", {}).items() if k not in BATCHING_ONLY}
    tokenizer = {k: meta.get("tokenizer", {}).get(k) for k in ("class", "vocab_size")}
    return {"model": meta.get("model"), "template": meta.get("template"), "token_sets": meta.get("token_sets"),
            "settings": settings, "tokenizer": tokenizer, "generation": meta.get("generation", {})}


def _check_resumable(out_dir: Path, meta: dict) -> None:
    """Refuse to add this run's records to a folder that holds another run's."""
    path = out_dir / META_FILE
    if not path.is_file():
        return
    old, new = (_resume_fingerprint(m) for m in (json.loads(path.read_text(encoding="utf-8")), meta))
    for key in new:
        if old[key] != new[key]:
            diff = {k: (old[key].get(k), v) for k, v in new[key].items() if old[key].get(k) != v} \
                if isinstance(new[key], dict) and isinstance(old[key], dict) else (old[key], new[key])
            raise ValueError(f"{path}: this folder holds records of a different run ({key} differs, "
                             f"recorded vs now: {diff}); choose a new --out")


def _check_done(writer: RecordWriter, questions: list[Question]) -> None:
    """A recorded question must be this question: same image and label (another question file under
    the same split name would otherwise be taken as done)."""
    for q in questions:
        recorded = writer.done.get(record_key(q.split, q.key, q.dataset))
        if recorded is not None and recorded != (q.image, q.label):
            raise ValueError(f"{writer.path}: question {q.question_id} of split {q.split} was recorded for image "
                             f"{recorded[0]} (label {recorded[1]}), but the question file has {q.image} "
                             f"(label {q.label}); choose a new --out")


def run_pope(engine: Engine, questions: list[Question], images_dir: str | Path | None, out_dir: str | Path, *,
             skip_bad: bool = False, progress: Callable[[int], None] | None = None,
             workers: int | None = None) -> SweepResult:
    """Evaluate every question not yet recorded in out_dir; returns the scored runs. `workers`
    threads (default: one per CPU core, at most 8) check, read, decode and preprocess images ahead of
    the model. Images embedded in the questions (parquet) are read from there, the others from images_dir."""
    out_dir, images_dir = Path(out_dir), None if images_dir is None else Path(images_dir)
    seen = set()
    for q in questions:
        key = record_key(q.split, q.key, q.dataset)
        if key in seen:
            raise ValueError(f"question {q.question_id} appears twice in split {q.split}"
                             + (f" of {q.dataset}" if q.dataset else ""))
        seen.add(key)
    workers = workers or default_workers()
    meta = engine.meta()
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_resumable(out_dir, meta)
    write_meta(out_dir, meta)

    with RecordWriter(out_dir) as writer:
        if writer.done and not any(dataset for dataset, _, _ in writer.done):
            # A folder begun before records named their dataset goes on without it, as the one run it is.
            questions = [replace(q, dataset="") for q in questions]
        _check_done(writer, questions)
        todo = [q for q in questions if record_key(q.split, q.key, q.dataset) not in writer.done]
        if progress and len(todo) < len(questions):
            progress(len(questions) - len(todo))
        embedded = _embedded_images(todo)
        problems = check_images(images_dir, [q.image for q in todo], workers, embedded)
        if problems and not skip_bad:
            listed = "; ".join(list(problems.values())[:5])
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ImageError(f"{len(problems)} image(s) cannot be used: {listed}{more}; "
                             "fix them or pass --skip-bad to record them as errors")
        errors = [make_record(q, engine.template.name, error=problems[q.image]) for q in todo if q.image in problems]
        if errors:
            writer.write(errors)
            if progress:
                progress(len(errors))

        # image → prompt text → the questions (of any split) that ask it
        by_image: dict[str, dict[str, list[Question]]] = {}
        for q in todo:
            if q.image not in problems:
                by_image.setdefault(q.image, {}).setdefault(engine.prompt(q.text), []).append(q)
        evaluated = late_errors = 0
        for step in _prepared_groups(engine, images_dir, list(by_image), workers, embedded):
            # A file that passed the up-front check can still fail to decode (a PNG's chunks pass their
            # CRCs, its compressed data does not): an error record under skip_bad, else the run stops.
            records = []
            for name, failure in [(n, p) for n, p in step if isinstance(p, ImageError)]:
                if not skip_bad:
                    raise failure
                records += [make_record(q, engine.template.name, error=str(failure))
                            for qs in by_image[name].values() for q in qs]
                late_errors += sum(len(qs) for qs in by_image[name].values())
            step = [(n, p) for n, p in step if not isinstance(p, ImageError)]
            group = [name for name, _ in step]
            features = engine.encode([p for _, p in step]) if step else []
            texts = [list(by_image[name]) for name in group]
            outputs = engine.run_images(list(zip(features, texts))) if step else []
            for name, image_texts, image_outputs in zip(group, texts, outputs):
                for text, result in zip(image_texts, image_outputs):
                    predictions = engine.decide(result)
                    records += [make_record(q, engine.template.name, first_token_id=result.first_token_id,
                                            candidate_logits=result.candidate_logits, decoded=result.decoded,
                                            texts=result.texts, decoded_sequence=result.sequence,
                                            predictions=predictions, probe=_recorded(result.probe))
                                for q in by_image[name][text]]
                evaluated += len(image_texts)
            writer.write(records)
            if progress:
                progress(len(records))

    runs = write_summaries(out_dir, engine.readouts)
    return SweepResult(out_dir, len(questions), len(questions) - len(todo), evaluated, len(errors) + late_errors,
                       runs)


def _recorded(probe: dict | None) -> dict | None:
    """What a record keeps of a probe: one float per layer (every head's values stay in the API's results)."""
    return None if probe is None else {"image_attention": probe["image_attention"]}


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
        except ImageError as err:  # missing since the check, or passed it but not the decoder
            return err
        except Exception as err:  # a preprocessing failure is not the file's fault: stop, naming it
            raise RuntimeError(f"{path}: preprocessing failed ({err!r})") from err

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
    (out_dir / "summary.json").write_text(json.dumps({"runs": runs}, indent=2) + "\n", encoding="utf-8")
    (out_dir / "summary.md").write_text(format_runs(runs, "markdown") + "\n", encoding="utf-8")
    return runs
