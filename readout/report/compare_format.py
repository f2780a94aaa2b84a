"""`pope-fast compare`'s report of POPE runs: per pair, what differs, ΔF1 per readout and split with
its paired interval, McNemar's p and the answers flipped (markdown), or the result as JSON."""
from __future__ import annotations

from ..cells import markdown_table
from ..compare import silent_sides
from ..metrics import answered
from ..readouts import READOUTS
from ..records import strict_json
from ..score import reason_lines
from .bias_format import format_bias
from .tables import NO_ANSWER, reasons_of

# McNemar's p beside ΔF1: why p = 1 can stand beside an interval that excludes 0 (compare's header,
# the report's ΔF1 captions)
MCNEMAR_LEGEND = ("McNemar's p tests whether A and B are right on different questions, not whether "
                  "F1 moved: answers that trade one error for another (a false positive for a "
                  "false negative, a wrong answer for an unknown) change F1 but not p, so p = 1 "
                  "beside an interval that excludes 0 is no contradiction.")


def format_compare(result: dict, fmt: str = "markdown") -> str:
    """`json`: the result as is; `markdown`: per pair, the ΔF1 table (readouts x splits) and whether
    the ranking survives the readout, then what a yes-bias alone gives (bias_format), then each
    split's metrics of both runs."""
    if fmt == "json":
        return strict_json(result, indent=2, ensure_ascii=False)
    if fmt != "markdown":
        raise ValueError(f"compare formats are json and markdown, not {fmt!r}")
    level = round(result["level"] * 100)
    blocks = ["## Does the method's gain survive the readout?",
              f"Cells: ΔF1 = F1(B) - F1(A) [paired bootstrap {level}% interval, "
              f"{result['resamples']} resamples, seed {result['seed']}], McNemar's exact p on the "
              f"paired answers' correctness. {MCNEMAR_LEGEND} {NO_ANSWER}: a readout that answered "
              "no question in A or in B (every answer unknown), which has no ΔF1 and does not "
              "count in the ranking."]
    for pair in result["pairs"]:
        blocks += _summary(pair)
    bias = format_bias(result, _title)
    if bias:
        blocks.append(bias)
    blocks.append("## Metrics of each run")
    for pair in result["pairs"]:
        blocks += _details(pair)
    return "\n\n".join(blocks)


def _method_text(method: dict) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in (method.get("settings") or {}).items())
    return f"{method['name']}: {settings}" if settings else method["name"]


def _title(pair: dict) -> str:
    return (f"A `{pair['a']}` ({_method_text(pair['method_a'])}) vs B `{pair['b']}` "
            f"({_method_text(pair['method_b'])})")


def _flag(pair: dict) -> list[str]:
    flags = []
    if pair.get("incomplete"):
        flags.append("> **INCOMPLETE RUNS** (stopped part way: compared on the questions both "
                     "recorded): " + "; ".join(pair["incomplete"]))
    if pair["mismatches"]:
        flags.append("> **MISMATCHED RUNS** (compared with --allow-mismatch; differences may come "
                     "from these, not from the method): " + "; ".join(pair["mismatches"]))
    return flags


def _signed(value: float) -> str:
    return f"{value:+.4f}"


def _cell(r: dict) -> str:
    if silent_sides(r):
        return f"{NO_ANSWER} (no answer in {silent_sides(r)})"
    low, high = r["delta_f1_ci95"]
    return f"{_signed(r['delta_f1'])} [{_signed(low)}, {_signed(high)}], p={r['mcnemar_p']:.3g}"


def _summary(pair: dict) -> list[str]:
    splits = pair["splits"]
    names = [n for n in READOUTS if any(n in table for table in splits.values())]
    header = ["readout"] + [f"{s} (n={pair['questions'][s]['compared']})" for s in splits]
    rows = [[n] + [_cell(t[n]) if n in t else "-" for t in splits.values()] for n in names]
    if "average" in pair:  # several datasets: the mean ΔF1 of their splits, as papers print POPE
        averaged = pair["average"]["readouts"]
        header.append(f"average ({len(pair['average']['groups'])} dataset x split groups)")
        rows = [row + [_signed(averaged[n]["delta_f1"]) if n in averaged else "-"]
                for n, row in zip(names, rows)]
    lines = [f"### {_title(pair)}"]
    if pair["same_model"] is False:
        lines.append("The runs read different checkpoints: this compares models.")
    lines += [*_flag(pair), markdown_table(header, rows), _ranking_line(pair)]
    lines += _left_out(pair)
    return lines


