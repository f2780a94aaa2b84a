"""Text renderings of scores and token audits (the CLI prints what these return)."""
from __future__ import annotations

import json
from pathlib import Path

from ..metrics import answered
from ..records import RECORDS_FILE, strict_json
from ..grid import AVERAGE, score_grids
from ..score import POOLED, reason_lines
from ..cells import csv_text, markdown_table

COLUMNS = ("readout", "TP", "TN", "FP", "FN", "unk", "acc", "prec", "rec", "F1", "F1 95% CI",
           "yes-rate", "yes/all")
# VLMEvalKit's POPE score file (vlmeval/dataset/utils/yorn.py l.162: split, Overall =
# F1, acc, precision, recall), with the columns that say which run and readout a row
# is, and F1 under its own name
CSV_COLUMNS = ("source", "dataset", "readout", "split", "n", "unknown", "F1", "acc", "precision",
               "recall", "yes_rate")


# a metric over the answered questions (F1, precision, recall, yes-rate) of a readout
# that answered none
NO_ANSWER = "–"
INCOMPLETE = "incomplete: the run stopped part way"


def asked_note(run: dict) -> str:
    """' of 48 asked' for a scored split of which the run recorded fewer questions
    than its meta.json asked."""
    return f" of {run['asked']} asked" if run.get("asked") else ""


def rate(value: float, percent: bool = False) -> str:
    """A fraction as the tables show it: 4 decimals, or in percent 2 (as papers print 85.27)."""
    return f"{value * 100:.2f}" if percent else f"{value:.4f}"


def _rows(run: dict, percent: bool = False) -> list[list[str]]:
    rows = []
    for name, m in run["readouts"].items():
        low, high = m["f1_ci95"]
        some = answered(m) > 0

        def shown(value):
            return rate(value, percent) if some else NO_ANSWER

        rows.append([name, *(str(m[k]) for k in ("tp", "tn", "fp", "fn", "unknown")),
                     rate(m["accuracy"], percent),
                     *(shown(m[k]) for k in ("precision", "recall", "f1")),
                     f"{rate(low, percent)}-{rate(high, percent)}" if some else NO_ANSWER,
                     shown(m["yes_rate"]), rate(m["yes_rate_all"], percent)])
    return rows


