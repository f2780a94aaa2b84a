"""The report's figures, drawn from the numbers `figure_data` gathers (each figure's JSON).

matplotlib (the `report` extra) is imported only here and only when a figure is drawn; figures are
drawn on Agg canvases directly, never through pyplot's global state. Sizes are in pixels at DPI;
each figure is saved as a PNG at SAVE_DPI and, as `report --formats` asks (both by default), as PDF
and SVG (vector, for a paper) beside it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

DPI = 100
SAVE_DPI = 200  # PNGs at twice the layout's pixels: sharp in print and on high-density screens
VECTOR_FORMATS = ("pdf", "svg")
# what `report --formats` may name: the PNG the page embeds, the vector formats, the
# one-column PDF (column.save)
FIGURE_FORMATS = ("png", *VECTOR_FORMATS, "column")
# cells and bars with nothing to show: no answered question, a readout not supplied
MISSING = "#d9d9d9"
NO_MATPLOTLIB = ("pope-fast report draws with matplotlib, which is not installed: "
                 'pip install -e ".[report]"')


def check_formats(formats: list[str] | tuple[str, ...]) -> None:
    """ValueError naming --formats' first format that is not a figure format, or its missing png."""
    for fmt in formats:
        if fmt not in FIGURE_FORMATS:
            raise ValueError(f"--formats: {fmt!r} is not a figure format (any of "
                             f"{', '.join(FIGURE_FORMATS)}, comma-separated)")
    if "png" not in formats:
        raise ValueError("--formats must name png: the report's page embeds each figure's PNG")


def new_figure(width_px: int, height_px: int):
    """A figure of these pixels at DPI on its own Agg canvas (never pyplot's global state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError(NO_MATPLOTLIB) from None
    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _axes(fig, left: float, bottom: float, right: float, top: float):
    """Axes placed by their margins in pixels."""
    w, h = fig.bbox.width, fig.bbox.height
    return fig.add_axes((left / w, bottom / h, 1 - (left + right) / w, 1 - (bottom + top) / h))


def plain(text: str) -> str:
    """A token string as matplotlib should print it: `$` not read as mathtext,
    control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text).replace("$", r"\$")


