"""The `pope-fast` command line. The only place that prints; heavy imports (torch) stay inside the
commands that need them, so `score` and `audit-tokens` run without torch."""
from __future__ import annotations

import sys
from contextlib import ExitStack

import click

from . import __version__
from .errors import failures as _failures
from .folders import out_folder
from .hub import TOKENIZER_FILES, local_or_hub
from .readout import TEMPLATES, THINKING_HELP, audit_tokens, expand_runs, format_audit, get_template, load_tokenizer
from .readout.benchmarks import REGISTRY
from .readout.protocols import PROTOCOLS, SCORING_PROTOCOLS
from .score_jobs import CompareJob, ScoreJob
from .store import RunLock, repair_records

BENCHMARKS = ["pope", "repope", *REGISTRY]

PROTOCOL_HELP = "score under a published protocol: its answer rule and aggregation, and whether the run is its"
FORMATS_HELP = "the files of each figure, comma-separated: png (the page embeds it), pdf, svg, column (a 3.3 in PDF)"
RESAMPLES = dict(default=1000, show_default=True, type=click.IntRange(min=1), help="bootstrap resamples")


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pope-fast")
def main() -> None:
    """Fast POPE evaluation of vision-language models under every answer readout."""


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--readouts", default="all", show_default=True, help="all, or a comma-separated list")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "models", "latex", "csv"]),
              default="table", show_default=True,
              help="models: one F1 table per split, models (files) as rows and readouts as columns, best per row in "
                   "bold, in markdown; latex: the same in LaTeX (booktabs); csv: a row per readout and split, "
                   "Overall first (VLMEvalKit's score file, with source and readout columns), full precision")
@click.option("--percent", is_flag=True, help="rates x100 (2 decimals in the tables); not with json or --protocol")
@click.option("--seed", default=0, show_default=True, help="bootstrap seed")
@click.option("--resamples", **RESAMPLES)
@click.option("--layers", default=None, metavar="FIRST-LAST",
              help="image-attention probe: the decoder layers averaged (inclusive; default: 14-19 on 32-layer "
                   "models, as the paper, else the middle fifth)")
@click.option("--protocol", default=None, type=click.Choice(list(SCORING_PROTOCOLS)), help=PROTOCOL_HELP)
@click.option("--labels", "labels", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="corrected labels in POPE's format, one file per split named by it (RePOPE's "
                   "annotations/coco_repope_{split}.json): the runs are scored under them too, side by side")
@click.option("--benchmark", type=click.Choice(BENCHMARKS), default=None,
              help="default: what the files are (a run's records, another tool's result file's layout)")
@click.option("--data", type=click.Path(exists=True), default=None,
              help="the benchmark's question data, for a result file that holds no labels (AMBER's)")
def score(files, readouts, fmt, percent, seed, resamples, layers, protocol, labels, benchmark, data) -> None:
    """Score pope-fast records, published ugaa-research record files, or other tools' result files of a
    benchmark, without the model."""
    with _failures():
        click.echo(ScoreJob(files, readouts, fmt, percent, seed, resamples, layers, protocol, labels, benchmark,
                            data).run())


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--seed", default=0, show_default=True, help="bootstrap seed")
@click.option("--resamples", **RESAMPLES)
@click.option("--allow-mismatch", is_flag=True,
              help="compare runs that differ in more than their method (dtype, quantization, template, token sets, "
                   "questions, library versions, or an imported file without meta.json); every table is flagged")
@click.option("--protocol", default=None, type=click.Choice(list(SCORING_PROTOCOLS)), help=PROTOCOL_HELP)
@click.option("--benchmark", type=click.Choice(list(REGISTRY)), default=None,
              help="default: the runs' meta.json; a benchmark's runs compare on its own metrics, per rule")