def reasons_of(readouts: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Each readout's unknown_reasons from its metrics ({} where they hold none:
    compare.json of an older run)."""
    return {name: m.get("unknown_reasons") or {} for name, m in readouts.items()}


def format_csv(runs: list[dict], percent: bool = False) -> str:
    """One row per run, readout and split (a dataset's pooled `Overall` first, as VLMEvalKit writes
    it), at full precision (x100 with percent)."""
    order = {id(run): (0 if run.get("pooled") else 1) for run in runs}
    rows = [CSV_COLUMNS]
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["source"], run.get("dataset", "")), []).append(run)
    scale = 100 if percent else 1
    for (source, dataset), group in groups.items():
        names = list(dict.fromkeys(n for run in group for n in run["readouts"]))
        # VLMEvalKit writes the Overall row of a single split too (yorn.py l.162),
        # the split's own numbers
        single = len(group) == 1 and not group[0].get("pooled") and group[0]["split"] != POOLED
        for name in names:
            # stable: the splits keep their order
            for run in sorted(group, key=lambda r: order[id(r)]):
                if name not in run["readouts"]:
                    continue
                m = run["readouts"][name]
                values = [run["n"] - run.get("errors", 0), m["unknown"],
                          *(repr(m[k] * scale)
                            for k in ("f1", "accuracy", "precision", "recall", "yes_rate"))]
                rows += ([[source, dataset, name, POOLED, *values]] * single
                         + [[source, dataset, name, run["split"], *values]])
    return csv_text(rows)


def _aligned(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def _significant_pairs(run: dict, alpha: float = 0.05, shown: int = 4) -> list[str]:
    pairs = sorted(((p, pair) for pair, p in run["mcnemar"].items() if p < alpha))
    listed = [f"{pair}: p={p:.3g}" for p, pair in pairs[:shown]]
    more = [f"{len(pairs) - shown} more pairs (see --format json)"] if len(pairs) > shown else []
    return listed + more


def format_runs(runs: list[dict], fmt: str = "table", percent: bool = False) -> str:
    """`pope-fast score`'s output: json (fractions at full precision), csv, the
    per-run tables (table, markdown) or the models x readouts F1 tables (models,
    latex); percent: rates x100 in all but json."""
    if fmt == "json":
        if percent:
            raise ValueError("JSON holds every value as a fraction at full precision: --percent is "
                             "for the tables")
        # several datasets: their splits as papers print POPE, and the average
        grids = score_grids(runs)
        return strict_json({"runs": runs, **({"by_dataset_and_split": grids} if grids else {})},
                           indent=2)
    if fmt == "csv":
        return format_csv(runs, percent)
    if fmt in ("latex", "models"):
        return format_f1_tables(runs, "latex" if fmt == "latex" else "markdown", percent)
    header = list(COLUMNS)
    render = markdown_table if fmt == "markdown" else _aligned
    blocks = []
    for run in runs:
        dataset = f"{run['dataset']} " if run.get("dataset") else ""
        split = (f"{run['split']} (splits pooled: {', '.join(run['pooled'])})" if run.get("pooled")
                 else run["split"])
        title = f"{run['source']} — {dataset}split {split}, n={run['n']}"
        if run.get("asked"):
            title += f"{asked_note(run)} ({INCOMPLETE})"
        if run.get("relabelled"):
            title += ", " + relabel_note(run["relabelled"])
        if run.get("errors"):
            title += f", {run['errors']} error records (left out of every metric)"
        parts = [f"### {title}" if fmt == "markdown" else title,
                 render(header, _rows(run, percent))]
        if run["first_token_counts"]:
            top = ", ".join(f"{i}: {c}" for i, c in list(run["first_token_counts"].items())[:8])
            parts.append(f"first tokens: {top}")
        significant = _significant_pairs(run)
        if significant:
            parts.append("McNemar p < 0.05: " + "; ".join(significant))
        by_reason: dict[str, list[str]] = {}
        for name, why in run.get("unavailable", {}).items():
            by_reason.setdefault(why, []).append(name)
        parts += [f"unavailable: {', '.join(names)} ({why})" for why, names in by_reason.items()]
        parts += reason_lines(reasons_of(run["readouts"]), run["n"] - run.get("errors", 0))
        if run.get("capped"):
            parts.append("text cut at max_new_tokens: "
                         + ", ".join(f"{n} {c} of {run['n'] - run.get('errors', 0)}"
                                     for n, c in run["capped"].items()))
        if run.get("non_finite"):
            names = ", ".join(run["non_finite"])
            parts.append(f"non-finite values (NaN or inf, null in the records): questions {names}")
        if "image_attention" in run:
            parts.append(_attention_block(run["image_attention"], render))
        blocks.append("\n".join(parts))
    return "\n\n".join(blocks + [_grid_block(grid, fmt, percent) for grid in score_grids(runs)])


def format_grids(runs: list[dict], fmt: str = "markdown", percent: bool = False) -> str:
    """The by-dataset-and-split table of each source of several datasets ("" where
    none has several)."""
    return "\n\n".join(_grid_block(grid, fmt, percent) for grid in score_grids(runs))


def _grid_block(grid: dict, fmt: str, percent: bool) -> str:
    """A record set of several datasets as papers print POPE (readout/grid.py): a row per dataset
    and split, then their average; each readout's accuracy / F1 ("–" for an F1 of a readout that
    answered nothing there)."""
    names = list(grid[AVERAGE])

    def cell(m: dict) -> str:
        return " / ".join(NO_ANSWER if m[k] is None else rate(m[k], percent)
                          for k in ("accuracy", "f1"))

    rows = [[r["dataset"], r["split"], str(r["n"]), *(cell(r["readouts"][n]) for n in names)]
            for r in grid["rows"]]
    rows.append([AVERAGE, f"{len(rows)} rows", str(sum(r["n"] for r in grid["rows"])),
                 *(cell(grid[AVERAGE][n]) for n in names)])
    title = (f"{grid['source']} — by dataset and split, as papers print POPE: accuracy / F1, and "
             "their average (the mean of the rows)")
    render = markdown_table if fmt == "markdown" else _aligned
    return (("### " if fmt == "markdown" else "") + title + "\n"
            + render(["dataset", "split", "n", *names], rows))


def relabel_note(change: dict) -> str:
    return (f"labels of {', '.join(change['labels'])}: {change['kept']} of {change['questions']} "
            f"questions kept ({change['removed']} removed), {change['yes_to_no']} yes→no, "
            f"{change['no_to_yes']} no→yes"
            + (f"; {change['labels_not_in_run']} labelled questions not in the run"
               if change["labels_not_in_run"] else ""))


def format_relabelled(runs: list[dict], percent: bool = False) -> str:
    """Per run and split, every readout's F1 under the run's labels and under the corrected ones,
    side by side, with the change and each readout's rank (1: the best F1) under both."""
    originals = {(r["source"], r.get("dataset", ""), r["split"]): r
                 for r in runs if not r.get("relabelled")}
    blocks = []
    for run in runs:
        change = run.get("relabelled")
        before = change and originals.get((run["source"], change["from"], run["split"]))
        if before is None:
            continue
        names = [n for n in run["readouts"] if n in before["readouts"]]
        f1 = {n: (before["readouts"][n]["f1"], run["readouts"][n]["f1"]) for n in names}
        ranks = [{n: 1 + sum(f[i] > f1[n][i] for f in f1.values()) for n in names} for i in (0, 1)]
        rows = [[n, rate(a, percent), rate(b, percent), "+" * (b >= a) + rate(b - a, percent),
                 str(ranks[0][n]), str(ranks[1][n])] for n, (a, b) in f1.items()]
        group = group_name(before)
        title = (f"### {run['source']} — {group}: F1 under its labels and "
                 f"{relabel_note(run['relabelled'])}")
        header = ["readout", f"F1 {group}", f"F1 {group_name(run)}", "ΔF1", "rank before",
                  "rank after"]
        blocks.append(title + "\n" + markdown_table(header, rows))
    return "\n\n".join(blocks)