def readable_ticks(axis, low: float, high: float, count: int = 5) -> None:
    """At most `count` + 1 ticks on [low, high] with as many decimals as their step needs, so that
    close values (0.97760 to 0.97763) get distinct labels that do not run into each other."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    if high <= low:
        low, high = low - 0.5 * (abs(low) or 1) * 1e-3, high + 0.5 * (abs(high) or 1) * 1e-3
    ticks = [t for t in MaxNLocator(nbins=count).tick_values(low, high)
             if low - 1e-12 <= t <= high + 1e-12]
    step = ticks[1] - ticks[0] if len(ticks) > 1 else abs(high - low) or 1
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    # as many more as a tick needs to be printed exactly: a step of 0.15 printed to
    # one decimal put "-0.2" on -0.15
    while decimals < 12 and any(abs(round(t, decimals) - t) > 1e-9 * max(1.0, abs(t))
                                for t in ticks):
        decimals += 1
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_ticklabels([f"{t:.{decimals}f}" for t in ticks])


def _matrix(ax, m: dict, n: int, title: str) -> None:
    """One confusion matrix: rows the label (yes, no), columns the prediction."""
    cells = [[m["tp"], m["fn"]], [m["fp"], m["tn"]]]
    ax.imshow(cells, cmap="Blues", vmin=0, vmax=max(1, n // 2))
    for i in range(2):
        for j in range(2):
            ax.text(j, i, str(cells[i][j]), ha="center", va="center", fontsize=9,
                    color="white" if cells[i][j] > n // 4 else "black")
    ax.set_xticks([0, 1], ["yes", "no"], fontsize=7)
    ax.set_yticks([0, 1], ["yes", "no"], fontsize=7)
    ax.set_xlabel("prediction", fontsize=7)
    ax.set_ylabel("label", fontsize=7)
    ax.set_title(title + (f"\n(unknown {m['unknown']})" if m["unknown"] else ""), fontsize=8)


def confusion_grid(title: str, data: dict):
    names = list(data["readouts"])
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    fig = new_figure(250 * cols, 230 * rows + 60)
    fig.suptitle(title, fontsize=10)
    for k, name in enumerate(names):
        _matrix(fig.add_subplot(rows, cols, k + 1), data["readouts"][name], data["n"], name)
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.08, top=1 - 60 / fig.bbox.height,
                        hspace=0.6, wspace=0.4)
    return fig


def confusion_pair(title: str, data: dict):
    """The paper's Fig. 2: two readouts' confusion matrices side by side, F1 in each title."""
    fig = new_figure(520, 290)
    fig.suptitle(title, fontsize=10)
    for k, (name, m) in enumerate(data["readouts"].items()):
        _matrix(fig.add_subplot(1, 2, k + 1), m, data["n"], f"{name}: F1 {m['f1']:.4f}")
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.14, top=0.8, wspace=0.45)
    return fig


def _bars_size(n: int) -> tuple[int, int]:
    return 800, 90 + 32 * n


def _rows(ax, names: list[str]) -> None:
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first readout on top, half a row of margin


def f1_intervals(title: str, data: dict):
    names = list(data["readouts"])
    fig = new_figure(*_bars_size(len(names)))
    ax = _axes(fig, 160, 50, 40, 35)
    _rows(ax, names)
    for y, name in enumerate(names):
        m = data["readouts"][name]
        low, high = m["f1_ci95"]
        ax.errorbar(m["f1"], y, xerr=[[m["f1"] - low], [high - m["f1"]]], fmt="o", color="C0",
                    capsize=3)
        note = f" ({m['unknown']} unknown)" if m["unknown"] else ""
        ax.text(high + 0.01, y, f"{m['f1']:.4f}{note}", va="center", fontsize=7)
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("F1 (95% bootstrap interval; an unknown answer counts as wrong)", fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def yes_rates(title: str, data: dict):
    """Bars of the answered predictions' yes-rate; a readout that answered nothing is a hatched grey
    band saying so, not a bar of length 0."""
    names = list(data["readouts"])
    fig = new_figure(*_bars_size(len(names)))
    ax = _axes(fig, 160, 50, 40, 35)
    _rows(ax, names)
    for y, name in enumerate(names):
        m = data["readouts"][name]
        if m["answered"] == 0:
            ax.barh(y, 1, color=MISSING, hatch="//", edgecolor="white")
            ax.text(0.02, y, f"no answered questions ({m['unknown']} unknown)", va="center",
                    fontsize=7, zorder=3,
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
            continue
        ax.barh(y, m["yes_rate"], color="C1")
        note = f" of {m['answered']} answered" if m["unknown"] else ""
        ax.text(min(m["yes_rate"], 0.78) + 0.01, y, f"{m['yes_rate']:.4f}{note}", va="center",
                fontsize=7)
    if data["label_yes_rate"] is not None:  # None: every record of the split an error
        ax.axvline(data["label_yes_rate"], color="black", linestyle="--",
                   label=f"labels: {data['label_yes_rate']:.4f}")
        ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    ax.set_xlim(0, 1)
    ax.set_xlabel("yes-rate of the answered predictions", fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def benchmark_bars(title: str, data: dict):
    """One bar per readout (the benchmark's official aggregation) and per rule that
    reports the same metric, the rules' bars in another colour; a readout the formula
    could not take is absent from `bars`."""
    bars = data["bars"]
    fig = new_figure(*_bars_size(len(bars)))
    ax = _axes(fig, 170, 50, 60, 35)
    _rows(ax, [plain(b["name"]) for b in bars])
    top = max([b["value"] * b["factor"] for b in bars] + [data["scale"]])
    for y, bar in enumerate(bars):
        # on the official unit; the label says what the tool printed
        length = bar["value"] * bar["factor"]
        ax.barh(y, length, color="C2" if bar["kind"] == "rule" else "C0")
        label = f"{bar['value']:.6g}" + (f" (x{bar['factor']:g})" if bar["factor"] != 1 else "")
        ax.text(length + top * 0.01, y, label, va="center", fontsize=7)
    ax.set_xlim(0, top * 1.12)
    ax.set_xlabel(plain(data["metric"]), fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def _token_label(token: dict) -> str:
    return (f"{plain(token['token'])}  {token['id']}" if token["token"] is not None
            else str(token["id"]))


def first_tokens(title: str, data: dict):
    """Bars of the first generated token, labelled by its string (and id); under them, one line per
    readout marking the ids it counts as yes (Y) or no (N)."""
    tokens, marked = data["tokens"], data["marked_readouts"]
    labels = [_token_label(t) for t in tokens]
    # rotated labels: their length is their height
    label_px = 12 + 6 * max(map(len, labels), default=4)
    marks = 22 * len(marked)
    fig = new_figure(220 + 40 * max(1, len(tokens)), 240 + label_px + marks)
    bars = _axes(fig, 160, 30 + label_px + marks, 30, 40)
    bars.bar(range(len(tokens)), [t["count"] for t in tokens], color="C2")
    bars.set_xticks(range(len(tokens)), labels, rotation=90, fontsize=7)
    bars.set_xlim(-0.5, len(tokens) - 0.5)
    bars.set_ylabel("questions (first token)", fontsize=8)
    bars.yaxis.get_major_locator().set_params(integer=True)
    bars.set_title(title, fontsize=10)
    height, width = fig.bbox.height, fig.bbox.width
    for row, name in enumerate(marked):  # one line of marks per readout under the token labels
        y = (20 + 22 * (len(marked) - 1 - row)) / height
        fig.text(150 / width, y, name, ha="right", va="center", fontsize=7)
        for col, token in enumerate(tokens):
            mark = token["readouts"].get(name)
            if mark:
                x = bars.transData.transform((col, 0))[0] / width
                fig.text(x, y, "Y" if mark == "yes" else "N", ha="center", va="center", fontsize=7,
                         color="green" if mark == "yes" else "red")
    return fig


def _stat(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def horizontal_boxes() -> dict:
    """Horizontal boxes: `orientation` from matplotlib 3.10, `vert` (deprecated there) before it."""
    import matplotlib

    major, minor = (int(p) for p in matplotlib.__version__.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def attention_plot(title: str, data: dict):
    """Per readout, the image attention of right and wrong answers (box plots side by side), with
    Cohen's d and the Mann-Whitney p at the right of its row."""
    names = list(data["readouts"])
    fig = new_figure(860, 120 + 56 * len(names))
    ax = _axes(fig, 160, 60, 190, 40)
    _rows(ax, names)
    values = [v for name in names for group in ("correct", "wrong")
              for v in data["readouts"][name][group]]
    for y, name in enumerate(names):
        groups = data["readouts"][name]
        for offset, (group, color) in enumerate((("correct", "C0"), ("wrong", "C3"))):
            if groups[group]:
                ax.boxplot(groups[group], positions=[y + (offset - 0.5) * 0.36], widths=0.3,
                           **horizontal_boxes(), patch_artist=True,
                           boxprops={"facecolor": color, "alpha": 0.6}, showfliers=False,
                           manage_ticks=False)
        ax.text(1.02, y, f"d {_stat(groups['cohens_d'], '.2f')}, "
                f"p {_stat(groups['mann_whitney_p'], '.2g')}\n"
                f"n {len(groups['correct'])} right / {len(groups['wrong'])} wrong",
                transform=ax.get_yaxis_transform(), fontsize=7, va="center", clip_on=False)
    if values:
        low, high = min(values), max(values)
        pad = (high - low) * 0.05 or abs(high) * 1e-4 or 1e-4
        ax.set_xlim(low - pad, high + pad)
        readable_ticks(ax.xaxis, low - pad, high + pad)
    ax.tick_params(axis="x", labelsize=7)
    first, last = data["layers"]
    ax.set_xlabel(f"image attention at the answer position, layers {first}-{last} (blue: right, "
                  "red: wrong)",
                  fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def _delta_color(low: float, high: float) -> str:
    return "C2" if low > 0 else "C3" if high < 0 else "0.45"


def delta_reach(datas: list[dict]) -> float:
    """The half-width of the ΔF1 axis that holds every point and interval of these
    figures' panels: one scale for all of them, so that a ±0.006 panel does not look
    as large as a ±0.2 one beside it."""
    spans = [abs(v) for data in datas for table in data["splits"].values() for r in table.values()
             for v in r["delta_f1_ci95"] + [r["delta_f1"]]]
    return max(spans + [0.01]) * 1.1


def delta_f1(title: str, data: dict):
    """Per split (a panel each) and readout: ΔF1 = F1(B) - F1(A) with its paired interval; green or
    red where the interval excludes 0."""
    splits = list(data["splits"])
    names = list(data["readouts"])
    # the row names: readouts, or pairs of runs
    left = max(160, 16 + 6 * max(map(len, names), default=0))
    fig = new_figure(left + 330 * len(splits), 110 + 30 * len(names))
    fig.suptitle(title, fontsize=10)
    width, height = fig.bbox.width, fig.bbox.height
    # the page's shared scale, else its own
    reach = data.get("axis_half_width") or delta_reach([data])
    for k, split in enumerate(splits):
        ax = fig.add_axes(((left + 330 * k) / width, 50 / height, 230 / width, 1 - 110 / height))
        table = data["splits"][split]
        _rows(ax, names)
        if k:
            ax.set_yticklabels([])
        ax.axvline(0, color="black", linewidth=0.8)
        for y, name in enumerate(names):
            if name not in table:
                side = data.get("no_answers", {}).get(split, {}).get(name)
                ax.text(0, y, f"no answer in {side}" if side else "not compared", ha="center",
                        va="center", fontsize=7, color="#666")
                continue
            r = table[name]
            low, high = r["delta_f1_ci95"]
            ax.errorbar(r["delta_f1"], y, xerr=[[r["delta_f1"] - low], [high - r["delta_f1"]]],
                        fmt="o", color=_delta_color(low, high), capsize=3)
            ax.text(1.03, y, f"{r['delta_f1']:+.4f}\np {r['mcnemar_p']:.2g}",
                    transform=ax.get_yaxis_transform(), fontsize=6.5, va="center", clip_on=False)
        ax.set_xlim(-reach, reach)
        readable_ticks(ax.xaxis, -reach, reach, count=4)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{split} (n={data['questions'][split]})", fontsize=9)
        ax.set_xlabel("ΔF1 (B - A), paired 95% interval", fontsize=7)
    return fig


def save(fig, data: dict, path: Path, vector: tuple[str, ...] = VECTOR_FORMATS) -> Path:
    """path.png, path.pdf and path.svg (the `vector` formats) and, beside them,
    path.json with the numbers drawn; returns the PNG's path. Each format draws the
    figure again: a format not asked for costs nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path.with_suffix(".png"), dpi=SAVE_DPI)
    for fmt in vector:
        fig.savefig(path.with_suffix(f".{fmt}"), format=fmt,
                    metadata={"Date": None} if fmt == "pdf" else None)
    path.with_suffix(".json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    return path.with_suffix(".png")