def compare(runs, fmt, seed, resamples, allow_mismatch, protocol, benchmark) -> None:
    """Compare runs with the first (the baseline) on the same questions: per readout and split, ΔF1 with
    a paired bootstrap interval, McNemar's exact p and the answers flipped; a benchmark's runs on its metrics."""
    if len(runs := tuple(expand_runs(runs))) < 2:
        _fail("compare needs a baseline run and at least one more: pope-fast compare RUN_A RUN_B [...] (or a "
              "paired run's folder)")
    with _failures():
        click.echo(CompareJob(runs, fmt, seed, resamples, allow_mismatch, protocol, benchmark).run())


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="folder for the report")
@click.option("--seed", default=0, show_default=True, help="bootstrap seed")
@click.option("--resamples", **RESAMPLES)
@click.option("--protocol", default=None, type=click.Choice(list(SCORING_PROTOCOLS)), help=PROTOCOL_HELP)
@click.option("--formats", default="png,pdf,svg,column", show_default=True, help=FORMATS_HELP)
def report(runs, out_dir, seed, resamples, protocol, formats) -> None:
    """Figures, F1 tables (markdown, LaTeX) and one self-contained report.html for runs, record files and
    paired folders (eval --method's OUT: its runs and a ΔF1 figure per pair of its compare.json)."""
    from .readout.report.page import write_report  # the report's modules load only for `report`

    with _failures():  # no matplotlib, or a format that is none, refused before any table is written
        page = write_report(list(runs), out_dir, seed=seed, resamples=resamples, protocol=protocol,
                            formats=formats.split(","))
    click.echo(f"report in {page} (figures with their numbers as JSON, tables.md, tables.tex beside it)")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def repair(run_dir) -> None:
    """Keep the last complete record of each question in a run folder that holds duplicates (writers
    that did not take its lock, a copy gone wrong); drop torn lines."""
    with _failures(), RunLock(run_dir):
        kept, dropped = repair_records(run_dir)
    click.echo(f"{run_dir}: kept {kept} records, dropped {dropped} line(s); run the same eval again to "
               "resume and rewrite its summaries")


@main.command("audit-tokens")
@click.option("--tokenizer", "tokenizer_dir", required=True,
              help="a tokenizer (or checkpoint) folder, or a hub id ORG/NAME[@REVISION] (its tokenizer files)")
@click.option("--template", default="llava_plain", show_default=True, type=click.Choice(list(TEMPLATES)))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def audit_tokens_cmd(tokenizer_dir, template, fmt) -> None:
    """Show every token readout's yes/no ids under a tokenizer and template, with warnings."""
    try:
        audit = audit_tokens(load_tokenizer(local_or_hub(tokenizer_dir, "--tokenizer", TOKENIZER_FILES)[0]),
                             get_template(template))
    except (OSError, ValueError) as err:
        _fail(str(err))
    click.echo(format_audit(audit, fmt))


@main.command("eval")
@click.option("--model", "model_dir", default=None,
              help="a checkpoint folder, or a hub id ORG/NAME[@REVISION] (the HF cache first, else downloaded); "
                   "omit for the built-in demo (a random tiny LLaVA)")
@click.option("--questions", "question_files", multiple=True,
              help="a POPE question file (JSON, JSON lines, lmms-lab parquet), a folder of them (and POPE's below it: "
                   "POPE/output), or a hub dataset id (lmms-lab/POPE); repeatable; demo default: a built-in POPE set")
@click.option("--subset", default=None, help="a hub dataset's subset (its card's config; default: 'default')")
@click.option("--images", "images_dir", default=None, type=click.Path(),
              help="the image folder (not needed for parquet, whose images are embedded); "
                   "demo default: synthetic stand-ins named after the questions' images")
@click.option("--demo-questions", default=60, show_default=True, type=click.IntRange(min=1),
              help="size of the demo's built-in question set")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="output folder: records.jsonl, meta.json, summary.json, summary.md")
@click.option("--split", default=None, help="split name for a single question file (default: its category column, "
                                            "else its name); of a hub dataset, the split to read (default: all)")
@click.option("--dataset", default=None,
              help="the question files' dataset (default: from their names: coco, aokvqa, gqa; lmms-lab for parquet)")
