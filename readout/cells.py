"""The tables every pope-fast writer gives (scores, protocol rows, benchmark metrics): the CSV, made
in one place that keeps each cell safe to open in a spreadsheet, and the pipe table."""
from __future__ import annotations

import csv
import io
import re

# OWASP's CSV injection advice: a spreadsheet runs a cell that starts with one of these as a formula
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)")


def spreadsheet_cell(value):
    """A CSV cell no spreadsheet runs: text starting as a formula gets a leading ' (shown, not run);
    a number, -0.5 or its repr as text alike, stays as it is."""
    if (not isinstance(value, str) or not value.startswith(FORMULA_STARTS)
            or NUMBER.fullmatch(value)):
        return value
    return "'" + value


def csv_text(rows) -> str:
    """Rows (the header first) as the CSV every pope-fast writer gives, each cell through
    spreadsheet_cell."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([spreadsheet_cell(c) for c in row]
                                                   for row in rows)
    return out.getvalue().rstrip("\n")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A pipe table; a `|` inside a cell (a folder's name, say) is escaped, not read as a column."""
    line = lambda cells: "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)])
