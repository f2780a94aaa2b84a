"""The report's figures laid out for one column of a two-column paper: 3.3 in wide at print size, no
text under 8 pt, every label inside the figure and clear of the others. Drawn from the same numbers
as the page's figures (each one's JSON), saved as PDF beside them (`<name>.column.pdf`).

At that width the page's side-by-side panels and the numbers printed beside each mark do not fit:
the column layouts stack a ΔF1 figure's splits, put each row's number into its row label
("template_aware  0.822"), set the confusion matrices three to a row, transpose the F1 grid
(readouts as rows, models keyed A, B, ...) and list under the first-token bars each readout's
tokens; the JSON keeps every digit and the p-values. Labels are measured with matplotlib's renderer,
then shortened in the middle or wrapped, never set smaller."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .figures import DPI, MISSING, delta_reach, horizontal_boxes, new_figure, plain, readable_ticks

WIDTH_IN = 3.3  # one column of a two-column paper (ACL, CVPR, NeurIPS: 3.25-3.33 in)
POINTS = 8  # the smallest text, at print size
TITLE_POINTS = 9
WIDTH = round(WIDTH_IN * DPI)  # the layout's pixels
ROW = 18  # px a row of bars or intervals takes: an 8-pt label (11 px) and air
LINE = 14  # px an 8-pt line takes (8 pt x 1.2 line spacing: 13.3 px); a 9-pt one 15
MAX_LABEL = 0.62  # of the width the row labels may take; a longer label is shortened in its middle


@lru_cache(maxsize=None)
def _measure(points: float):
    """The width in pixels of a text at `points`, as an Agg renderer at DPI draws it (one for every
    figure: the width of a text does not depend on the figure it is drawn in)."""
    from matplotlib.font_manager import FontProperties

    renderer, font = new_figure(WIDTH, 100).canvas.get_renderer(), FontProperties(size=points)
    return lambda text: renderer.get_text_width_height_descent(text, font, ismath=False)[0]


def _shortened(label: str, width, most: float) -> str:
    """label, or its start and end about an ellipsis, within `most` pixels."""
    def cut(keep: int) -> str:
        return (label if keep == len(label)
                else label[:keep // 2] + "…" + label[len(label) - (keep - keep // 2):])

    keep = len(label)
    while keep > 4 and width(cut(keep)) > most:
        keep -= 1
    return cut(keep)


def _wrapped(text: str, width, most: float) -> str:
    """text in as many lines as keep each within `most` pixels (its own line breaks kept)."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        start = len(lines)
        for word in paragraph.split():
            if len(lines) > start and width(lines[-1] + " " + word) <= most:
                lines[-1] += " " + word
            else:
                lines.append(word)
    return "\n".join(lines)


def _rows_figure(title: str, labels: list[str], xlabel: str, panels: int = 1,
                 panel_titles: bool = False, row: int = ROW):
    """A figure of `panels` stacked panels of len(labels) rows each, the labels
    (shortened to fit) on the left, room above each panel for its title where it has
    one, and the x axis's name (wrapped to fit) under the last, centred on the
    figure: the figure and the axes, top to bottom."""
    width, title_width = _measure(POINTS), _measure(TITLE_POINTS)
    labels = [_shortened(plain(label), width, WIDTH * MAX_LABEL) for label in labels]
    heading, under = (_wrapped(title, title_width, WIDTH * 0.96),
                      _wrapped(xlabel, width, WIDTH * 0.96))
    top = 10 + 15 * (heading.count("\n") + 1) + (16 if panel_titles else 0)
    bottom = 26 + LINE * (under.count("\n") + 1)  # the x tick labels, then the name
    panel, gap = row * len(labels) + 10, 36  # gap: a panel's title and the x ticks above it
    height = top + panels * panel + (panels - 1) * gap + bottom
    fig = new_figure(WIDTH, height)
    fig.suptitle(heading, fontsize=TITLE_POINTS, y=1 - 6 / height, va="top")
    fig.text(0.5, 3 / height, under, ha="center", va="bottom", fontsize=POINTS)
    left = 10 + max(map(width, labels), default=1)
    axes = []
    for k in range(panels):
        y = bottom + (panels - 1 - k) * (panel + gap)
        # right: half the last x tick label ("-0.20" at 8 pt) stands past the axes
        ax = fig.add_axes((left / WIDTH, y / height, (WIDTH - left - 20) / WIDTH, panel / height))
        ax.set_yticks(range(len(labels)), labels, fontsize=POINTS)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.tick_params(axis="x", labelsize=POINTS)
        axes.append(ax)
    return fig, axes


