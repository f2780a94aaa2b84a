"""The `pope-fast` command line. The only place that prints; heavy imports (torch) stay inside the
commands that need them, so `score` and `audit-tokens` run without torch."""
from __future__ import annotations

import sys
from contextlib import ExitStack

import click

from . import __version__
from . import helptext as h
from .errors import failures as _failures
from .folders import out_folder
from .hub import TOKENIZER_FILES, local_or_hub
from .readout import (TEMPLATES, THINKING_HELP, audit_tokens, expand_runs, format_audit,
                      get_template, load_tokenizer)
from .readout.benchmarks import REGISTRY
from .readout.protocols import PROTOCOLS, SCORING_PROTOCOLS
from .score_jobs import CompareJob, ScoreJob
from .store import RunLock, repair_records

BENCHMARKS = ["pope", "repope", *REGISTRY]

# options more than one command takes
RESAMPLES = dict(default=1000, show_default=True, type=click.IntRange(min=1),
                 help="bootstrap resamples")
SEED = dict(default=0, show_default=True, help="bootstrap seed")
SCORED_UNDER = dict(default=None, type=click.Choice(list(SCORING_PROTOCOLS)), help=h.PROTOCOL_HELP)
MARKDOWN_JSON = dict(type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
READOUT_LIST = dict(default="all", show_default=True, help="all, or a comma-separated list")
DEVICE = dict(default=None, help="cpu or cuda (default: cuda when available)")
DTYPES = click.Choice(["fp32", "fp16", "bf16"])
QUANTS = click.Choice(["none", "nf4"])
PROBES = dict(type=click.Choice(["none", "image-attention", "image-attention:heads"]),
              default="none", show_default=True)
METHODS = dict(multiple=True, metavar="NAME[:key=value,...]")


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pope-fast")
def main() -> None:
    """Fast POPE evaluation of vision-language models under every answer readout."""


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--readouts", **READOUT_LIST)
@click.option("--format", "fmt", default="table", show_default=True, help=h.SCORE_FORMAT,
              type=click.Choice(["table", "json", "markdown", "models", "latex", "csv"]))
@click.option("--percent", is_flag=True, help=h.SCORE_PERCENT)
@click.option("--seed", **SEED)
@click.option("--resamples", **RESAMPLES)
@click.option("--layers", default=None, metavar="FIRST-LAST", help=h.SCORE_LAYERS)
@click.option("--protocol", **SCORED_UNDER)
@click.option("--labels", "labels", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help=h.SCORE_LABELS)
@click.option("--benchmark", type=click.Choice(BENCHMARKS), default=None,
              help=h.SCORE_BENCHMARK)
@click.option("--data", type=click.Path(exists=True), default=None, help=h.SCORE_DATA)
def score(files, readouts, fmt, percent, seed, resamples, layers, protocol, labels, benchmark,
          data) -> None:
    """Score pope-fast records, published ugaa-research record files, or other tools' result files
    of a benchmark, without the model."""
    with _failures():
        click.echo(ScoreJob(files, readouts, fmt, percent, seed, resamples, layers, protocol,
                            labels, benchmark, data).run())


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", **MARKDOWN_JSON)
@click.option("--seed", **SEED)
@click.option("--resamples", **RESAMPLES)
@click.option("--allow-mismatch", is_flag=True, help=h.COMPARE_MISMATCH)
@click.option("--protocol", **SCORED_UNDER)
@click.option("--benchmark", type=click.Choice(list(REGISTRY)), default=None,
              help=h.COMPARE_BENCHMARK)
def compare(runs, fmt, seed, resamples, allow_mismatch, protocol, benchmark) -> None:
    """Compare runs with the first (the baseline) on the same questions: per readout and split, ΔF1
    with a paired bootstrap interval, McNemar's exact p and the answers flipped; a benchmark's runs
    on its metrics."""
    if len(runs := tuple(expand_runs(runs))) < 2:
        _fail("compare needs a baseline run and at least one more: pope-fast compare RUN_A RUN_B "
              "[...] (or a paired run's folder)")
    with _failures():
        click.echo(CompareJob(runs, fmt, seed, resamples, allow_mismatch, protocol,
                              benchmark).run())


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="folder for the report")
@click.option("--seed", **SEED)
@click.option("--resamples", **RESAMPLES)
@click.option("--protocol", **SCORED_UNDER)
@click.option("--formats", default="png,pdf,svg,column", show_default=True, help=h.FORMATS_HELP)
def report(runs, out_dir, seed, resamples, protocol, formats) -> None:
    """Figures, F1 tables (markdown, LaTeX) and one self-contained report.html for runs, record
    files and paired folders (eval --method's OUT: its runs and a ΔF1 figure per pair of its
    compare.json)."""
    from .readout.report.page import write_report  # the report's modules load only for `report`

    # no matplotlib, or a format that is none, refused before any table is written
    with _failures():
        page = write_report(list(runs), out_dir, seed=seed, resamples=resamples, protocol=protocol,
                            formats=formats.split(","))
    click.echo(f"report in {page} (figures with their numbers as JSON, tables.md, tables.tex "
               "beside it)")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def repair(run_dir) -> None:
    """Keep the last complete record of each question in a run folder that holds duplicates (writers
    that did not take its lock, a copy gone wrong); drop torn lines."""
    with _failures(), RunLock(run_dir):
        kept, dropped = repair_records(run_dir)
    click.echo(f"{run_dir}: kept {kept} records, dropped {dropped} line(s); run the same eval "
               "again to resume and rewrite its summaries")


