"""The page's F1 grid: every model's F1 under every readout and split in one figure, a panel per
dataset and split (matplotlib imported inside its functions, as in figures.py)."""
from __future__ import annotations

import math

from .figures import MISSING, new_figure


def _cell_color(value: float | None) -> str:
    return "black" if value is not None and value > 0.6 else "white"


def _grid_panel(ax, group: str, data: dict, first_in_row: bool):
    from matplotlib.colors import ListedColormap

    f1, best, readouts = data["f1"][group], data["best"][group], data["readouts"][group]
    ax.imshow([[1.0] * len(row) for row in f1], cmap=ListedColormap([MISSING]), aspect="auto")
    image = ax.imshow([[math.nan if v is None else v for v in row] for row in f1], cmap="viridis",
                      vmin=0, vmax=1, aspect="auto")
    for i, row in enumerate(f1):
        for j, v in enumerate(row):
            ax.text(j, i, "-" if v is None else f"{v:.4f}", ha="center", va="center", fontsize=7,
                    color="#555" if v is None else _cell_color(v),
                    fontweight="bold" if best[i][j] else "normal")
    ax.set_xticks(range(len(readouts)), readouts, rotation=90, fontsize=7)
    ax.set_yticks(range(len(data["models"])), data["models"] if first_in_row else [], fontsize=8)
    ax.set_title(group, fontsize=9)
    return image


GRID_WIDTH = 1300  # panels wrap to a new row past this many pixels


def _grid_rows(widths: list[int], left: int) -> list[list[int]]:
    """Panel indices per row of the figure, as many as fit in GRID_WIDTH."""
    rows, used = [[]], left
    for k, w in enumerate(widths):
        if rows[-1] and used + w > GRID_WIDTH:
            rows.append([])
            used = left
        rows[-1].append(k)
        used += w + 20
    return rows


def f1_grid(data: dict):
    """One figure of every model's F1 under every readout and split: a panel per dataset and split
    (models as rows, the readouts supplied there as columns)."""
    groups, models = data["groups"], data["models"]
    left = 30 + 6 * max(map(len, models))
    widths = [50 * len(data["readouts"][g]) for g in groups]
    rows = _grid_rows(widths, left)
    panel_h = max(90, 28 * len(models))  # one model's row is a readable band, not a strip
    # rotated names
    under = [20 + 6 * max(len(n) for k in row for n in data["readouts"][groups[k]]) for row in rows]
    # + the colour bar
    width = max(360, max(left + sum(widths[k] + 20 for k in row) for row in rows)) + 60
    fig = new_figure(width, 40 + sum(panel_h + 30 + u for u in under))
    fig.suptitle("F1 by model, readout and split", fontsize=10)
    height, y = fig.bbox.height, fig.bbox.height - 40
    for row, below in zip(rows, under):
        x, y = left, y - panel_h - 30
        for k in row:
            ax = fig.add_axes((x / width, y / height, widths[k] / width, panel_h / height))
            image = _grid_panel(ax, groups[k], data, first_in_row=k == row[0])
            x += widths[k] + 20
        y -= below
    bar = fig.add_axes(((width - 52) / width, (height - 70 - panel_h) / height, 10 / width,
                        panel_h / height))
    fig.colorbar(image, cax=bar).ax.tick_params(labelsize=7)  # the shading's scale: F1 from 0 to 1
    bar.set_title("F1", fontsize=7)
    return fig