def _ticks(ax, low: float, high: float) -> None:
    """As many x ticks as labels of up to six characters fit side by side in the axes' width."""
    fit = int(ax.bbox.width / (7 * POINTS * 0.62 * DPI / 72))
    readable_ticks(ax.xaxis, low, high, count=max(1, min(4, fit)))


def f1_intervals(title: str, data: dict):
    """F1 with its 95% interval per readout; the value in the row's label."""
    names = list(data["readouts"])
    rows = [data["readouts"][n] for n in names]
    fig, [ax] = _rows_figure(title, [f"{n}  {m['f1']:.3f}" for n, m in zip(names, rows)],
                             "F1, 95% interval (unknown = wrong)")
    for y, m in enumerate(rows):
        low, high = m["f1_ci95"]
        ax.errorbar(m["f1"], y, xerr=[[m["f1"] - low], [high - m["f1"]]], fmt="o", color="C0",
                    capsize=2, markersize=3)
    ax.set_xlim(0, 1)
    _ticks(ax, 0, 1)
    return fig


def yes_rates(title: str, data: dict):
    """The answered predictions' yes-rate per readout (a grey band where none was
    answered), the labels' rate dashed."""
    names = list(data["readouts"])
    rows = [data["readouts"][n] for n in names]
    label = data["label_yes_rate"]
    labels = [f"{n}  {m['yes_rate']:.3f}" if m["answered"] else f"{n}  none answered"
              for n, m in zip(names, rows)]
    xlabel = "yes-rate" + (f" (dashed: labels, {label:.3f})" if label is not None else "")
    fig, [ax] = _rows_figure(title, labels, xlabel)
    for y, m in enumerate(rows):
        if m["answered"]:
            ax.barh(y, m["yes_rate"], color="C1")
        else:
            ax.barh(y, 1, color=MISSING, hatch="//", edgecolor="white")
    if label is not None:
        ax.axvline(label, color="black", linestyle="--")
    ax.set_xlim(0, 1)
    _ticks(ax, 0, 1)
    return fig


def benchmark_bars(title: str, data: dict):
    """The benchmark's headline metric per readout and rule (the rules' bars green),
    the value in the label."""
    bars = data["bars"]
    labels = [f"{b['name']}  {b['value']:.6g}" + (f" x{b['factor']:g}" if b["factor"] != 1 else "")
              for b in bars]
    fig, [ax] = _rows_figure(title, labels, plain(data["metric"]))
    top = max([b["value"] * b["factor"] for b in bars] + [data["scale"]])
    for y, bar in enumerate(bars):
        ax.barh(y, bar["value"] * bar["factor"], color="C2" if bar["kind"] == "rule" else "C0")
    ax.set_xlim(0, top)
    _ticks(ax, 0, top)
    return fig


def delta_f1(title: str, data: dict):
    """ΔF1 (B - A) with its paired interval per readout (or pair), one panel per split stacked, on
    the page's shared scale; green or red where the interval excludes 0."""
    splits, names = list(data["splits"]), list(data["readouts"])
    reach = data.get("axis_half_width") or delta_reach([data])
    # the widest labels the panels' will be
    fig, axes = _rows_figure(title, [f"{n}  +0.000" for n in names],
                             "ΔF1 (B - A), paired 95% interval", len(splits), True)
    for ax, split in zip(axes, splits):
        table = data["splits"][split]
        # each label the layout's with this split's value in place of "+0.000" (the
        # end a shortened label keeps)
        drawn = [t.get_text()[:-6] for t in ax.get_yticklabels()]
        ax.set_yticks(range(len(names)), [f"{d}{table[n]['delta_f1']:+.3f}" if n in table
                                          else f"{d}     -" for d, n in zip(drawn, names)],
                      fontsize=POINTS)
        ax.axvline(0, color="black", linewidth=0.6)
        for y, name in enumerate(names):
            if name in table:
                r = table[name]
                low, high = r["delta_f1_ci95"]
                color = "C2" if low > 0 else "C3" if high < 0 else "0.45"
                ax.errorbar(r["delta_f1"], y, xerr=[[r["delta_f1"] - low], [high - r["delta_f1"]]],
                            fmt="o", color=color, capsize=2, markersize=3)
        ax.set_xlim(-reach, reach)
        _ticks(ax, -reach, reach)
        ax.set_title(f"{split} (n={data['questions'][split]})", fontsize=POINTS, pad=3)
    return fig


