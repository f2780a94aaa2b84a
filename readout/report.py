"""Text renderings of scores and token audits (the CLI prints what these return)."""
from __future__ import annotations

import json

COLUMNS = (("readout", "{}"), ("TP", "{}"), ("TN", "{}"), ("FP", "{}"), ("FN", "{}"), ("unk", "{}"),
           ("acc", "{:.4f}"), ("prec", "{:.4f}"), ("rec", "{:.4f}"), ("F1", "{:.4f}"), ("F1 95% CI", "{}"),
           ("yes-rate", "{:.4f}"), ("yes/all", "{:.4f}"))


def _rows(run: dict) -> list[list[str]]:
    rows = []
    for name, m in run["readouts"].items():
        values = (name, m["tp"], m["tn"], m["fp"], m["fn"], m["unknown"], m["accuracy"], m["precision"],
                  m["recall"], m["f1"], f"{m['f1_ci95'][0]:.4f}-{m['f1_ci95'][1]:.4f}", m["yes_rate"],
                  m["yes_rate_all"])
        rows.append([fmt.format(v) for (_, fmt), v in zip(COLUMNS, values)])
    return rows


def _aligned(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
                      *("| " + " | ".join(r) + " |" for r in rows)])


def _significant_pairs(run: dict, alpha: float = 0.05, shown: int = 4) -> list[str]:
    pairs = sorted(((p, pair) for pair, p in run["mcnemar"].items() if p < alpha))
    listed = [f"{pair}: p={p:.3g}" for p, pair in pairs[:shown]]
    return listed + ([f"{len(pairs) - shown} more pairs (see --format json)"] if len(pairs) > shown else [])


def format_runs(runs: list[dict], fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps({"runs": runs}, indent=2)
    header = [c for c, _ in COLUMNS]
    render = _markdown if fmt == "markdown" else _aligned
    blocks = []
    for run in runs:
        title = f"{run['source']} — split {run['split']}, n={run['n']}"
        if run.get("errors"):
            title += f", {run['errors']} error records (left out of every metric)"
        parts = [f"### {title}" if fmt == "markdown" else title, render(header, _rows(run))]
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
        blocks.append("\n".join(parts))
    return "\n\n".join(blocks)


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
    rows = [[name, ", ".join(f"{t['id']} {t['token']!r}" for t in r["yes_tokens"]) or "-",
             ", ".join(f"{t['id']} {t['token']!r}" for t in r["no_tokens"]) or "-"]
            for name, r in audit["readouts"].items()]
    lines += [_aligned(["readout", "yes ids", "no ids"], rows)]
    if audit["warnings"]:
        lines += ["", "warnings:"] + [f"  - {w}" for w in audit["warnings"]]
    return "\n".join(lines)
