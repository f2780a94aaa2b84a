"""`pope-fast report`: every figure with its numbers, the F1 tables, and one
self-contained HTML page.

Inputs are run folders, record files, and paired folders (`pope-fast eval --method ...`'s OUT,
holding OUT/<method>/ and OUT/compare.json): a paired folder contributes each of its runs and a ΔF1
figure per pair of its compare.json. The page leads with what made each run (model, template,
method, dtype, quantization, date, version), then the figures across runs, then each run's own;
every figure has a number and a caption.
"""
from __future__ import annotations

import base64
import html
import importlib.util
import json
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from . import column as column_layout
from . import figure_data, figures, grid_figure
from ..benchmarks.compare import format_benchmark_compare
from ..benchmarks.reading import read_records
from ..benchmarks.score import format_benchmark, only_rule, rule_of, run_benchmark, score_run
from ..protocols import format_protocol_runs, get_protocol, score_protocol
from ..readouts import READOUTS
from ..records import RECORDS_FILE, RecordSet, expand_runs, rank_parts, strict_json
from ..score import reason_lines, score_records
from .bias_format import format_bias
from .markup import markdown_html
from .run_header import HEADER, header_row, shown_command, shown_path
from .tables import (INCOMPLETE, asked_note, f1_tables, format_f1_tables, format_grids, group_name,
                     model_labels, reasons_of)

COMPARE_FILE = "compare.json"
STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}"
         "td,th{border-bottom:1px solid #ccc;padding:2px 8px;text-align:right}"
         "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
         ".wide{overflow-x:auto}.wide table{font-size:0.85em}"
         "figure{margin:1.5em 0;max-width:100%}figcaption{font-size:0.9em;color:#333}"
         "table.runs td,table.runs th{text-align:left;vertical-align:top}code{font-size:0.9em}"
         ".side{display:flex;flex-wrap:wrap;gap:0 24px}.side figure{margin:1em 0}")


@dataclass
class Inputs:
    scored: list[tuple[dict, RecordSet]] = field(default_factory=list)  # one per run and split
    metas: dict[str, dict] = field(default_factory=dict)  # records source → its meta.json
    # (compare.json's path, its result, each run as compare.json names it → that
    # run's records source)
    comparisons: list[tuple[Path, dict, dict[str, str]]] = field(default_factory=list)


def _paired(path: Path) -> bool:
    """A paired folder: compare.json beside the method folders, no records of its own."""
    return (path.is_dir() and (path / COMPARE_FILE).is_file() and not (path / RECORDS_FILE).exists()
            and not rank_parts(path))


def _compared(folder: Path) -> tuple[dict, dict[str, Path]]:
    """compare.json's result and where each run it names lies now: in the folder beside it (the
    paired folder may have moved since it was written), else the path as written."""
    try:
        result = json.loads((folder / COMPARE_FILE).read_text(encoding="utf-8"))
        names = [name for pair in result["pairs"] for name in (pair["a"], pair["b"])]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{folder / COMPARE_FILE}: not a pope-fast compare result ({err})"
                         ) from None
    located = {}
    for name in dict.fromkeys(names):
        here = folder / Path(name).name
        located[name] = here if here.is_dir() else Path(name)
    return result, located


def read_inputs(paths: list[str | Path], *, seed: int, resamples: int) -> Inputs:
    inputs = Inputs()
    names = list(READOUTS)  # as `pope-fast score` does with its default --readouts all
    read: dict[Path, str] = {}  # each run read once, even when named twice

    def add(path: Path) -> str:
        if path not in read:
            records = read_records(path)
            read[path] = records.source
            inputs.metas[records.source] = records.meta
            inputs.scored += [(run, records) for run in score_records(records, names, seed=seed,
                                                                      resamples=resamples)]
        return read[path]

    for path in map(Path, paths):
        if not _paired(path):  # a paired folder stopped before its compare.json: its runs, no ΔF1
            for run in expand_runs([path]):
                add(Path(run))
            continue
        result, located = _compared(path)
        inputs.comparisons.append((path / COMPARE_FILE, result,
                                   {n: add(p) for n, p in located.items()}))
    return inputs


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