@main.command("audit-tokens")
@click.option("--tokenizer", "tokenizer_dir", required=True, help=h.AUDIT_TOKENIZER)
@click.option("--template", default="llava_plain", show_default=True,
              type=click.Choice(list(TEMPLATES)))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def audit_tokens_cmd(tokenizer_dir, template, fmt) -> None:
    """Show every token readout's yes/no ids under a tokenizer and template, with warnings."""
    try:
        audit = audit_tokens(load_tokenizer(local_or_hub(tokenizer_dir, "--tokenizer",
                                                         TOKENIZER_FILES)[0]),
                             get_template(template))
    except (OSError, ValueError) as err:
        _fail(str(err))
    click.echo(format_audit(audit, fmt))


@main.command("eval")
@click.option("--model", "model_dir", default=None, help=h.EVAL_MODEL)
@click.option("--questions", "question_files", multiple=True, help=h.EVAL_QUESTIONS)
@click.option("--subset", default=None, help=h.EVAL_SUBSET)
@click.option("--images", "images_dir", default=None, type=click.Path(), help=h.EVAL_IMAGES)
@click.option("--demo-questions", default=60, show_default=True, type=click.IntRange(min=1),
              help="size of the demo's built-in question set")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help=h.EVAL_OUT)
@click.option("--split", default=None, help=h.EVAL_SPLIT)
@click.option("--dataset", default=None, help=h.EVAL_DATASET)
@click.option("--template", default=None, type=click.Choice(list(TEMPLATES)),
              help="default: the model's own")
@click.option("--readouts", **READOUT_LIST)
@click.option("--quant", type=QUANTS, default="none", show_default=True)
@click.option("--dtype", type=DTYPES, default=None, help=h.EVAL_DTYPE)
@click.option("--device", **DEVICE)
@click.option("--batch-size", default=None, type=click.IntRange(min=1), help=h.EVAL_BATCH_SIZE)
@click.option("--image-batch", default=None, type=click.IntRange(min=1), help=h.EVAL_IMAGE_BATCH)
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False), help=h.EVAL_CACHE_DIR)
@click.option("--max-new-tokens", default=None, type=click.IntRange(min=1),
              help=h.EVAL_MAX_NEW_TOKENS)
@click.option("--image-aspect", type=click.Choice(["processor", "pad"]), default=None,
              help=h.EVAL_IMAGE_ASPECT)
@click.option("--protocol", default=None, type=click.Choice(list(PROTOCOLS)), help=h.EVAL_PROTOCOL)
@click.option("--seed", default=0, show_default=True, help=h.EVAL_SEED)
@click.option("--nf4-weights", type=click.Choice(["dequantized", "packed"]), default="dequantized",
              show_default=True, help=h.EVAL_NF4_WEIGHTS)
@click.option("--quantize-lm-head", is_flag=True, help=h.EVAL_QUANTIZE_LM_HEAD)
@click.option("--kernels", type=click.Choice(["auto", "triton", "torch"]), default="auto",
              show_default=True, help="auto: Triton kernels on CUDA, torch references elsewhere")
@click.option("--no-prefix-reuse", is_flag=True, help=h.EVAL_NO_PREFIX_REUSE)
@click.option("--probe", **PROBES, help=h.EVAL_PROBE)
@click.option("--record-mass", is_flag=True, help=h.EVAL_RECORD_MASS)
@click.option("--thinking", default=None, metavar="off|decode[:max_tokens=N]", help=THINKING_HELP)
@click.option("--method", "method_specs", **METHODS, help=h.EVAL_METHOD)
@click.option("--backend", type=click.Choice(["auto", "engine", "transformers"]), default="auto",
              show_default=True, help=h.EVAL_BACKEND)
@click.option("--skip-bad", is_flag=True, help=h.EVAL_SKIP_BAD)
@click.option("--limit", default=None, type=click.IntRange(min=1), help=h.EVAL_LIMIT)
@click.option("--limit-per-split", default=None, type=click.IntRange(min=1), help=h.EVAL_PER_SPLIT)
@click.option("--benchmark", type=click.Choice(BENCHMARKS), default=None, help=h.EVAL_BENCHMARK)
def eval_cmd(out_dir, cache_dir, device, **options) -> None:
    """Run a POPE sweep of one checkpoint under every readout at once.

    Without --model this is the demo: a random tiny LLaVA-1.5 (real 576-token image prefix) written
    by transformers, on synthetic images; the numbers mean nothing, the pipeline is the real one.
    """
    from .distributed import device_and_shard  # torch, as the next
    from .evaluate import EvalJob, run_eval  # torch: only a command that runs a model loads it
    from .progress import progress_bar

    with ExitStack() as stack:
        # the folders before anything is written; an --out it made goes if left empty
        with _failures():
            out = stack.enter_context(out_folder(out_dir, cache_dir, options["question_files"]))
        with _failures():
            device, shard = device_and_shard(device)
        with _failures(shard):
            job = EvalJob.from_options(out, cache_dir=cache_dir, device=device,
                                       command=" ".join(sys.argv), **options)
            outcome = run_eval(job, shard, progress_bar, lambda text: click.echo(text, err=True))
    if outcome is not None:  # rank 0 (or the only process) reports
        click.echo(outcome.summary())


