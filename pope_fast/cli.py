"""The `pope-fast` command line. The only place that prints; heavy imports (torch) stay inside the
commands that need them, so `score` and `audit-tokens` run without torch."""
from __future__ import annotations

import errno
import sys
import tempfile
import threading
from contextlib import ExitStack, contextmanager
from pathlib import Path

import click

from .readout import (READOUTS, DataError, TEMPLATES, RunLock, Unavailable, audit_tokens, compare_runs, format_audit,
                      format_compare, format_runs, get_template, load_tokenizer, parse_readouts, read_records,
                      repair_records, score_records)


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _os_message(err: OSError) -> str:
    """One line naming the file an OSError is about, and what to do after a full disk."""
    where = f"{err.filename}: " if err.filename else ""
    hint = ("; free some space and run the same command again: it resumes from the records written so far"
            if err.errno in (errno.ENOSPC, errno.EDQUOT) else "")
    return f"{where}{err.strerror or err}{hint}"


def _writable_dir(path: str, option: str) -> Path:
    """The folder an option names, created and proven writable before any work starts."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        _fail(f"{option} {path}: not a writable folder ({err.strerror or err})")
    return folder


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Fast POPE evaluation of vision-language models under every answer readout."""


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--readouts", default="all", show_default=True, help="all, or a comma-separated list")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "models", "latex"]), default="table",
              show_default=True, help="models: one F1 table per split, models (files) as rows and readouts as "
                                      "columns, best per row in bold, in markdown; latex: the same in LaTeX (booktabs)")
@click.option("--seed", default=0, show_default=True, help="bootstrap seed")
@click.option("--resamples", default=1000, show_default=True, type=click.IntRange(min=1), help="bootstrap resamples")
@click.option("--layers", default=None, metavar="FIRST-LAST",
              help="image-attention probe: the decoder layers averaged (inclusive; default: 14-19 on 32-layer "
                   "models, as the paper, else the middle fifth)")
def score(files, readouts, fmt, seed, resamples, layers) -> None:
    """Score pope-fast records or published ugaa-research record files, without the model."""
    try:
        names = parse_readouts(readouts)
        explicit = readouts.strip() != "all"
        span = _layer_range(layers)
        runs = []
        for path in files:
            scored = score_records(read_records(path), names, strict=explicit, seed=seed, resamples=resamples,
                                   layers=span)
            if not scored:
                raise DataError(f"{path}: no records to score")
            runs += scored
    except (DataError, Unavailable, ValueError) as err:
        _fail(str(err))
    except OSError as err:
        _fail(_os_message(err))
    click.echo(format_runs(runs, fmt))


def _layer_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, sep, last = text.partition("-")
    if not (sep and first.strip().isdigit() and last.strip().isdigit()) or int(first) > int(last):
        raise ValueError(f"--layers takes FIRST-LAST (e.g. 14-19), not {text!r}")
    return int(first), int(last)


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--seed", default=0, show_default=True, help="bootstrap seed")
@click.option("--resamples", default=1000, show_default=True, type=click.IntRange(min=1), help="bootstrap resamples")
@click.option("--allow-mismatch", is_flag=True,
              help="compare runs that differ in more than their method (dtype, quantization, template, token sets, "
                   "questions, library versions, or an imported file without meta.json); every table is flagged")
def compare(runs, fmt, seed, resamples, allow_mismatch) -> None:
    """Compare runs with the first (the baseline) on the same questions: per readout and split, ΔF1 with
    a paired bootstrap interval, McNemar's exact p and the answers flipped."""
    if len(runs) < 2:
        _fail("compare needs a baseline run and at least one more: pope-fast compare RUN_A RUN_B [...]")
    try:
        result = compare_runs(list(runs), seed=seed, resamples=resamples, allow_mismatch=allow_mismatch)
    except (DataError, Unavailable, ValueError) as err:
        _fail(str(err))
    except OSError as err:
        _fail(_os_message(err))
    click.echo(format_compare(result, fmt))


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="folder for the report")
@click.option("--seed", default=0, show_default=True, help="bootstrap seed")
@click.option("--resamples", default=1000, show_default=True, help="bootstrap resamples")
def report(runs, out_dir, seed, resamples) -> None:
    """Figures, F1 tables (markdown, LaTeX) and one self-contained report.html for runs or record files."""
    from .readout.figures import write_report

    try:
        page = write_report(list(runs), out_dir, seed=seed, resamples=resamples)
    except (DataError, ValueError) as err:
        _fail(str(err))
    click.echo(f"report in {page} (figures with their numbers as JSON, tables.md, tables.tex beside it)")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def repair(run_dir) -> None:
    """Keep the last complete record of each question in a run folder (one left with duplicates by
    two runs that wrote to it at once, before runs locked their folder); drop torn lines."""
    try:
        with RunLock(run_dir):
            kept, dropped = repair_records(run_dir)
    except (DataError, ValueError) as err:
        _fail(str(err))
    except OSError as err:
        _fail(_os_message(err))
    click.echo(f"{run_dir}: kept {kept} records, dropped {dropped} line(s); run the same eval again to "
               "resume and rewrite its summaries")