class Page:
    """The figures written so far and the HTML around them, numbered in the order they appear."""

    def __init__(self, out: Path, formats: tuple[str, ...] = figures.FIGURE_FORMATS):
        self.out, self.body, self.count, self.formats = out, [], 0, formats

    def add(self, fig, data: dict, path: Path, caption: str, column=None) -> None:
        """The figure (its PNG, the vector formats of self.formats and its numbers)
        and, where given and "column" is one of them, its one-column layout (`column`
        draws it; column.save), drawn only then."""
        png = figures.save(fig, data, path,
                           tuple(f for f in figures.VECTOR_FORMATS if f in self.formats))
        self.count += 1
        encoded = base64.b64encode(png.read_bytes()).decode("ascii")
        numbers = png.with_suffix(".json").relative_to(self.out).as_posix()
        if column is not None and "column" in self.formats:
            narrow = column_layout.save(column(), path).relative_to(self.out).as_posix()
            caption += f" One column wide (3.3 in, 8 pt): {narrow}."
        # the caption wraps at the figure's width, or a readable one
        width = max(480, round(fig.bbox.width))
        self.body.append(f'<figure id="figure-{self.count}" style="width:{width}px">'
                         f'<img alt="Figure {self.count}" src="data:image/png;base64,{encoded}">'
                         f"<figcaption><b>Figure {self.count}.</b> {html.escape(caption)} "
                         f"Numbers: <code>{html.escape(numbers)}</code>.</figcaption></figure>")

    def html(self, text: str) -> None:
        self.body.append(text)


def _header(inputs: Inputs, labels: dict[str, str], seed: int, resamples: int, out: Path) -> str:
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>"
                                    for c in header_row(labels[s], meta)) + "</tr>"
                   for s, meta in inputs.metas.items())
    head = "".join(f"<th>{h}</th>" for h in HEADER)
    prompts = dict.fromkeys((m["template"], m["prompt_example"]) for m in inputs.metas.values()
                            if m.get("template") and m.get("prompt_example"))
    lines = [f"<table class=\"runs\"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"]
    lines += [f"<p>Template {html.escape(t)}: "
              f"<code>{html.escape(p).replace(chr(10), '&#92;n')}</code></p>"
              for t, p in prompts]
    commands = [(labels[s], m["command"]) for s, m in inputs.metas.items() if m.get("command")]
    if commands:  # how to make each run again, as it was typed
        lines.append("<p>Commands: " + "; ".join(
            f"{html.escape(label)}: <code>{html.escape(shown_command(command, out))}</code>"
            for label, command in commands)
            + " (absolute paths as this page's folder reaches them).</p>")
    lines.append("<p>Sources (from this page's folder): " + ", ".join(
        f"{html.escape(labels[s])} (<code>{html.escape(shown_path(s, out))}</code>)"
        for s in inputs.metas) + ". "
        f"Scored under every readout the records supply, bootstrap seed {seed}, {resamples} "
        "resamples; each figure's numbers lie beside its PNG as JSON, every score in scores.json "
        "(<code>pope-fast score --format json</code>).</p>")
    return "\n".join(lines)


def _html_table(table: dict) -> str:
    # readout names break after their underscores, so that eleven of them fit the page's width
    head = "".join(f"<th>{html.escape(h).replace('_', '_<wbr>')}</th>"
                   for h in ["model", "n"] + table["readouts"])
    rows = "".join("<tr><td>" + html.escape(r["model"]) + f"</td><td>{r['n']}</td>" + "".join(
        f"<td><b>{c}</b></td>" if best else f"<td>{c}</td>"
        for c, best in zip(r["cells"], r["best"])) + "</tr>"
        for r in table["rows"])
    notes = "".join(f"<p>{html.escape(note)}</p>" for note in table["notes"])
    return (f"<h3>F1 by readout, {html.escape(table['group'])}</h3>"
            f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
            f"</div>{notes}")