@click.option("--template", default=None, type=click.Choice(list(TEMPLATES)), help="default: the model's own")
@click.option("--readouts", default="all", show_default=True, help="all, or a comma-separated list")
@click.option("--quant", type=click.Choice(["none", "nf4"]), default="none", show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="default: fp32 on CPU, fp16 on CUDA and with NF4")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available)")
@click.option("--batch-size", default=None, type=click.IntRange(min=1), help="question suffixes per prefill batch")
@click.option("--image-batch", default=None, type=click.IntRange(min=1), help="images per model step "
              "(their prefixes together); the unit torchrun ranks share (both: sized to the device, docs/running.md)")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False), help="disk cache of image features")
@click.option("--max-new-tokens", default=None, type=click.IntRange(min=1), help="new tokens for every string readout "
              "(default: each as its reference runs it: string_parse 6, the others 128; the demo: 6)")
@click.option("--image-aspect", type=click.Choice(["processor", "pad"]), default=None,
              help="processor (the default) | pad: original LLaVA's pad-to-square with the mean colour first")
@click.option("--protocol", default=None, type=click.Choice(list(PROTOCOLS)),
              help="a published protocol's prompt, generation length and image preprocessing for this model (pope-fast "
                   "protocols lists them); every readout is still recorded")
@click.option("--seed", default=0, show_default=True, help="the draws' seed, where --protocol samples (vcd)")
@click.option("--nf4-weights", type=click.Choice(["dequantized", "packed"]), default="dequantized",
              show_default=True, help="NF4: dequantize once at load (same values) or keep packed (less memory)")
@click.option("--quantize-lm-head", is_flag=True, help="NF4: quantize lm_head too (transformers keeps it fp16)")
@click.option("--kernels", type=click.Choice(["auto", "triton", "torch"]), default="auto", show_default=True,
              help="auto: Triton kernels on CUDA, torch references elsewhere")
@click.option("--no-prefix-reuse", is_flag=True, help="prefill every question whole (for ablations)")
@click.option("--probe", type=click.Choice(["none", "image-attention", "image-attention:heads"]), default="none",
              show_default=True, help="record the answer position's attention mass on the image, per layer (:heads)")
@click.option("--record-mass", is_flag=True, help="record the answer position's log-sum-exp over every lm_head row")
@click.option("--thinking", default=None, metavar="off|decode[:max_tokens=N]", help=THINKING_HELP)
@click.option("--method", "method_specs", multiple=True, metavar="NAME[:key=value,...]",
              help="a mitigation method (docs/methods.md; settings default to its paper's); repeatable: "
                   "methods run paired on the same questions, each into OUT/NAME/, compared in OUT/compare.json")
@click.option("--backend", type=click.Choice(["auto", "engine", "transformers"]), default="auto", show_default=True,
              help="transformers: the model's own class, every prompt whole (auto: where the engine has no family)")
@click.option("--skip-bad", is_flag=True, help="record missing or undecodable images as error records")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="only the first N questions, in file order")
@click.option("--limit-per-split", default=None, type=click.IntRange(min=1), help="only the first N of each split")
@click.option("--benchmark", type=click.Choice(BENCHMARKS), default=None,
              help="default: what --questions is (MME's parquet, AMBER's data folder, HallusionBench.json; else POPE)")
def eval_cmd(out_dir, cache_dir, device, **options) -> None:
    """Run a POPE sweep of one checkpoint under every readout at once.

    Without --model this is the demo: a random tiny LLaVA-1.5 (real 576-token image prefix) written by
    transformers, on synthetic images; the numbers mean nothing, the pipeline is the real one.
    """
    from .distributed import device_and_shard  # torch, as the next
    from .evaluate import EvalJob, run_eval  # torch: only a command that runs a model loads it
    from .progress import progress_bar

    with ExitStack() as stack:
        with _failures():  # the folders before anything is written; an --out it made goes if left empty
            out = stack.enter_context(out_folder(out_dir, cache_dir, options["question_files"]))
        with _failures():
            device, shard = device_and_shard(device)
        with _failures(shard):
            job = EvalJob.from_options(out, cache_dir=cache_dir, device=device, command=" ".join(sys.argv), **options)
            outcome = run_eval(job, shard, progress_bar, lambda text: click.echo(text, err=True))
    if outcome is not None:  # rank 0 (or the only process) reports
        click.echo(outcome.summary())


