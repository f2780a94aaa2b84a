"""The markdown our own formatters print (headings, paragraphs, pipe tables, `code`,
**bold**), as HTML for the report page: the benchmark's and the comparisons' tables
read as tables there, not as text in a <pre> box."""
from __future__ import annotations

import html
import re

INLINE = re.compile(r"`([^`]*)`|\*\*([^*]+)\*\*")


def inline(text: str) -> str:
    """One line's text, escaped, with `code` and **bold** marked up."""
    out, last = [], 0
    for match in INLINE.finditer(text):
        out.append(html.escape(text[last:match.start()]))
        out.append(f"<code>{html.escape(match[1])}</code>" if match[1] is not None
                   else f"<b>{html.escape(match[2])}</b>")
        last = match.end()
    return "".join(out) + html.escape(text[last:])


def _cells(line: str) -> list[str]:
    """A table row's cells, split at the pipes that are not escaped
    (cells.markdown_table's `\\|`)."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


NUMBER = re.compile(r"[-+]?(\d[\d.,]*|\.\d+)(e[-+]?\d+)?%?|-|\[[^\]]*\]|nan|inf", re.IGNORECASE)


def _table(lines: list[str]) -> str:
    """A pipe table; its second line (|---|) sets the header apart. A column of numbers (intervals,
    "-" among them) aligns right, as the page's tables do; a column with words in it aligns left."""
    head, rows = _cells(lines[0]), [_cells(line) for line in lines[2:]]
    words = [any(not NUMBER.fullmatch(row[k]) for row in rows if k < len(row))
             for k in range(len(head))]

    def cell(tag: str, k: int, text: str) -> str:
        aligned = ' style="text-align:left"' if words[k] else ""
        return f"<{tag}{aligned}>{inline(text)}</{tag}>"

    thead = "".join(cell("th", k, c) for k, c in enumerate(head))
    body = "".join("<tr>" + "".join(cell("td", k, c) for k, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return (f'<div class="wide"><table><thead><tr>{thead}</tr></thead><tbody>{body}</tbody>'
            '</table></div>')


def markdown_html(text: str) -> str:
    """Blocks separated by blank lines: `#` headings (shifted one level down, under the page's h2),
    pipe tables (a line or more before them is their caption), anything else a paragraph."""
    parts = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        heading = re.match(r"(#{1,4}) (.*)", lines[0])
        if heading and len(lines) == 1:
            level = min(6, len(heading[1]) + 1)
            parts.append(f"<h{level}>{inline(heading[2])}</h{level}>")
            continue
        first_row = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
        if (first_row is not None and len(lines) > first_row + 1
                and set(lines[first_row + 1]) <= set("|-: ")):
            if first_row:
                parts.append("<p>" + "<br>".join(inline(line) for line in lines[:first_row])
                             + "</p>")
            parts.append(_table(lines[first_row:]))
            continue
        parts.append("<p>" + "<br>".join(inline(line) for line in lines) + "</p>")
    return "\n".join(parts)