def _ranking_line(pair: dict) -> str:
    changed = any(r["changes"] for r in pair["ranking"].values())
    head = ("**The ranking of A and B changes with the readout**" if changed
            else "The ranking of A and B is the same under every readout")
    parts = []
    for split, r in pair["ranking"].items():
        if not pair["splits"][split]:
            parts.append(f"{split}: no question answered by both runs")
            continue
        shown = [f"ΔF1 {sign} 0 under {', '.join(names)}" for sign, names in
                 ((">", r["positive"]), ("<", r["negative"])) if names
                 ] or ["ΔF1 = 0 under every readout"]
        excludes = ", ".join(r["excludes_zero"]) or "no readout"
        silent = [f"{name} (no answer in {side})" for name, side in r.get("no_answers", {}).items()]
        left = f"; not counted: {', '.join(silent)}" if silent else ""
        parts.append(f"{split}: {'; '.join(shown)}; interval excludes 0 under {excludes}{left}")
    return f"{head} ({' | '.join(parts)})."


def _left_out(pair: dict) -> list[str]:
    lines = []
    for split, q in pair["questions"].items():
        if q["errors_a"] or q["errors_b"]:
            lines.append(f"{split}: {q['joined'] - q['compared']} questions left out of both runs "
                         f"(error records: A {q['errors_a']}, B {q['errors_b']}).")
    for split, missing in pair.get("unavailable", {}).items():
        lines += [f"{split}: {name} not compared ({why})." for name, why in missing.items()]
    for split, table in pair["splits"].items():
        for side in ("a", "b"):
            lines += [f"{line}." for line in reason_lines(
                reasons_of({n: r[side] for n, r in table.items()}),
                pair["questions"][split]["compared"], f"{split}, {side.upper()}: ")]
    return lines


DETAIL_COLUMNS = ("readout", "F1 A", "F1 B", "ΔF1 [95% CI]", "prec A", "prec B", "rec A", "rec B",
                  "acc A", "acc B", "yes-rate A", "yes-rate B", "unk A", "unk B", "yes→no",
                  "no→yes", "McNemar p")


def _detail_row(name: str, r: dict) -> list[str]:
    """A readout's metrics of A and B; "–" for a run's F1, precision, recall and yes-rate where it
    answered no question, and for ΔF1 where either did."""
    a, b = r["a"], r["b"]
    low, high = r["delta_f1_ci95"]

    def pair_of(m: str) -> list[str]:
        over_answered = m != "accuracy"  # accuracy is over every question, an unknown counted wrong
        return [NO_ANSWER if over_answered and not answered(x) else f"{x[m]:.4f}" for x in (a, b)]

    delta = NO_ANSWER if silent_sides(r) else (f"{_signed(r['delta_f1'])} [{_signed(low)}, "
                                               f"{_signed(high)}]")
    values = [*pair_of("f1"), delta]
    for m in ("precision", "recall", "accuracy", "yes_rate"):
        values += pair_of(m)
    values += [str(a["unknown"]), str(b["unknown"]), str(r["flips"]["yes_to_no"]),
               str(r["flips"]["no_to_yes"]), f"{r['mcnemar_p']:.3g}"]
    return [name] + values


def _details(pair: dict) -> list[str]:
    lines = []
    for split, table in pair["splits"].items():
        q = pair["questions"][split]
        lines += [f"### {split}: {_title(pair)}, {q['compared']} questions compared", *_flag(pair)]
        if table:
            lines.append(markdown_table(list(DETAIL_COLUMNS),
                                        [_detail_row(n, r) for n, r in table.items()]))
        else:
            lines.append("No question answered by both runs.")
    return lines + _average(pair)


def _average(pair: dict) -> list[str]:
    """The mean of the dataset x split groups (readout/grid.py), where the runs hold
    several datasets: each readout's F1 and accuracy of A and B and the mean ΔF1
    (each group's interval is in its own table)."""
    if "average" not in pair:
        return []
    average = pair["average"]
    rows = [[n, *(f"{m[k]:.4f}" for k in ("f1_a", "f1_b")), _signed(m["delta_f1"]),
             *(f"{m[k]:.4f}" for k in ("accuracy_a", "accuracy_b"))]
            for n, m in average["readouts"].items()]
    return [f"### average of {len(average['groups'])} dataset x split groups "
            f"({', '.join(average['groups'])}): {_title(pair)}",
            markdown_table(["readout", "F1 A", "F1 B", "mean ΔF1", "acc A", "acc B"], rows)]