def _across(page: Page, inputs: Inputs, labels: dict[str, str]) -> None:
    runs = [run for run, _ in inputs.scored]
    page.html("<h2>F1, models × readouts × splits</h2>")
    page.body += map(_html_table, f1_tables(runs))
    data, caption = figure_data.f1_grid(runs)
    page.add(grid_figure.f1_grid(data), data, page.out / "f1_models_readouts_splits", caption,
             partial(column_layout.f1_grid, data))
    pairs = figure_data.paper_pairs(inputs.scored)
    if pairs:
        page.html('<h2>Two readouts of one answer position</h2>\n<div class="side">')
    for run, _, data, caption in pairs:
        model = labels[run["source"]]
        page.add(figures.confusion_pair(titled(model, group_name(run)), data), data,
                 page.out / _slug(model) / f"two_readouts_{_slug(group_name(run))}",
                 f"{model}: {caption}",
                 partial(column_layout.confusion, titled(model, group_name(run)), data, per_row=2))
    if pairs:
        page.html("</div>")
    if inputs.comparisons:
        page.html('<h2>Methods compared: ΔF1 under each readout</h2>\n<div class="side">')
    drawn = []
    for where, result, sources in inputs.comparisons:
        for pair in result["pairs"]:
            names = (labels[sources[pair["a"]]], labels[sources[pair["b"]]])
            drawn.append((where, pair, names,
                          *figure_data.delta_f1(pair, result, names, shown_path(where, page.out))))
    # one ΔF1 scale for all
    reach = figures.delta_reach([data for *_, data, _ in drawn]) if drawn else None
    for where, pair, names, data, caption in drawn:
        data["axis_half_width"] = reach
        title = (f"ΔF1 of {names[1]} against {names[0]}"
                 + (" (MISMATCHED RUNS)" if pair["mismatches"] else ""))
        path = (page.out / f"compare-{_slug(where.parent.name)}"
                / f"delta_f1_{_slug(names[1])}_vs_{_slug(names[0])}")
        page.add(figures.delta_f1(title, data), data, path,
                 caption + " Every ΔF1 panel of this page shares one scale.",
                 partial(column_layout.delta_f1, title, data))
    if len(drawn) > 1:  # then one readout at a time, every pair in one figure
        page.html('</div>\n<h2>Every pair compared, one readout at a time</h2>\n<div class="side">')
        combined = [(f"{names[1]} vs {names[0]}", data) for _, _, names, data, _ in drawn]
        for readout, data, caption in figure_data.delta_by_readout(combined):
            data["axis_half_width"] = reach
            page.add(figures.delta_f1(f"ΔF1 under {readout}", data), data,
                     page.out / "compare-all" / f"delta_f1_{_slug(readout)}", caption,
                     partial(column_layout.delta_f1, f"ΔF1 under {readout}", data))
    if inputs.comparisons:
        page.html("</div>")
    for where, result, sources in inputs.comparisons:
        section = format_bias(result, lambda pair: f"B {labels[sources[pair['b']]]} against A "
                                                   f"{labels[sources[pair['a']]]}")
        if section:
            page.html(f"{markdown_html(section)}<p>From "
                      f"<code>{html.escape(str(where))}</code>.</p>")


def titled(model: str, group: str) -> str:
    """A run's name and its split, once where they are the same word (the demo's
    "demo" split of run "demo")."""
    return model if model == group else f"{model}, {group}"


