"""The benchmark's markdown report."""
from __future__ import annotations


def format_report(report: dict) -> str:
    """The markdown table printed at the end of a run."""
    lines = [f"device: {report['device']}; size: {report['size']}", "",
             "| model | questions | pope-fast q/s | pope-fast s | reference q/s | reference s "
             "| speedup | agreement (min over readouts) | peak MB (ours / ref) "
             "| phases s (encode / prefix / questions / decode) | floor s (ratio) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in report["models"].items():
        ours, ref = e["pope_fast"], e.get("reference")
        p = ours["phases_s"]
        phases = " / ".join(f"{p[k]:.2f}" for k in ("image_encode", "prefix_prefill",
                                                     "question_prefill", "decode"))
        floor = f"{ours['floor_s']} ({ours['ratio_to_floor']}×)" if "floor_s" in ours else "-"
        if ref:
            ref_s = (f"{ref['extrapolated_wall_s']}"
                     + (f" (from {ref['questions']})" if ref["sampled"] else ""))
            worst = min(e["agreement"], key=e["agreement"].get)
            agree = f"{e['agreement'][worst]:.4f} ({worst})"
            cols = [f"{ref['questions_per_s']}", ref_s, f"{e['speedup']}×", agree,
                    f"{ours['peak_memory_mb']:.0f} / {ref['peak_memory_mb']:.0f}"]
        else:
            why = e.get("reference_unavailable", "-")
            cols = [why, "-", "-", "-", f"{ours['peak_memory_mb']:.0f} / -"]
        lines.append(f"| {name} ({e['size']}) | {ours['questions']} "
                     f"({ours['unique_prompts']} prompts) | {ours['questions_per_s']} "
                     f"| {ours['wall_s']} | " + " | ".join(cols) + f" | {phases} | {floor} |")
    floored = [e["pope_fast"] for e in report["models"].values() if "floor_s" in e["pope_fast"]]
    if floored:
        rate = floored[0]
        lines += ["", "floor s: the time the sweep's unavoidable matmul FLOPs would take at this "
                      f"device's own measured matmul rate ({rate['device_tflops']} TFLOP/s, "
                      f"{rate['device_rate']}); the ratio is the wall time over it (1 / the "
                      "model-FLOP utilization: 1× would be every cycle a useful matmul)"]
    paired = [(name, e["pope_fast"]["paired"]) for name, e in report["models"].items()
              if "paired" in e["pope_fast"]]
    if paired:
        lines += ["", "paired methods: one sweep of all of them, cold, against the baseline "
                      "sweep above", "",
                  "| model | methods | s | vs baseline | images encoded | prompts "
                  "| prefix tokens |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {name} | {' + '.join(p['methods'])} | {p['wall_s']} | {p['vs_baseline']}× | "
                  f"{p['counts']['images_encoded']} | {p['counts']['prompts']} "
                  f"| {p['counts']['prefix_tokens']} |"
                  for name, p in paired]
    ranked = [(name, e["pope_fast"]) for name, e in report["models"].items()
              if "ranks" in e["pope_fast"]]
    if ranked:
        lines += ["", "torchrun: each rank's share; the row above is all of them (all questions "
                      "over the slowest rank's wall time)", "",
                  "| model | rank | questions | q/s | s | peak MB |", "|---|---|---|---|---|---|"]
        for name, ours in ranked:
            lines += [f"| {name} | {r['rank']} | {r['questions']} ({r['unique_prompts']} prompts) "
                      f"| {r['questions_per_s']} | {r['wall_s']} | {r['peak_memory_mb']:.0f} |"
                      for r in ours["ranks"]]
            lines.append(f"| {name} | all {len(ours['ranks'])} | {ours['questions']} "
                         f"| {ours['questions_per_s']} | {ours['wall_s']} "
                         f"| {ours['peak_memory_mb']:.0f} |")
    return "\n".join(lines)
