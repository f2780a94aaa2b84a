"""The bias-aware part of `pope-fast compare`'s markdown and of the report's compare section: per
pair, the yes-rate shift beside the yes-rate-matched control, then AUROC, AUPRC and calibration,
from compare.json's `bias` entries (bias.py)."""
from __future__ import annotations

from ..bias import ECE_BINS
from ..cells import markdown_table
from ..score import REASON_TEXT
from .tables import NO_ANSWER

BIAS_LEGEND = (
    "Logit readouts only, on the questions where both runs have a yes−no margin (max yes logit − "
    "max no logit); the rest are left out and counted. Control: A's own margins with one threshold "
    "moved so that A answers yes as often as B (its k largest margins, equal margins in question "
    "order). Gain: `no gain` where F1(B) ≤ F1(A); `beyond threshold` where F1(B) > F1(control) and "
    "the interval of F1(B) − F1(control) lies above 0; else `threshold alone` (the threshold alone "
    "gives B's gain, or cannot be told from it). AUROC (a tie counts 1/2) and AUPRC of the margin, "
    "yes positive: a bias that shifts every margin by one constant leaves them as they are. Yes "
    f"probability: softmax over the readout's yes and no candidates together; ECE over {ECE_BINS} "
    "equal-width bins, Brier = mean (p − label)². Outside: the mean probability mass outside the "
    "readout's candidates under the whole vocabulary's softmax at the answer position (– where a "
    "run was not made with --record-mass). Intervals: {{level}}% percentile bootstrap, {resamples} "
    "resamples, seed {seed}, resampling IMAGES (every question of an image together; a record that "
    "names no image counts as an image of its own), the same draws for A, B and the control: "
    "questions about one image are not independent, and resampling them one by one would give "
    "intervals too narrow.")


def _num(value) -> str:
    return NO_ANSWER if value is None else f"{value:.4f}"


def _delta(value, interval) -> str:
    if value is None:
        return NO_ANSWER
    shown = f"{value:+.4f}"
    return shown + (f" [{interval[0]:+.4f}, {interval[1]:+.4f}]" if interval else "")


def _rows(pair: dict) -> tuple[list[list[str]], list[list[str]], list[str]]:
    control, ranking, notes = [], [], []
    for split, table in pair["splits"].items():
        for name, r in table.items():
            s = r.get("bias")
            if s is None:
                continue
            left = s["excluded"]
            for side in ("a", "b"):
                if left[side]:
                    why = ", ".join(f"{REASON_TEXT.get(k, k)} {v}" for k, v in left[side].items())
                    notes.append(f"{split}, {name}: {side.upper()} has no margin for "
                                 f"{sum(left[side].values())} question(s) ({why}), left out of "
                                 "these statistics.")
            if not s["n"]:
                continue
            head = [split, name, f"{s['n']} ({s['images']} images)"]
            a, b, c, d, ci = s["a"], s["b"], s["control"], s["delta"], s["delta_ci95"]
            control.append(head + [
                f"{a['yes_rate']:.4f} → {b['yes_rate']:.4f}", _delta(d["yes_rate"], ci["yes_rate"]),
                _num(a["f1"]), _num(b["f1"]), _num(c["f1"]),
                _num(b["accuracy"]), _num(c["accuracy"]),
                _delta(s["beyond_control"]["f1"], s["beyond_control_ci95"]["f1"]), s["gain"]])
            ranking.append(head + [
                _num(a["auroc"]), _num(b["auroc"]), _delta(d["auroc"], ci["auroc"]),
                _num(a["auprc"]), _num(b["auprc"]), _delta(d["auprc"], ci["auprc"]),
                _num(a["ece"]), _num(b["ece"]), _delta(d["ece"], ci["ece"]),
                _num(a["brier"]), _num(b["brier"]), _delta(d["brier"], ci["brier"]),
                _num(a["outside"]), _num(b["outside"]), _delta(d["outside"], ci["outside"])])
    return control, ranking, notes


CONTROL_COLUMNS = ("split", "readout", "n", "yes-rate A → B", "Δ yes-rate [CI]", "F1 A", "F1 B",
                   "F1 control", "acc B", "acc control", "F1 B − control [CI]", "gain")
RANKING_COLUMNS = ("split", "readout", "n", "AUROC A", "AUROC B", "ΔAUROC [CI]", "AUPRC A",
                   "AUPRC B", "ΔAUPRC [CI]", "ECE A", "ECE B", "ΔECE [CI]", "Brier A", "Brier B",
                   "ΔBrier [CI]", "outside A", "outside B", "Δoutside [CI]")


def format_bias(result: dict, title) -> str:
    """The section's markdown ("" where no pair holds a logit readout's bias statistics);
    `title(pair)` names a pair as the rest of the output does."""
    blocks = []
    for pair in result["pairs"]:
        control, ranking, notes = _rows(pair)
        if not (control or notes):
            continue
        blocks.append(f"### {title(pair)}")
        if pair["mismatches"]:
            blocks.append("> **MISMATCHED RUNS** (compared with --allow-mismatch): "
                          + "; ".join(pair["mismatches"]))
        if control:
            blocks += [markdown_table(list(CONTROL_COLUMNS), control),
                       markdown_table(list(RANKING_COLUMNS), ranking)]
        blocks += notes
    if not blocks:
        return ""
    legend = BIAS_LEGEND.format(level=round(result["level"] * 100), resamples=result["resamples"],
                                seed=result["seed"])
    return "\n\n".join(["## Does the gain survive a yes-bias? Yes-rate, a matched threshold, "
                        "AUROC, calibration",
                        legend, *blocks])