@main.command()
@click.option("--models", default="all", show_default=True,
              help="all (the families), or a comma-separated list of families and models without one (mllama, ...)")
@click.option("--model", "model_dirs", multiple=True,
              help="NAME=DIR: a real checkpoint for a family (DIR: a folder or a hub id ORG/NAME[@REVISION])")
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
@click.option("--batch-size", default=None, type=click.IntRange(min=1), help="as eval's (default: the device's)")
@click.option("--probe", type=click.Choice(["none", "image-attention", "image-attention:heads"]), default="none",
              show_default=True, help="pope-fast also records the image-attention probe (its cost is in the wall time)")
@click.option("--method", "method_specs", multiple=True, metavar="NAME[:key=value,...]",
              help="also time these methods as one paired sweep (as eval --method), beside the baseline")
@click.option("--no-reference", is_flag=True, help="skip the transformers reference pipeline")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="timed runs of each pipeline (each pope-fast run cold: no records, no cached features); "
                   "the median run counts")
@click.option("--reference-sample", default=None, type=click.IntRange(min=1),
              help="questions the reference runs, extrapolated to all (default: all on CPU, 200 on CUDA)")
@click.option("--tokenizer", "tokenizer_dir", default=None,
              help="a real tokenizer for the random checkpoints, a folder or hub id (default: a built-in stand-in)")
@click.option("--work-dir", default=None, type=click.Path(file_okay=False), help="keep checkpoints and records here")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
def bench(device, fmt, **options) -> None:
    """Throughput of pope-fast against the paper's transformers pipeline, side by side."""
    import json

    from .bench import BenchConfig, format_report, run_bench  # torch: bench runs models
    from .distributed import device_and_shard  # torch, as bench
    from .progress import labelled_bars

    with _failures():  # under torchrun every rank times its share; rank 0 reports
        device, shard = device_and_shard(device)
    with labelled_bars() as progress, _failures(shard, (ValueError,)):
        report = run_bench(BenchConfig.from_options(device=device, shard=shard, **options), progress)
    if shard is not None:
        shard.leave()
    if shard is None or shard.lead:
        click.echo(json.dumps(report, indent=2) if fmt == "json" else format_report(report))


@main.command()
@click.option("--model", "model", required=True, help="a checkpoint folder or a hub id ORG/NAME[@REVISION]")
@click.option("--questions", "n_questions", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--images", "images_dir", default=None, type=click.Path(exists=True, file_okay=False))
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None)
@click.option("--quant", type=click.Choice(["none", "nf4"]), default="none", show_default=True)
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available)")
@click.option("--max-new-tokens", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--backend", type=click.Choice(["engine", "transformers"]), default="engine", show_default=True)
def verify(model, **options) -> None:
    """The engine (or --backend transformers) against the class; exit 0 agree, 1 disagree, 3 nothing verified."""
    from .verify import verify as run_verify  # torch and transformers: only this command loads them here
    with _failures():
        verdict = run_verify(local_or_hub(model, "--model")[0], **options)
    click.echo(verdict.summary())
    sys.exit(verdict.exit_status)


@main.command()
@click.option("--tokenizer", "tokenizer_dir", default=None,
              help="a checkpoint or tokenizer folder (or hub id) whose chat template renders the chat prompts")
def protocols(tokenizer_dir) -> None:
    """The published protocols: sources, answer rule, aggregation, and the prompt each renders per family."""
    from .protocol_table import describe_protocols  # torch (the family registry): only `protocols` loads it

    with _failures():
        text = describe_protocols(load_tokenizer(local_or_hub(tokenizer_dir, "--tokenizer", TOKENIZER_FILES)[0])
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
