"""The `pope-fast` command line. The only place that prints; heavy imports (torch) stay inside the
commands that need them, so `score` and `audit-tokens` run without torch."""
from __future__ import annotations

import sys

import click

from .readout import (DataError, TEMPLATES, Unavailable, audit_tokens, format_audit, format_runs,
                      get_template, load_tokenizer, parse_readouts, read_records, score_records)


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Fast POPE evaluation of vision-language models under every answer readout."""


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--readouts", default="all", show_default=True, help="all, or a comma-separated list")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True)
@click.option("--seed", default=0, show_default=True, help="bootstrap seed")
@click.option("--resamples", default=1000, show_default=True, help="bootstrap resamples")
def score(files, readouts, fmt, seed, resamples) -> None:
    """Score pope-fast records or published ugaa-research record files, without the model."""
    try:
        names = parse_readouts(readouts)
        explicit = readouts.strip() != "all"
        runs = []
        for path in files:
            runs += score_records(read_records(path), names, strict=explicit, seed=seed, resamples=resamples)
    except (DataError, Unavailable, ValueError) as err:
        _fail(str(err))
    click.echo(format_runs(runs, fmt))


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


@main.command()
def templates() -> None:
    """List the named prompt templates."""
    for t in TEMPLATES.values():
        shown = "(the tokenizer's chat template)" if t.chat else repr(t.text)
        click.echo(f"{t.name:15s} {shown}\n{'':15s} {t.origin}")


if __name__ == "__main__":
    sys.exit(main())