@main.command()
@click.option("--models", default="all", show_default=True, help=h.BENCH_MODELS)
@click.option("--model", "model_dirs", multiple=True, help=h.BENCH_MODEL)
@click.option("--size", type=click.Choice(["tiny", "7b"]), default=None, help=h.BENCH_SIZE)
@click.option("--questions", "n_questions", default=60, show_default=True,
              type=click.IntRange(min=0), help=h.BENCH_QUESTIONS)
@click.option("--pope", "pope_dir", default=None, type=click.Path(exists=True, file_okay=False),
              help=h.BENCH_POPE)
@click.option("--device", **DEVICE)
@click.option("--quant", type=QUANTS, default=None, help=h.BENCH_QUANT)
@click.option("--dtype", type=DTYPES, default=None)
@click.option("--batch-size", default=None, type=click.IntRange(min=1), help=h.BENCH_BATCH_SIZE)
@click.option("--probe", **PROBES, help=h.BENCH_PROBE)
@click.option("--method", "method_specs", **METHODS, help=h.BENCH_METHOD)
@click.option("--no-reference", is_flag=True, help="skip the transformers reference pipeline")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help=h.BENCH_REPEAT)
@click.option("--reference-sample", default=None, type=click.IntRange(min=1),
              help=h.BENCH_REFERENCE_SAMPLE)
@click.option("--tokenizer", "tokenizer_dir", default=None, help=h.BENCH_TOKENIZER)
@click.option("--work-dir", default=None, type=click.Path(file_okay=False), help=h.BENCH_WORK_DIR)
@click.option("--format", "fmt", **MARKDOWN_JSON)
def bench(device, fmt, **options) -> None:
    """Throughput of pope-fast against the paper's transformers pipeline, side by side."""
    import json

    from .bench import BenchConfig, format_report, run_bench  # torch: bench runs models
    from .distributed import device_and_shard  # torch, as bench
    from .progress import labelled_bars

    with _failures():  # under torchrun every rank times its share; rank 0 reports
        device, shard = device_and_shard(device)
    with labelled_bars() as progress, _failures(shard, (ValueError,)):
        report = run_bench(BenchConfig.from_options(device=device, shard=shard, **options),
                           progress)
    if shard is not None:
        shard.leave()
    if shard is None or shard.lead:
        click.echo(json.dumps(report, indent=2) if fmt == "json" else format_report(report))


@main.command()
@click.option("--model", "model", required=True,
              help="a checkpoint folder or a hub id ORG/NAME[@REVISION]")
@click.option("--questions", "n_questions", default=8, show_default=True,
              type=click.IntRange(min=1))
@click.option("--images", "images_dir", default=None,
              type=click.Path(exists=True, file_okay=False))
@click.option("--dtype", type=DTYPES, default=None)
@click.option("--quant", type=QUANTS, default="none", show_default=True)
@click.option("--device", **DEVICE)
@click.option("--max-new-tokens", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--backend", type=click.Choice(["engine", "transformers"]), default="engine",
              show_default=True)
def verify(model, **options) -> None:
    """The engine (or --backend transformers) against the class; exit 0 agree, 1 disagree, 3
    nothing verified."""
    # torch and transformers: only this command loads them here
    from .verify import verify as run_verify
    with _failures():
        verdict = run_verify(local_or_hub(model, "--model")[0], **options)
    click.echo(verdict.summary())
    sys.exit(verdict.exit_status)


@main.command()
@click.option("--tokenizer", "tokenizer_dir", default=None, help=h.PROTOCOLS_TOKENIZER)
def protocols(tokenizer_dir) -> None:
    """The published protocols: sources, answer rule, aggregation, and the prompt each renders per
    family."""
    # torch (the family registry): only `protocols` loads it
    from .protocol_table import describe_protocols

    with _failures():
        text = describe_protocols(
            load_tokenizer(local_or_hub(tokenizer_dir, "--tokenizer", TOKENIZER_FILES)[0])
            if tokenizer_dir else None)
    click.echo(text)


@main.command()
def templates() -> None:
    """List the named prompt templates."""
    for t in TEMPLATES.values():
        shown = "(the tokenizer's chat template)" if t.chat else repr(t.render("{question}"))
        click.echo(f"{t.name:15s} {shown}\n{'':15s} {t.origin}")


if __name__ == "__main__":
    sys.exit(main())