@main.command("audit-tokens")
@click.option("--tokenizer", "tokenizer_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="a local tokenizer (or checkpoint) folder")
@click.option("--template", default="llava_plain", show_default=True, type=click.Choice(list(TEMPLATES)))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def audit_tokens_cmd(tokenizer_dir, template, fmt) -> None:
    """Show every token readout's yes/no ids under a tokenizer and template, with warnings."""
    try:
        audit = audit_tokens(load_tokenizer(tokenizer_dir), get_template(template))
    except (OSError, ValueError) as err:
        _fail(str(err))
    click.echo(format_audit(audit, fmt))


@main.command("eval")
@click.option("--model", "model_dir", default=None, type=click.Path(file_okay=False),
              help="a local checkpoint folder (llava-hf layout); omit for the built-in demo (a random tiny LLaVA)")
@click.option("--questions", "question_files", multiple=True, type=click.Path(),
              help="a POPE question file (JSON, JSON lines, lmms-lab parquet) or a folder of them; repeatable; "
                   "demo default: a built-in POPE-shaped set")
@click.option("--images", "images_dir", default=None, type=click.Path(),
              help="the image folder (not needed for parquet, whose images are embedded); "
                   "demo default: synthetic stand-ins named after the questions' images")
@click.option("--demo-questions", default=60, show_default=True, type=click.IntRange(min=1),
              help="size of the demo's built-in question set")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="output folder: records.jsonl, meta.json, summary.json, summary.md")
@click.option("--split", default=None,
              help="split name for a single question file (default: its category column, else its name)")
@click.option("--dataset", default=None,
              help="dataset name for the question files (default: from their names: coco, aokvqa, gqa; lmms-lab for parquet)")
@click.option("--template", default=None, type=click.Choice(list(TEMPLATES)), help="default: the model's own")
@click.option("--readouts", default="all", show_default=True, help="all, or a comma-separated list")
@click.option("--quant", type=click.Choice(["none", "nf4"]), default="none", show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="default: fp32 on CPU, fp16 on CUDA and with NF4")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available)")
@click.option("--batch-size", default=16, show_default=True, help="question suffixes per prefill batch")
@click.option("--image-batch", default=8, show_default=True, type=click.IntRange(min=1),
              help="images per model step (one vision batch, their prefixes prefilled together); under torchrun "
                   "the unit the ranks share")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False), help="disk cache of image features")
@click.option("--max-new-tokens", default=None, type=click.IntRange(min=1),
              help="greedy tokens for every string readout (default: each as its reference runs it: string_parse "
                   "6, exact_match 128, pope_official until the end; the demo: 6)")
@click.option("--image-aspect", type=click.Choice(["processor", "pad"]), default="processor", show_default=True,
              help="pad: original LLaVA's pad-to-square with the mean colour before the processor")
@click.option("--nf4-weights", type=click.Choice(["dequantized", "packed"]), default="dequantized",
              show_default=True, help="NF4: dequantize once at load (same values) or keep packed (less memory)")
@click.option("--quantize-lm-head", is_flag=True, help="NF4: quantize lm_head too (transformers keeps it fp16)")
@click.option("--kernels", type=click.Choice(["auto", "triton", "torch"]), default="auto", show_default=True,
              help="auto: Triton kernels on CUDA, torch references elsewhere")
@click.option("--no-prefix-reuse", is_flag=True, help="prefill every question whole (for ablations)")
@click.option("--probe", type=click.Choice(["none", "image-attention", "image-attention:heads"]), default="none",
              show_default=True, help="image-attention: record, per layer, the answer position's attention mass on "
                                      "the image tokens (heads averaged); image-attention:heads: every head too")
