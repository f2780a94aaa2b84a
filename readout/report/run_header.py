"""What the report's page shows of each run in its header (the settings row under
HEADER), and how it shows a path or a run's command: relative to the report's folder,
so that a shared page names no machine's folders."""
from __future__ import annotations

import os
from pathlib import Path

from ..records import model_name


def _quantization(settings: dict) -> str:
    quant = settings.get("quant")
    if not quant:
        return "-"
    return quant + (" (lm_head too)" if settings.get("quantize_lm_head") and quant != "none"
                    else "")


def _method(meta: dict) -> str:
    method = meta.get("method") or {"name": "none"}
    settings = ", ".join(f"{k}={v}" for k, v in (method.get("settings") or {}).items())
    return f"{method['name']} ({settings})" if settings else method["name"]


def header_row(label: str, meta: dict) -> list[str]:
    """One run's line of the header: what made it, "-" for what its meta.json does not record."""
    if meta.get("imported_from"):
        summary = meta.get("summary") or {}
        return [label, str(summary.get("model") or "-"), f"imported {meta['imported_from']} file",
                "-", "-", "-", "-", "-", "-"]
    model, settings = meta.get("model") or {}, meta.get("settings") or {}
    dtype = settings.get("resolved_dtype") or settings.get("dtype") or "-"
    # the hub id, else the checkpoint folder's name: a shared page names no folder of
    # the machine that ran it
    return [label, model_name(meta) or "-", str(model.get("family") or "-"),
            str(meta.get("template") or "-"), _method(meta), str(dtype), _quantization(settings),
            str(meta.get("created") or "-"), str(meta.get("pope_fast_version") or "-")]


HEADER = ("run", "model", "family", "template", "method", "dtype", "quantization", "created",
          "pope-fast")


def shown_path(path: str | Path, out: Path) -> str:
    """A path as the page shows it: relative to the report's folder (a shared page
    names no machine's folders)."""
    return Path(os.path.relpath(Path(path).resolve(), out.resolve())).as_posix()


def shown_command(command: str, out: Path) -> str:
    """A run's command as it was typed, its program as `pope-fast` (not the path of the
    environment's binary) and every absolute path relative to the report's folder."""
    program, *words = command.split(" ")
    name = Path(program).name

    def word(w: str) -> str:
        option, eq, value = w.partition("=") if w.startswith("--") and "=" in w else ("", "", w)
        return option + eq + (shown_path(value, out) if value.startswith("/") else value)

    ours = name == "pope-fast" or (name == "__main__.py"
                                   and Path(program).parent.name == "pope_fast")  # -m pope_fast
    return " ".join(["pope-fast" if ours else name, *map(word, words)])