def _run_section(page: Page, run: dict, records: RecordSet, model: str, seed: int,
                 resamples: int) -> None:
    title = (f"{titled(model, group_name(run))} "
             f"(n={run['n']}{asked_note(run)}{', incomplete' * bool(run.get('asked'))})")
    page.html(f"<h2>{html.escape(title)}</h2>")
    if run.get("asked"):
        page.html(f"<p><b>Incomplete</b>: {run['n']}{asked_note(run)} ({INCOMPLETE}); every number "
                  "of this split is partial.</p>")
    if run.get("unavailable"):
        page.html("<p>Unavailable: " + html.escape("; ".join(
            f"{n} ({why})" for n, why in run["unavailable"].items())) + "</p>")
    page.body += [f"<p>{html.escape(line)}.</p>" for line in reason_lines(
        reasons_of(run["readouts"]), run["n"] - run.get("errors", 0))]
    if not run["readouts"]:
        return
    # one folder per run, its figures named by the split: a run's folder is the only
    # one below the report's
    prefix = page.out / _slug(model) / _slug(group_name(run))
    drawn = [(figures.confusion_grid, figure_data.confusion(run), "confusion"),
             (figures.f1_intervals, figure_data.f1(run, seed, resamples), "f1"),
             (figures.yes_rates, figure_data.yes_rate(run, records), "yes_rate")]
    tokens = figure_data.first_tokens(run, records)
    if tokens[0]["tokens"]:
        drawn.append((figures.first_tokens, tokens, "first_tokens"))
    if "image_attention" in run:
        drawn.append((figures.attention_plot, figure_data.attention(run, records),
                      "image_attention"))
    narrow = {"f1": column_layout.f1_intervals, "yes_rate": column_layout.yes_rates,
              "confusion": column_layout.confusion, "image_attention": column_layout.attention,
              "first_tokens": column_layout.first_tokens}
    for draw, (data, caption), name in drawn:
        page.add(draw(title, data), data, prefix.with_name(f"{prefix.name}_{name}"),
                 f"{title}: {caption}",
                 partial(narrow[name], title, data) if name in narrow else None)


def _benchmark_sections(page: "Page", inputs: Inputs, labels: dict[str, str],
                        protocol: str | None) -> list[dict]:
    """Per benchmark run (other than POPE): each rule's and readout's numbers as score prints them
    (under `protocol`, that tool's rule alone, as `score --protocol` gives it), and the official
    headline across readouts and rules as a figure. Returns the results, for benchmarks.json."""
    results = []
    for source, records in _record_sets(inputs).items():
        benchmark = run_benchmark(records)
        if benchmark is None:
            continue
        result = score_run(records, benchmark)
        if protocol is not None:
            result = only_rule(result, rule_of(benchmark, protocol))
        results.append(result)
        model = labels[source]
        page.html(f"<h2>{html.escape(model)}: {html.escape(benchmark.title)}</h2>\n"
                  + markdown_html(format_benchmark(result).split("\n\n", 1)[-1]))
        data, caption = figure_data.benchmark_bars(result, benchmark)
        if data["bars"]:
            page.add(figures.benchmark_bars(f"{model}: {data['metric']}", data), data,
                     page.out / _slug(model) / f"{benchmark.name}_headline", f"{model}: {caption}",
                     partial(column_layout.benchmark_bars, f"{model}: {data['metric']}", data))
    return results


def _record_sets(inputs: Inputs) -> dict[str, RecordSet]:
    return {records.source: records for _, records in inputs.scored}  # each run once, in order


def _benchmark_comparisons(page: "Page", inputs: Inputs) -> None:
    """A paired benchmark folder's compare.json (`pope-fast compare` on the
    benchmark's own metrics) as tables."""
    for where, result, _ in inputs.comparisons:
        if "benchmark" in result:
            # the runs as the page's folder reaches them
            shown = {**result, "pairs": [
                {**pair, **{side: shown_path(pair[side], page.out) for side in ("a", "b")}}
                for pair in result["pairs"]]}
            page.html(markdown_html(format_benchmark_compare(shown))
                      + f"<p>From <code>{html.escape(shown_path(where, page.out))}</code>.</p>")