def _attention_block(table: dict, render) -> str:
    """Image attention at the answer position, correct vs wrong answers, one row per readout."""
    first, last = table["layers"]
    header = ["readout", "n right / wrong", "mean right", "mean wrong", "difference [95% CI]",
              "Cohen's d", "Mann-Whitney p"]
    rows = []
    for name, groups in table["readouts"].items():
        g = groups["correct_vs_wrong"]
        ci = g["mean_difference_ci95"]
        rows.append([name, f"{g['a']['n']} / {g['b']['n']}", _num(g["a"]["mean"]),
                     _num(g["b"]["mean"]),
                     f"{_num(g['mean_difference'])} [{_num(ci[0]) if ci else '-'}, "
                     f"{_num(ci[1]) if ci else '-'}]",
                     _num(g["cohens_d"]), _num(g["mann_whitney_p"])])
    return (f"image attention, layers {first}-{last} of {table['num_layers']} (right - wrong; p: "
            "normal approximation, tie-corrected):\n" + render(header, rows))


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def group_name(run: dict) -> str:
    """`coco adversarial`; records without a dataset: the split alone."""
    return f"{run['dataset']} {run['split']}" if run.get("dataset") else run["split"]


def model_labels(sources: list[str]) -> dict[str, str]:
    """A short row name per record source: the run folder's name (or a published file's stem), made
    unique with a counter where two sources share one."""
    labels: dict[str, str] = {}
    for source in dict.fromkeys(sources):
        path = Path(source)
        base = path.parent.name if path.name == RECORDS_FILE else path.stem
        label, k = base, 2
        while label in labels.values():
            label, k = f"{base} ({k})", k + 1
        labels[source] = label
    return labels


def row_labels(runs: list[dict]) -> dict[str, str]:
    """A row name per record source: the model its meta.json names, with the run's folder name
    beside it where two runs share that model (a method's runs) or the folder says more; the
    folder's name when no model is named."""
    folders = model_labels([r["source"] for r in runs])
    names = {r["source"]: r.get("model") or folders[r["source"]] for r in runs}
    shared = {n for n in names.values() if list(names.values()).count(n) > 1}
    return {s: n if n == folders[s] or n not in shared else f"{n} ({folders[s]})"
            for s, n in names.items()}