def attention(title: str, data: dict):
    """Per readout, the image attention of right (blue) and wrong (red) answers as
    box plots; Cohen's d in the row's label (the page figure and its JSON: the
    Mann-Whitney p and the group sizes)."""
    names = list(data["readouts"])
    groups = [data["readouts"][n] for n in names]
    first, last = data["layers"]
    labels = [f"{n}  d {g['cohens_d']:.2f}" if g["cohens_d"] is not None else f"{n}  d -"
              for n, g in zip(names, groups)]
    fig, [ax] = _rows_figure(title, labels,
                             f"image attention, layers {first}-{last} (blue: right, red: wrong)",
                             row=26)
    values = [v for g in groups for side in ("correct", "wrong") for v in g[side]]
    for y, g in enumerate(groups):
        for offset, (side, color) in enumerate((("correct", "C0"), ("wrong", "C3"))):
            if g[side]:
                ax.boxplot(g[side], positions=[y + (offset - 0.5) * 0.4], widths=0.32,
                           **horizontal_boxes(), patch_artist=True,
                           boxprops={"facecolor": color, "alpha": 0.6}, showfliers=False,
                           manage_ticks=False)
    if values:
        low, high = min(values), max(values)
        pad = (high - low) * 0.05 or abs(high) * 1e-4 or 1e-4
        ax.set_xlim(low - pad, high + pad)
        _ticks(ax, low - pad, high + pad)
    return fig