def _title(benchmarks: dict, pope: bool) -> str:
    """The page's name: the benchmark's (or POPE's readout report), every one of them
    when runs of several meet."""
    names = (["POPE"] if pope else []) + [b.title for b in benchmarks.values()]
    return ("POPE readout report" if names == ["POPE"]
            else f"{' and '.join(names)}: pope-fast report")


def _protocol_section(page: "Page", out: Path, inputs: Inputs, protocol) -> None:
    runs = [run for records in _record_sets(inputs).values()
            for run in score_protocol(records, protocol)]
    (out / "protocol.json").write_text(format_protocol_runs(runs, "json") + "\n", encoding="utf-8")
    page.html(f"<h2>Under {html.escape(protocol.name)}: {html.escape(protocol.title)}, "
              f"{html.escape(protocol.version)}</h2>\n<p>{html.escape(protocol.reproduces)}. "
              "Values in protocol.json at full precision.</p>\n"
              f'<div class="wide"><pre>{html.escape(format_protocol_runs(runs, "table"))}'
              "</pre></div>")


def write_report(paths: list[str | Path], out_dir: str | Path, *, seed: int = 0,
                 resamples: int = 1000, protocol: str | None = None,
                 formats: list[str] | tuple[str, ...] = figures.FIGURE_FORMATS) -> Path:
    """Figures (PNG, each with its numbers as JSON, and the other `formats`:
    figures.FIGURE_FORMATS), tables.md, tables.tex and report.html in out_dir; returns the HTML
    page's path. With a published `protocol`, the page leads with each run's numbers as that tool
    prints them and what keeps them from being its own (also as protocol.json)."""
    if importlib.util.find_spec("matplotlib") is None:  # before any table is written
        raise ValueError(figures.NO_MATPLOTLIB)
    figures.check_formats(formats)
    out = Path(out_dir)
    inputs = read_inputs(paths, seed=seed, resamples=resamples)
    labels = model_labels(list(inputs.metas))
    # None: POPE
    kind = {source: run_benchmark(records) for source, records in _record_sets(inputs).items()}
    benchmarks = {b.name: b for b in kind.values() if b is not None}
    pope = Inputs([(run, records) for run, records in inputs.scored
                   if kind[records.source] is None],
                  inputs.metas, [c for c in inputs.comparisons if "benchmark" not in c[1]])
    if protocol is not None:
        for benchmark in benchmarks.values():
            rule_of(benchmark, protocol)  # refused before anything is written
    out.mkdir(parents=True, exist_ok=True)
    runs = [run for run, _ in pope.scored]
    (out / "scores.json").write_text(strict_json({"runs": runs}, indent=2) + "\n", encoding="utf-8")
    # several datasets: each dataset and split and their average, as papers print POPE
    grids = format_grids(runs)
    (out / "tables.md").write_text(
        "\n\n".join(filter(None, [format_f1_tables(runs, "markdown"), grids])) + "\n",
        encoding="utf-8")
    (out / "tables.tex").write_text(format_f1_tables(runs, "latex") + "\n", encoding="utf-8")
    title = _title(benchmarks, bool(pope.scored))
    page = Page(out, tuple(formats))
    page.html(f"<h1>{html.escape(title)}</h1>")
    page.html(_header(inputs, labels, seed, resamples, out))
    # a benchmark's own numbers lead; POPE's yes-positive F1 is shown for POPE's runs only
    if benchmarks:
        results = _benchmark_sections(page, inputs, labels, protocol)
        (out / "benchmarks.json").write_text(strict_json({"runs": results}, indent=2) + "\n",
                                             encoding="utf-8")
        _benchmark_comparisons(page, inputs)
    if pope.scored and protocol is not None:
        _protocol_section(page, out, pope, get_protocol(protocol))
    if pope.scored:
        _across(page, pope, labels)
    for run, records in pope.scored:
        _run_section(page, run, records, labels[run["source"]], seed, resamples)
    path = out / "report.html"
    path.write_text(f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                    f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
                    + "\n".join(page.body) + "\n</body></html>\n", encoding="utf-8")
    return path