def f1_tables(runs: list[dict], percent: bool = False) -> list[dict]:
    """The models x readouts F1 table of each dataset and split (the paper's multi-model table):
    {"group", "readouts", "rows": [{"model", "n", "cells", "best"}], "notes"}; a cell is F1 to 4
    places, "-" where that model's records cannot supply the readout (or hold no answer at all), "–"
    where the readout answered no question (every answer unknown: it has no F1); best marks each
    row's highest F1 among the readouts that answered; n names the error records among the
    questions; notes, one per model and reason, say which cells hold answers a readout could not
    decide and why (every candidate cut by a method), so that no table is silently made of them; n
    also says how many a run that stopped part way asked."""
    labels = row_labels(runs)
    tables: dict[str, dict] = {}
    for run in runs:
        table = tables.setdefault(group_name(run), {"group": group_name(run), "readouts": [],
                                                    "rows": [], "notes": []})
        table["readouts"] += [n for n in run["readouts"] if n not in table["readouts"]]
    for run in runs:
        table = tables[group_name(run)]
        # a run with no answered question (every record an error)
        scored = run["n"] > run.get("errors", 0)
        f1 = {n: m["f1"] for n, m in run["readouts"].items() if answered(m)} if scored else {}
        top = max(f1.values(), default=None)
        errors = run.get("errors", 0)
        n = (f"{run['n']}{asked_note(run)}" + " (incomplete)" * bool(run.get("asked"))
             + f" ({errors} errors)" * bool(errors))
        model = labels[run["source"]]

        def cell(name):
            if name in f1:
                return rate(f1[name], percent)
            return NO_ANSWER if scored and name in run["readouts"] else "-"

        table["rows"].append({"model": model, "n": n, "cells": [cell(n) for n in table["readouts"]],
                              "values": [f1.get(n) for n in table["readouts"]],  # full precision
                              # bold what reads as the best: readouts tied at the
                              # shown decimals all are
                              "best": [n in f1 and rate(f1[n], percent) == rate(top, percent)
                                       for n in table["readouts"]]})
        table["notes"] += reason_lines(reasons_of(run["readouts"]), run["n"] - errors, f"{model}: ")
    return list(tables.values())


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                 "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                 "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(c, c) for c in text)


def _unit(percent: bool) -> str:
    return "F1 (%)" if percent else "F1"


def _latex_table(table: dict, percent: bool = False) -> str:
    header = ["Model", "$n$"] + [latex_escape(n) for n in table["readouts"]]
    lines = [r"\begin{table}[ht]", r"\centering",
             rf"\caption{{{latex_escape(_unit(percent))} by readout, "
             rf"{latex_escape(table['group'])} (best per model in bold)}}",
             rf"\begin{{tabular}}{{lr{'r' * len(table['readouts'])}}}", r"\toprule",
             " & ".join(header) + r" \\",
             r"\midrule"]
    for row in table["rows"]:
        cells = [rf"\textbf{{{c}}}" if best else "--" if c == NO_ANSWER else c  # LaTeX's en dash
                 for c, best in zip(row["cells"], row["best"])]
        lines.append(" & ".join([latex_escape(row["model"]), str(row["n"])] + cells) + r" \\")
    notes = [rf"\par\smallskip{{\footnotesize {latex_escape(note)}}}" for note in table["notes"]]
    return "\n".join(lines + [r"\bottomrule", r"\end{tabular}", *notes, r"\end{table}"])


def _markdown_f1_table(table: dict, percent: bool = False) -> str:
    rows = [[row["model"], str(row["n"])]
            + [f"**{c}**" if best else c for c, best in zip(row["cells"], row["best"])]
            for row in table["rows"]]
    notes = "".join(f"\n\n{note}" for note in table["notes"])
    return f"### {_unit(percent)} by readout, {table['group']} (best per model in bold)\n\n" + \
        markdown_table(["model", "n"] + table["readouts"], rows) + notes


def format_f1_tables(runs: list[dict], fmt: str = "markdown", percent: bool = False) -> str:
    """One models x readouts F1 table per dataset and split, in markdown or LaTeX (booktabs)."""
    render = _latex_table if fmt == "latex" else _markdown_f1_table
    return "\n\n".join(render(t, percent) for t in f1_tables(runs, percent))


def format_audit(audit: dict, fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps(audit, indent=2, ensure_ascii=False)
    tok = audit["tokenizer"]
    lines = [f"tokenizer {tok['name_or_path']} ({tok['class']}, {tok['vocab_size']} tokens; "
             + ", ".join(f"{k} {v}" for k, v in tok["library_versions"].items()) + ")",
             f"template {audit['template']}: {audit['prompt']!r}", ""]
    rows = [[repr(form), " ".join(map(str, f["ids"])), "yes" if f["single_token"] else "no",
             str(f["first_after_prompt"])] for form, f in audit["forms"].items()]
    lines += [_aligned(["form", "ids", "one token", "first id after prompt"], rows), ""]
    def shown(tokens):
        return ", ".join(f"{t['id']} {t['token']!r}" if t["token"] is not None
                         else f"{t['id']} (not in vocabulary)" for t in tokens) or "-"

    rows = [[name, shown(r["yes_tokens"]), shown(r["no_tokens"])]
            for name, r in audit["readouts"].items()]
    lines += [_aligned(["readout", "yes ids", "no ids"], rows)]
    if audit["warnings"]:
        lines += ["", "warnings:"] + [f"  - {w}" for w in audit["warnings"]]
    return "\n".join(lines)