def confusion(title: str, data: dict, per_row: int = 3):
    """Each readout's confusion matrix (rows the label, columns the prediction), `per_row` to a row;
    a matrix's title its readout (shortened to fit) and, in a pair's figure, its F1."""
    items = list(data["readouts"].items())
    width = _measure(POINTS)
    heading = _wrapped(title, _measure(TITLE_POINTS), WIDTH * 0.96)
    cell_w = (WIDTH - 10) / per_row
    side = min(70.0, cell_w - 40)  # the matrix, square; its left: "yes"/"no" and air
    rows = -(-len(items) // per_row)
    band = 2 * LINE + 6 + side + 30  # two title lines, the matrix, its x tick labels
    top = 10 + 15 * (heading.count("\n") + 1)
    height = top + rows * band + 20
    fig = new_figure(WIDTH, height)
    fig.suptitle(heading, fontsize=TITLE_POINTS, y=1 - 6 / height, va="top")
    fig.text(0.5, 3 / height, "rows: label; columns: prediction", ha="center", va="bottom",
             fontsize=POINTS)
    n = data["n"]
    for k, (name, m) in enumerate(items):
        row, col = divmod(k, per_row)
        x = 5 + col * cell_w + (cell_w - side) / 2 + 10
        y = height - top - row * band - 2 * LINE - 6 - side
        ax = fig.add_axes((x / WIDTH, y / height, side / WIDTH, side / height))
        cells = [[m["tp"], m["fn"]], [m["fp"], m["tn"]]]
        ax.imshow(cells, cmap="Blues", vmin=0, vmax=max(1, n // 2))
        for i in range(2):
            for j in range(2):
                ax.text(j, i, str(cells[i][j]), ha="center", va="center", fontsize=POINTS,
                        color="white" if cells[i][j] > n // 4 else "black")
        ax.set_xticks([0, 1], ["yes", "no"], fontsize=POINTS)
        ax.set_yticks([0, 1], ["yes", "no"], fontsize=POINTS)
        second = (f"F1 {m['f1']:.3f}" if "f1" in m
                  else (f"unknown {m['unknown']}" if m["unknown"] else ""))
        ax.set_title(_shortened(plain(name), width, cell_w - 6) + (f"\n{second}" if second else ""),
                     fontsize=POINTS, pad=3)
    return fig


def f1_grid(data: dict):
    """Every model's F1 under every readout: a panel per split (and per few models where more do not
    fit), the readouts as rows and the models as columns keyed A, B, ... (the key under the panels),
    each model's best readouts bold, as on the page."""
    from matplotlib.colors import ListedColormap

    models, groups = data["models"], data["groups"]
    keys = [chr(ord("A") + i) if i < 26 else f"M{i + 1}" for i in range(len(models))]
    width = _measure(POINTS)
    left = 10 + max(width(plain(r)) for g in groups for r in data["readouts"][g])
    cell = max(38.0, width("0.000") + 8)
    per_panel = max(1, int((WIDTH - left - 12) // cell))
    panels = [(g, list(range(i, min(i + per_panel, len(models))))) for g in groups
              for i in range(0, len(models), per_panel)]
    key = _wrapped("; ".join(f"{k}: {plain(m)}" for k, m in zip(keys, models)), width, WIDTH * 0.96)
    # title, keys, rows, air
    bands = [16 + 14 + 16 * len(data["readouts"][g]) + 8 for g, _ in panels]
    top, bottom = 10 + 15, 8 + LINE * (key.count("\n") + 1)
    height = top + sum(bands) + bottom
    fig = new_figure(WIDTH, height)
    fig.suptitle("F1 by model, readout and split", fontsize=TITLE_POINTS, y=1 - 6 / height,
                 va="top")
    fig.text(0.5, 3 / height, key, ha="center", va="bottom", fontsize=POINTS)
    y = height - top
    for (group, chunk), band in zip(panels, bands):
        readouts, rows = data["readouts"][group], 16 * len(data["readouts"][group])
        y -= band
        ax = fig.add_axes((left / WIDTH, (y + 8) / height, cell * len(chunk) / WIDTH,
                           rows / height))
        # [readout][model]
        f1 = [[data["f1"][group][m][r] for m in chunk] for r in range(len(readouts))]
        ax.imshow([[1.0] * len(chunk)] * len(readouts), cmap=ListedColormap([MISSING]),
                  aspect="auto")
        ax.imshow([[float("nan") if v is None else v for v in row] for row in f1], cmap="viridis",
                  vmin=0, vmax=1, aspect="auto")
        for r, row in enumerate(f1):
            for c, v in enumerate(row):
                ax.text(c, r, "-" if v is None else f"{v:.3f}", ha="center", va="center",
                        fontsize=POINTS,
                        color="#555" if v is None else "black" if v > 0.6 else "white",
                        fontweight="bold" if data["best"][group][chunk[c]][r] else "normal")
        ax.set_yticks(range(len(readouts)), [plain(r) for r in readouts], fontsize=POINTS)
        ax.xaxis.tick_top()
        ax.set_xticks(range(len(chunk)), [keys[m] for m in chunk], fontsize=POINTS)
        ax.tick_params(length=0)
        ax.set_title(_shortened(plain(group), width, WIDTH - left - 10), fontsize=POINTS, pad=14,
                     loc="left")
    return fig


def first_tokens(title: str, data: dict):
    """The first generated tokens' counts as bars (the token and its id, the count, in the row's
    label); under them, per readout, the shown tokens it counts as yes and as no."""
    tokens = data["tokens"]
    names = [f"{plain(t['token'])} {t['id']}" if t["token"] is not None else str(t["id"])
             for t in tokens]
    marks = []
    for readout in data["marked_readouts"]:
        said = {side: [n for n, t in zip(names, tokens) if t["readouts"].get(readout) == side]
                for side in ("yes", "no")}
        if said["yes"] or said["no"]:
            marks.append(f"{readout}: yes {', '.join(said['yes']) or '-'}; no "
                         f"{', '.join(said['no']) or '-'}")
    fig, [ax] = _rows_figure(title, [f"{n}  {t['count']}" for n, t in zip(names, tokens)],
                             "\n".join(["questions (first token)", *marks]))
    ax.barh(range(len(tokens)), [t["count"] for t in tokens], color="C2")
    most = max([t["count"] for t in tokens] + [1])
    ax.set_xlim(0, most)
    _ticks(ax, 0, most)
    return fig


def save(fig, path: Path) -> Path:
    """path.column.pdf: the column layout, vector, beside the page figure of the same name."""
    out = path.with_name(path.name + ".column.pdf")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="pdf", metadata={"Date": None})
    return out
