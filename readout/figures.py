"""`pope-fast report`: figures, the numbers behind each one, the F1 tables and one self-contained HTML page.

Every number comes from `score_records`, called as `pope-fast score` calls it, so a figure's JSON equals
the score output it was drawn from. matplotlib (the `report` extra) is imported only here and only
when a report is made; figures are drawn on Agg canvases directly, never through pyplot's global state.
"""
from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

from .attention import layer_mean
from .protocols import NO, READOUTS, YES
from .records import RecordSet, read_records
from .report import f1_tables, format_f1_tables, group_name, model_labels
from .score import predictions, question_order, score_records

DPI = 100
TOP_TOKENS = 20  # most frequent first tokens drawn; each readout's own ids are drawn as well


def _figure(width_px: int, height_px: int):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError('pope-fast report draws with matplotlib: pip install "pope-fast[report]"') from None
    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _confusion_grid(title: str, data: dict):
    names = list(data["readouts"])
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    fig = _figure(250 * cols, 230 * rows + 60)
    fig.suptitle(title, fontsize=10)
    for k, name in enumerate(names):
        m = data["readouts"][name]
        ax = fig.add_subplot(rows, cols, k + 1)
        cells = [[m["tp"], m["fn"]], [m["fp"], m["tn"]]]
        ax.imshow(cells, cmap="Blues", vmin=0, vmax=max(1, data["n"] // 2))
        for i in range(2):
            for j in range(2):
                ax.text(j, i, str(cells[i][j]), ha="center", va="center", fontsize=9,
                        color="white" if cells[i][j] > data["n"] // 4 else "black")
        ax.set_xticks([0, 1], ["yes", "no"], fontsize=7)
        ax.set_yticks([0, 1], ["yes", "no"], fontsize=7)
        ax.set_xlabel("prediction", fontsize=7)
        ax.set_ylabel("label", fontsize=7)
        ax.set_title(name + (f" (unknown {m['unknown']})" if m["unknown"] else ""), fontsize=8)
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.08, top=1 - 60 / fig.bbox.height, hspace=0.5, wspace=0.4)
    return fig


def _bars_size(n: int) -> tuple[int, int]:
    return 800, 90 + 32 * n


def _f1_intervals(title: str, data: dict):
    names = list(data["readouts"])
    fig = _figure(*_bars_size(len(names)))
    ax = fig.add_axes((0.2, 50 / fig.bbox.height, 0.75, 1 - 85 / fig.bbox.height))
    for y, name in enumerate(names):
        m = data["readouts"][name]
        low, high = m["f1_ci95"]
        ax.errorbar(m["f1"], y, xerr=[[m["f1"] - low], [high - m["f1"]]], fmt="o", color="C0", capsize=3)
        ax.text(high + 0.01, y, f"{m['f1']:.4f}", va="center", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first readout on top, half a row of margin
    ax.set_xlim(0, 1.08)
    ax.set_xlabel("F1 (95% bootstrap interval)", fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def _yes_rates(title: str, data: dict):
    names = list(data["readouts"])
    fig = _figure(*_bars_size(len(names)))
    ax = fig.add_axes((0.2, 50 / fig.bbox.height, 0.75, 1 - 85 / fig.bbox.height))
    rates = [data["readouts"][n]["yes_rate"] for n in names]
    ax.barh(range(len(names)), rates, color="C1")
    ax.axvline(data["label_yes_rate"], color="black", linestyle="--", label=f"labels: {data['label_yes_rate']:.4f}")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first readout on top, half a row of margin
    ax.set_xlim(0, 1)
    ax.set_xlabel("yes-rate of the answered predictions", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=10)
    return fig


def _first_tokens(title: str, data: dict):
    tokens, marked = data["tokens"], data["marked_readouts"]
    fig = _figure(200 + 40 * max(1, len(tokens)), 360 + 22 * len(marked))
    height, marks = fig.bbox.height, 22 * len(marked)  # the marks sit below the rotated token ids
    bars = fig.add_axes((160 / fig.bbox.width, (80 + marks) / height, 1 - 190 / fig.bbox.width,
                         1 - (120 + marks) / height))
    bars.bar(range(len(tokens)), [t["count"] for t in tokens], color="C2")
    bars.set_xticks(range(len(tokens)), [str(t["id"]) for t in tokens], rotation=90, fontsize=7)
    bars.set_xlim(-0.5, len(tokens) - 0.5)
    bars.set_ylabel("questions (first token)", fontsize=8)
    bars.set_title(title, fontsize=10)
    for row, name in enumerate(marked):  # one line of marks per readout under the token ids
        y = (20 + 22 * (len(marked) - 1 - row)) / height
        fig.text(150 / fig.bbox.width, y, name, ha="right", va="center", fontsize=7)
        for col, token in enumerate(tokens):
            mark = token["readouts"].get(name)
            if mark:
                x = bars.transData.transform((col, 0))[0] / fig.bbox.width
                fig.text(x, y, "Y" if mark == "yes" else "N", ha="center", va="center", fontsize=7,
                         color="green" if mark == "yes" else "red")
    return fig


def _f1_heatmap(table: dict, f1: list[list[float | None]]):
    readouts, models = table["readouts"], [r["model"] for r in table["rows"]]
    fig = _figure(220 + 90 * len(readouts), 150 + 40 * len(models))
    ax = fig.add_axes((200 / fig.bbox.width, 100 / fig.bbox.height, 1 - 210 / fig.bbox.width,
                       1 - 140 / fig.bbox.height))
    ax.imshow([[math.nan if v is None else v for v in row] for row in f1], cmap="viridis", vmin=0, vmax=1,
              aspect="auto")
    for i, row in enumerate(f1):
        for j, v in enumerate(row):
            ax.text(j, i, "-" if v is None else f"{v:.4f}", ha="center", va="center", fontsize=7,
                    color="black" if v is not None and v > 0.6 else "white",
                    fontweight="bold" if table["rows"][i]["best"][j] else "normal")
    ax.set_xticks(range(len(readouts)), readouts, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(models)), models, fontsize=8)
    ax.set_title(f"F1 by model and readout, {table['group']}", fontsize=10)
    return fig


def _attention_plot(title: str, data: dict):
    """Per readout, the image attention of right and wrong answers (box plots, side by side)."""
    names = list(data["readouts"])
    fig = _figure(800, 110 + 56 * len(names))
    ax = fig.add_axes((0.2, 60 / fig.bbox.height, 0.62, 1 - 100 / fig.bbox.height))
    for y, name in enumerate(names):
        groups = data["readouts"][name]
        for offset, (group, color) in enumerate((("correct", "C0"), ("wrong", "C3"))):
            if groups[group]:
                ax.boxplot(groups[group], positions=[y + (offset - 0.5) * 0.36], widths=0.3, vert=False,
                           patch_artist=True, boxprops={"facecolor": color, "alpha": 0.6}, showfliers=False)
        d, p = groups["cohens_d"], groups["mann_whitney_p"]
        fig.text(0.84, ax.transData.transform((0, y))[1] / fig.bbox.height,
                 f"d {'-' if d is None else f'{d:.2f}'}, p {'-' if p is None else f'{p:.2g}'}", fontsize=7,
                 va="center")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)
    first, last = data["layers"]
    ax.set_xlabel(f"image attention at the answer position, layers {first}-{last} (blue: right, red: wrong)",
                  fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def _attention_data(run: dict, records: RecordSet) -> dict:
    """Each readout's right and wrong answers' image attention (the run's layer mean per question),
    with the d and p that score reports."""
    table = run["image_attention"]
    layers = tuple(table["layers"])
    group = (run.get("dataset", ""), run["split"])
    entries = sorted((e for e in records.entries if (e.dataset, e.split) == group and e.error is None),
                     key=question_order)
    values = [layer_mean(e.image_attention, layers) for e in entries]
    readouts = {}
    for name, stats in table["readouts"].items():
        decided = predictions(records, name, entries)
        answered = [(v, p == e.label) for v, p, e in zip(values, decided, entries) if p in (YES, NO)]
        readouts[name] = {"correct": [v for v, right in answered if right],
                          "wrong": [v for v, right in answered if not right],
                          **{k: stats["correct_vs_wrong"][k] for k in ("mean_difference", "cohens_d",
                                                                        "mann_whitney_p")}}
    return {"layers": list(layers), "num_layers": table["num_layers"], "readouts": readouts}


def _token_data(run: dict, records: RecordSet) -> dict:
    """The most frequent first tokens and every readout's ids, each with the readouts that count it."""
    counts = {int(i): c for i, c in run["first_token_counts"].items()}
    marked = [n for n in run["readouts"] if n in records.token_sets]
    ids = list(counts)[:TOP_TOKENS]
    ids += sorted({i for n in marked for i in records.token_sets[n].ids} - set(ids))
    tokens = []
    for i in ids:
        marks = {n: ("yes" if i in records.token_sets[n].yes_ids else "no") for n in marked
                 if i in records.token_sets[n].ids}
        tokens.append({"id": i, "count": counts.get(i, 0), "readouts": marks})
    return {"first_token_counts": run["first_token_counts"], "marked_readouts": marked, "tokens": tokens}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def _write(fig, data: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path.with_suffix(".png"), dpi=DPI)
    path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path.with_suffix(".png")


def _run_figures(run: dict, records: RecordSet, model: str, out: Path) -> list[tuple[str, Path]]:
    if not run["readouts"]:
        return []
    labels = [e.label for e in records.entries if (e.dataset, e.split) == (run.get("dataset", ""), run["split"])]
    title = f"{model}, {group_name(run)} (n={run['n']})"
    base = {k: run[k] for k in ("source", "dataset", "split", "n", "errors") if k in run}
    readouts = run["readouts"]
    confusion = {**base, "readouts": {n: {k: m[k] for k in ("tp", "tn", "fp", "fn", "unknown")}
                                      for n, m in readouts.items()}}
    f1 = {**base, "readouts": {n: {k: m[k] for k in ("f1", "f1_ci95")} for n, m in readouts.items()}}
    yes = {**base, "label_yes_rate": round(labels.count("yes") / len(labels), 4),
           "readouts": {n: {"yes_rate": m["yes_rate"]} for n, m in readouts.items()}}
    tokens = {**base, **_token_data(run, records)}
    folder = out / _slug(model) / _slug(group_name(run))
    figures = [("confusion matrices", _write(_confusion_grid(title, confusion), confusion, folder / "confusion")),
               ("F1 with 95% intervals", _write(_f1_intervals(title, f1), f1, folder / "f1")),
               ("yes-rate against the labels", _write(_yes_rates(title, yes), yes, folder / "yes_rate"))]
    if tokens["tokens"]:
        figures.append(("first tokens", _write(_first_tokens(title, tokens), tokens, folder / "first_tokens")))
    if "image_attention" in run:
        attention = {**base, **_attention_data(run, records)}
        figures.append(("image attention, right vs wrong answers",
                        _write(_attention_plot(title, attention), attention, folder / "image_attention")))
    return figures


def _heatmaps(runs: list[dict], out: Path) -> list[tuple[str, Path]]:
    labels = model_labels([r["source"] for r in runs])
    figures = []
    for table in f1_tables(runs):
        by_model = {labels[r["source"]]: r for r in runs if group_name(r) == table["group"]}
        f1 = [[by_model[row["model"]]["readouts"].get(n, {}).get("f1") for n in table["readouts"]]
              for row in table["rows"]]
        data = {"group": table["group"], "models": [r["model"] for r in table["rows"]],
                "readouts": table["readouts"], "f1": f1}
        path = _write(_f1_heatmap(table, f1), data, out / f"f1_heatmap_{_slug(table['group'])}")
        figures.append((f"F1, models x readouts: {table['group']}", path))
    return figures


def _img(path: Path, alt: str) -> str:
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}"></figure>'


def _html_table(table: dict) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["model", "n"] + table["readouts"])
    rows = "".join("<tr><td>" + html.escape(r["model"]) + f"</td><td>{r['n']}</td>" + "".join(
        f"<td><b>{c}</b></td>" if best else f"<td>{c}</td>" for c, best in zip(r["cells"], r["best"])) + "</tr>"
        for r in table["rows"])
    return (f"<h3>F1 by readout, {html.escape(table['group'])}</h3>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border-bottom:1px solid #ccc;padding:2px 8px;"
         "text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}")


def write_report(paths: list[str | Path], out_dir: str | Path, *, seed: int = 0, resamples: int = 1000) -> Path:
    """Figures (PNG, each with its numbers as JSON), tables.md, tables.tex and report.html in out_dir;
    returns the HTML page's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = list(READOUTS)  # as `pope-fast score` does with its default --readouts all
    scored = []
    for path in paths:
        records = read_records(path)
        scored += [(run, records) for run in score_records(records, names, seed=seed, resamples=resamples)]
    runs = [run for run, _ in scored]
    labels = model_labels([r["source"] for r in runs])
    (out / "scores.json").write_text(json.dumps({"runs": runs}, indent=2) + "\n", encoding="utf-8")
    (out / "tables.md").write_text(format_f1_tables(runs, "markdown") + "\n", encoding="utf-8")
    (out / "tables.tex").write_text(format_f1_tables(runs, "latex") + "\n", encoding="utf-8")
    body = ["<h1>POPE readout report</h1>",
            "<p>Sources: " + ", ".join(f"{html.escape(labels[s])} (<code>{html.escape(s)}</code>)"
                                       for s in labels) + "</p>",
            "<h2>F1, models x readouts</h2>", *map(_html_table, f1_tables(runs))]
    body += [_img(path, title) for title, path in _heatmaps(runs, out)]
    for run, records in scored:
        model = labels[run["source"]]
        body.append(f"<h2>{html.escape(model)}: {html.escape(group_name(run))} (n={run['n']})</h2>")
        if run.get("unavailable"):
            body.append("<p>Unavailable: " + html.escape("; ".join(f"{n} ({why})" for n, why in
                                                                  run["unavailable"].items())) + "</p>")
        body += [_img(path, title) for title, path in _run_figures(run, records, model, out)]
    page = out / "report.html"
    page.write_text("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>POPE readout report</title>"
                    f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n",
                    encoding="utf-8")
    return page