@click.option("--method", "method_specs", multiple=True, metavar="NAME[:key=value,...]",
              help="a mitigation method (none, vcd, pai, icd; settings default to its paper's); repeatable: "
                   "methods run paired on the same questions, each into OUT/NAME/, compared in OUT/compare.json")
@click.option("--skip-bad", is_flag=True, help="record missing or undecodable images as error records")
def eval_cmd(model_dir, question_files, images_dir, demo_questions, out_dir, split, dataset, template, readouts, quant,
             dtype, device, batch_size, image_batch, cache_dir, max_new_tokens, image_aspect, nf4_weights,
             quantize_lm_head, kernels, no_prefix_reuse, probe, method_specs, skip_bad) -> None:
    """Run a POPE sweep of one checkpoint under every readout at once.

    Without --model this is the demo: a random tiny LLaVA-1.5 (real 576-token image prefix) written by
    transformers, on synthetic images; the numbers mean nothing, the pipeline is the real one.
    """
    import torch
    from tqdm import tqdm

    from .engine import CheckpointError, Engine, ImageError, Settings, parse_method, run_paired, run_pope

    if model_dir is not None and not question_files:
        _fail("with --model, give --questions (and --images unless the questions embed them)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    shard = _shard(device)  # None outside torchrun
    out = _writable_dir(out_dir, "--out")
    if cache_dir is not None:
        _writable_dir(cache_dir, "--cache-dir")
    with _failures(shard, (DataError, CheckpointError, ImageError, ValueError, NotImplementedError)):
        settings = Settings(device=shard.device(device) if shard else device, dtype=dtype, quant=quant,
                            quantize_lm_head=quantize_lm_head, nf4_weights=nf4_weights, batch_size=batch_size,
                            image_batch=image_batch,
                            # the demo's random model never ends a sentence: it reads 6 tokens
                            max_new_tokens=max_new_tokens or (6 if model_dir is None else None),
                            image_aspect=image_aspect, kernels=kernels, prefix_reuse=not no_prefix_reuse,
                            probe=probe)
        names = parse_readouts(readouts)
        methods = [parse_method(spec) for spec in method_specs]
        _check_method_readouts(methods, names if readouts.strip() != "all" else [])
        lead = shard is None or shard.lead
        with ExitStack() as stack:
            with _step(shard):  # rank 0 locks the folder before the load and writes the demo's inputs
                # a second run into this folder is refused at once
                lock = stack.enter_context(RunLock(out)) if lead else None
                questions = _questions(question_files, split, dataset)
                if model_dir is None and lead:
                    _demo_inputs(out, questions, images_dir, demo_questions, split)
            with _step(shard):
                if model_dir is None:
                    model_dir, questions, images_dir = _demo_inputs(out, questions, images_dir, demo_questions, split)
                elif images_dir is None and any(q.image_data is None for q in questions):
                    _fail("the question files name image files: give --images (parquet files embed their images)")
                engine = Engine.load(model_dir, settings, template=template, readouts=readouts, cache_dir=cache_dir)
                engine.warmup()
            # every method records each question once: the first method's folder counts the job's progress
            counted = out / methods[0].name if methods else out
            with tqdm(total=len(questions), unit="q", desc="POPE", dynamic_ncols=True, disable=not lead) as bar, \
                    _job_progress(shard, counted, bar):
                progress = bar.update if shard is None else None
                if methods:
                    results = run_paired(engine, questions, images_dir, out, methods, skip_bad=skip_bad,
                                         progress=progress, lock=lock, shard=shard)
                else:
                    results = [run_pope(engine, questions, images_dir, out, skip_bad=skip_bad, progress=progress,
                                        lock=lock, shard=shard)]
            comparison = _write_comparison(out, [r.out_dir for r in results]) if len(methods) > 1 and lead else None
    if shard is not None:
        shard.leave()
    if not lead:
        return
    first = results[0]
    if first.recorded_before:
        click.echo(f"resumed: {first.recorded_before} of {first.questions} questions were already recorded")
    ranks = f" on {shard.world_size} ranks" if shard else ""
    click.echo(f"{first.evaluated_prompts} unique prompts evaluated for {first.questions} questions{ranks}; "
               f"{first.error_records} error records; phases (s): {engine.timings.to_json()}"
               + (" (rank 0)" if shard else ""))
    for result in results:
        if methods:
            click.echo(f"\n{result.out_dir.name}:")
        click.echo(format_runs(result.runs, "table"))
    if comparison is not None:
        click.echo(f"\n{comparison}")
    click.echo(f"records, meta and summaries in {out}" + ("/<method>/" if methods else ""))


def _check_method_readouts(methods, explicit: list[str]) -> None:
    """A contrastive method reads the answer position only: refuse text readouts asked for by name."""
    from .readout.protocols import GENERATING

    contrastive = [m.name for m in methods if m.contrastive]
    text = [n for n in explicit if READOUTS[n].kind in GENERATING]
    if contrastive and text:
        _fail(f"--readouts {','.join(text)}: method {contrastive[0]} combines logits at the answer position, so its "
              "runs take logit and first-token readouts only")


def _write_comparison(out: Path, runs: list[Path]) -> str:
    """OUT/compare.json: every method against the first (`pope-fast compare`), and its markdown."""
    from .readout.records import atomic_write

    result = compare_runs([str(r) for r in runs])
    atomic_write(out / "compare.json", format_compare(result, "json") + "\n")
    return format_compare(result, "markdown")


def _shard(device: str):
    """This process's Shard, joined to its torchrun job, or None outside torchrun."""
    from .engine import Shard

    try:
        shard = Shard.from_env()
        if shard is not None:
            shard.join(device)
    except (ValueError, RuntimeError) as err:
        _fail(f"torchrun: cannot join the job ({err})")
    return shard


@contextmanager
def _step(shard):
    """A step every rank takes: if it fails on any rank, every rank stops naming the first that failed."""
    if shard is None:
        yield
        return
    try:
        yield
    except Exception as err:
        shard.agree(err)
        raise
    shard.agree(None)


@contextmanager
def _job_progress(shard, out: Path, bar):
    """Under torchrun, rank 0's bar counts the records of the whole job (records.jsonl and every rank's
    part), read by a thread twice a second."""
    if shard is None or not shard.lead:
        yield
        return
    from .engine.distributed import RecordCount

    count, stop = RecordCount(out), threading.Event()

    def watch():
        while not stop.wait(0.5):
            bar.update(max(0, min(count(), bar.total) - bar.n))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    bar.update(max(0, min(count(), bar.total) - bar.n))


@contextmanager
def _failures(shard, expected: tuple[type[Exception], ...]):
    """A command's errors as one line: the expected ones and OSError by their message; under torchrun
    any other too, named with its type, so that the rank is named and torchrun stops the others."""
    try:
        yield
    except expected as err:
        _fail(_on_rank(shard, str(err)))
    except OSError as err:
        _fail(_on_rank(shard, _os_message(err)))
    except Exception as err:
        if shard is None:
            raise
        _fail(_on_rank(shard, f"{type(err).__name__}: {err}"))


def _on_rank(shard, message: str) -> str:
    """A message from one rank of a torchrun job, named as such, and left where torchrun's summary shows it."""
    if shard is None:
        return message
    if not message.startswith("rank "):
        message = f"{shard.name}: {message}"
    shard.record_failure(message)
    return message


def _questions(sources, split, dataset) -> list:
    """Every question of the --questions files and folders (none: an empty list)."""
    from .readout import find_question_files, load_question_sources

    if split and sum(len(find_question_files(s)) for s in sources) > 1:
        _fail("--split names the split of a single question file")
    return load_question_sources(sources, split, dataset)


def _demo_inputs(out_dir, questions, images_dir, n_questions, split):
    """The built-in tiny model, questions and synthetic images for a run without --model."""
    import torch

    from .engine.models import DEMO, family_class
    from .engine.synthetic import builtin_questions, write_images

    demo, family = out_dir / "demo", family_class(DEMO)
    model_dir = demo / f"{DEMO}-tiny"
    if not (model_dir / "config.json").is_file():
        click.echo(f"demo: writing a random tiny {family.seed_model} checkpoint to {model_dir}", err=True)
        family.write_checkpoint(model_dir, "tiny", dtype=torch.float32)
    questions = questions or builtin_questions(n_questions, split or "demo")
    named = [q.image for q in questions if q.image_data is None]
    if images_dir is None and named:
        images_dir = write_images(demo / "images", named)
    return model_dir, questions, images_dir


@main.command()
@click.option("--models", default="all", show_default=True, help="all, or a comma-separated list of families")
@click.option("--model", "model_dirs", multiple=True, help="NAME=DIR: a real checkpoint for a family")
@click.option("--size", type=click.Choice(["tiny", "7b"]), default=None,
              help="random weights at tiny (real image-token count) or real 7B dims (default: 7b on CUDA, tiny on CPU)")
@click.option("--questions", "n_questions", default=60, show_default=True, type=click.IntRange(min=0),
              help="built-in POPE-shaped questions (6 per image); with --pope, a cap (0: all)")
@click.option("--pope", "pope_dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="a folder of POPE question files, *pope*.json (images are synthetic stand-ins named after them)")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available)")
@click.option("--quant", type=click.Choice(["none", "nf4"]), default=None,
              help="both pipelines (default: nf4 on CUDA as the paper ran it, none on CPU)")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None)
@click.option("--batch-size", default=32, show_default=True)
@click.option("--probe", type=click.Choice(["none", "image-attention", "image-attention:heads"]), default="none",
              show_default=True, help="pope-fast also records the image-attention probe (its cost shows in the wall time)")
@click.option("--method", "method_specs", multiple=True, metavar="NAME[:key=value,...]",
              help="also time these methods as one paired sweep (as eval --method), beside the baseline")
@click.option("--no-reference", is_flag=True, help="skip the transformers reference pipeline")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="timed runs of each pipeline (each pope-fast run cold: no records, no cached features); "
                   "the median run counts")
@click.option("--reference-sample", default=None, type=int,
              help="questions the reference runs, extrapolated to all (default: all on CPU, 200 on CUDA)")
@click.option("--tokenizer", "tokenizer_dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="a real tokenizer for the random checkpoints (default: the built-in word-level one)")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False), help="keep checkpoints and records here")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
def bench(models, model_dirs, size, n_questions, pope_dir, device, quant, dtype, batch_size, probe, method_specs,
          no_reference, repeat, reference_sample, tokenizer_dir, work_dir, fmt) -> None:
    """Throughput of pope-fast against the paper's transformers pipeline, side by side."""
    import json

    import torch
    from tqdm import tqdm

    from .bench import BenchConfig, format_report, run_bench
    from .engine import FAMILIES, parse_method

    if n_questions == 0 and pope_dir is None:
        _fail("--questions 0 means all of --pope's questions; without --pope give a number of built-in questions")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.startswith("cuda")
    try:
        for spec in method_specs:
            parse_method(spec)
    except ValueError as err:
        _fail(str(err))
    shard = _shard(device)  # under torchrun every rank times its share; rank 0 reports
    if shard is not None:
        if method_specs:
            _fail("bench --method times a paired sweep in one process; run it without torchrun")
        device = shard.device(device)
    names = list(FAMILIES) if models.strip() == "all" else [m.strip() for m in models.split(",") if m.strip()]
    dirs = {}
    for item in model_dirs:
        name, sep, path = item.partition("=")
        if not sep:
            _fail(f"--model takes NAME=DIR, got {item!r}")
        dirs[name] = Path(path)
    cfg = BenchConfig(models=names, size=size or ("7b" if on_cuda else "tiny"), device=device,
                      quant=quant or ("nf4" if on_cuda else "none"), dtype=dtype, n_questions=n_questions,
                      pope_dir=Path(pope_dir) if pope_dir else None, reference=not no_reference,
                      reference_sample=reference_sample or (200 if on_cuda else None), repeat=repeat,
                      batch_size=batch_size, probe=probe,
                      work_dir=Path(work_dir) if work_dir else None, model_dirs=dirs,
                      tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None, shard=shard,
                      methods=list(method_specs))
    bars: dict[str, tqdm] = {}

    def progress(label: str, n: int, total: int) -> None:
        if label not in bars:
            bars[label] = tqdm(total=total, desc=label, unit="q", dynamic_ncols=True, leave=False)
        bars[label].update(n)

    try:
        with _failures(shard, (ValueError,)):
            report = run_bench(cfg, progress)
    finally:
        for bar in bars.values():
            bar.close()
    if shard is not None:
        shard.leave()
    if shard is None or shard.lead:
        click.echo(json.dumps(report, indent=2) if fmt == "json" else format_report(report))


@main.command()
def templates() -> None:
    """List the named prompt templates."""
    for t in TEMPLATES.values():
        shown = "(the tokenizer's chat template)" if t.chat else repr(t.render("{question}"))
        click.echo(f"{t.name:15s} {shown}\n{'':15s} {t.origin}")


if __name__ == "__main__":
    sys.exit(main())
