"""What each figure of `pope-fast report` shows: its numbers (the JSON written beside its PNG) and
its caption.

Every number comes from `score_records`, called as `pope-fast score` calls it, or from compare.json
as `pope-fast compare` wrote it, so a figure's JSON equals the output it was drawn from.
"""
from __future__ import annotations

from ..attention_stats import layer_mean
from ..benchmarks.score import OFFICIAL, metric
from ..compare import silent_sides
from ..readouts import NO, YES
from ..records import RecordSet
from ..score import predictions, run_entries
from .compare_format import MCNEMAR_LEGEND
from .tables import INCOMPLETE, asked_note, f1_tables, group_name, row_labels

TOP_TOKENS = 20  # most frequent first tokens drawn; each readout's own ids are drawn as well
# the paper's Fig. 2: the widely copied ids, the recommended rule
PAPER_PAIR = ("legacy_2tok", "template_aware")
PAPER_SPLIT = "adversarial"


def _base(run: dict) -> dict:
    keys = ("source", "dataset", "split", "pooled", "n", "asked", "errors")
    return {k: run[k] for k in keys if k in run}


def _scored(run: dict) -> str:
    errors = f"; {run['errors']} error records left out" if run.get("errors") else ""
    return f"n={run['n']}{asked_note(run)}{f' ({INCOMPLETE})' if run.get('asked') else ''}{errors}"


def confusion(run: dict) -> tuple[dict, str]:
    data = {**_base(run), "readouts": {n: {k: m[k] for k in ("tp", "tn", "fp", "fn", "unknown")}
                                       for n, m in run["readouts"].items()}}
    return data, (f"Confusion matrix of every readout ({_scored(run)}). Rows: the label; columns: "
                  "the readout's answer. Answers that are neither yes nor no (unknown) are counted "
                  "in each panel's title, outside the matrix.")


def f1(run: dict, seed: int, resamples: int) -> tuple[dict, str]:
    data = {**_base(run), "readouts": {n: {k: m[k] for k in ("f1", "f1_ci95", "unknown")}
                                       for n, m in run["readouts"].items()}}
    return data, (f"F1 of each readout with its bootstrap 95% interval ({resamples} resamples of "
                  f"the questions, seed {seed}; {_scored(run)}). An unknown answer counts as "
                  "wrong, so a readout that answers nothing has F1 0; the number of unknown "
                  "answers is given beside the value.")


def yes_rate(run: dict, records: RecordSet) -> tuple[dict, str]:
    labels = [e.label for e in run_entries(records, run)]
    readouts = {}
    for name, m in run["readouts"].items():
        answered = m["tp"] + m["tn"] + m["fp"] + m["fn"]
        readouts[name] = {"yes_rate": m["yes_rate"] if answered else None,
                          "yes_rate_all": m["yes_rate_all"], "answered": answered,
                          "unknown": m["unknown"]}
    data = {**_base(run), "label_yes_rate": labels.count(YES) / len(labels) if labels else None,
            "readouts": readouts}
    return data, ("Share of yes among each readout's answered predictions, against the labels' "
                  "share (dashed). A readout that answered no question has no yes-rate: it is "
                  "drawn as a hatched grey band (null in the figure's JSON), not as a bar of 0. "
                  "Where some answers are unknown, the number answered is given.")


def first_tokens(run: dict, records: RecordSet) -> tuple[dict, str]:
    """The most frequent first tokens and every readout's ids, each with its token string where the
    run recorded one and the readouts that count it."""
    counts = {int(i): c for i, c in run["first_token_counts"].items()}
    marked = [n for n in run["readouts"] if n in records.token_sets]
    strings = records.meta.get("token_strings") or {}
    ids = list(counts)[:TOP_TOKENS]
    ids += sorted({i for n in marked for i in records.token_sets[n].ids} - set(ids))
    tokens = []
    for i in ids:
        marks = {n: (YES if i in records.token_sets[n].yes_ids else NO) for n in marked
                 if i in records.token_sets[n].ids}
        tokens.append({"id": i, "token": strings.get(str(i)), "count": counts.get(i, 0),
                       "readouts": marks})
    data = {**_base(run), "first_token_counts": run["first_token_counts"],
            "marked_readouts": marked, "tokens": tokens}
    source = ("Token strings as the run's tokenizer writes them (meta.json's token_strings, "
              "recorded for the readouts' candidate ids); any other id is shown by its number."
              if strings else
              "This run's meta.json records no token strings (older runs, imported files): "
              "ids only.")
    return data, (f"How often each token was the greedy first answer token (the {TOP_TOKENS} most "
                  "frequent, then every readout's candidate ids, counted or not); under the bars, "
                  f"the ids each logit readout counts as yes (Y) or no (N). {source}")


def attention(run: dict, records: RecordSet) -> tuple[dict, str]:
    """Each readout's right and wrong answers' image attention (the run's layer mean per question),
    with the d and p that score reports."""
    table = run["image_attention"]
    layers = tuple(table["layers"])
    entries = run_entries(records, run)
    values = [layer_mean(e.image_attention, layers) for e in entries]
    readouts = {}
    for name, stats in table["readouts"].items():
        decided = predictions(records, name, entries)
        answered = [(v, p == e.label) for v, p, e in zip(values, decided, entries)
                    if p in (YES, NO)]
        readouts[name] = {"correct": [v for v, right in answered if right],
                          "wrong": [v for v, right in answered if not right],
                          **{k: stats["correct_vs_wrong"][k]
                             for k in ("mean_difference", "cohens_d", "mann_whitney_p")}}
    data = {**_base(run), "layers": list(layers), "num_layers": table["num_layers"],
            "readouts": readouts}
    first, last = layers
    return data, (f"Image attention at the answer position (mean over layers {first}-{last} of "
                  f"{table['num_layers']}, averaged over heads) of each readout's right and wrong "
                  "answers (boxes: quartiles; whiskers: 1.5 IQR; outliers not drawn; unknown "
                  "answers left out). At the right of each row: Cohen's d (right - wrong, pooled "
                  "sd) and the two-sided Mann-Whitney p (normal approximation, tie-corrected), as "
                  "pope-fast score reports them.")


def _sets_text(records: RecordSet, name: str) -> str:
    s = records.token_sets.get(name)
    if s is None:
        return name
    return (f"{name} (yes {', '.join(map(str, s.yes_ids)) or '-'}; no "
            f"{', '.join(map(str, s.no_ids)) or '-'})")


def _pair_of(run: dict) -> tuple[list[str], bool] | None:
    """The paper's two readouts where the run has both, else the two whose F1 differ most."""
    readouts = run["readouts"]
    if all(n in readouts for n in PAPER_PAIR):
        return list(PAPER_PAIR), True
    names = list(readouts)
    pairs = [(abs(readouts[a]["f1"] - readouts[b]["f1"]), i, j) for i, a in enumerate(names)
             for j, b in enumerate(names) if i < j]
    if not pairs:
        return None
    _, i, j = max(pairs, key=lambda p: (p[0], -p[1], -p[2]))
    return [names[i], names[j]], False


def paper_pairs(scored: list[tuple[dict, RecordSet]]) -> list[tuple[dict, RecordSet, dict, str]]:
    """Per record source and dataset, the paper's Fig. 2 on its adversarial split (else its first):
    two readouts' confusion matrices side by side. (run, records, data, caption) each."""
    chosen: dict[tuple[str, str], tuple[dict, RecordSet]] = {}
    for run, records in scored:
        key = (run["source"], run.get("dataset", ""))
        if key not in chosen or (run["split"] == PAPER_SPLIT
                                 and chosen[key][0]["split"] != PAPER_SPLIT):
            chosen[key] = (run, records)
    out = []
    for run, records in chosen.values():
        pair = _pair_of(run)
        if pair is None or run["n"] == run.get("errors", 0):
            continue
        names, paper = pair
        data = {**_base(run), "readouts": {
            n: {k: run["readouts"][n][k] for k in ("tp", "tn", "fp", "fn", "unknown", "f1")}
            for n in names}}
        why = ("the paper's pair" if paper else
               f"the two readouts whose F1 differ most here ({' and '.join(PAPER_PAIR)} are not "
               "both supplied)")
        caption = (f"The paper's Fig. 2 on {group_name(run)} ({_scored(run)}): one answer position "
                   f"read by {_sets_text(records, names[0])} and by "
                   f"{_sets_text(records, names[1])}, {why}. Rows: the label; columns: the answer.")
        out.append((run, records, data, caption))
    return out


def f1_grid(runs: list[dict]) -> tuple[dict, str]:
    """Every model's F1 per readout in each dataset and split, as tables.md has them (None for "-"):
    per group, the readouts some model supplies there, and a row for every model."""
    # the rows of f1_tables, by the same names
    models = list(dict.fromkeys(row_labels(runs).values()))
    data = {"groups": [], "models": models, "readouts": {}, "f1": {}, "best": {}}
    for table in f1_tables(runs):
        group, rows = table["group"], {row["model"]: row for row in table["rows"]}
        cells = {m: dict(zip(table["readouts"], zip(rows[m]["values"], rows[m]["best"])))
                 for m in rows}
        data["groups"].append(group)
        data["readouts"][group] = table["readouts"]
        data["f1"][group] = [[cells.get(m, {}).get(n, (None,))[0] for n in table["readouts"]]
                             for m in models]
        data["best"][group] = [[cells.get(m, {}).get(n, (None, False))[1]
                                for n in table["readouts"]] for m in models]
    labels = row_labels(runs)
    stopped = [f"{labels[r['source']]}, {group_name(r)}: {r['n']}{asked_note(r)}"
               for r in runs if r.get("asked")]
    return data, ("F1 of every model (rows) under every readout (columns), a panel per dataset and "
                  "split, the numbers of tables.md (here at full precision). Bold: the model's "
                  "best readout in that split; grey \"-\": a readout the model's records cannot "
                  "supply, a split with no answered question, or a readout that answered no "
                  "question (\"–\" in the tables: every answer unknown)."
                  + (f" INCOMPLETE RUNS (stopped part way, partial F1): {'; '.join(stopped)}."
                     if stopped else ""))


def delta_f1(pair: dict, result: dict, labels: tuple[str, str], where: str) -> tuple[dict, str]:
    """One pair of compare.json: ΔF1 per split and readout with its paired interval and
    McNemar's p."""
    # a readout that answered no question in A or B has no ΔF1: not drawn, its panel row says
    # which run
    keys = ("f1_a", "f1_b", "delta_f1", "delta_f1_ci95", "mcnemar_p")
    splits = {split: {n: {k: r[k] for k in keys} for n, r in table.items() if not silent_sides(r)}
              for split, table in pair["splits"].items()}
    silent = {split: {n: side for n, r in table.items() if (side := silent_sides(r))}
              for split, table in pair["splits"].items()}
    readouts = list(dict.fromkeys([*pair["readouts"],
                                   *(n for t in pair["splits"].values() for n in t)]))
    data = {"compare": where, "a": pair["a"], "b": pair["b"], "method_a": pair["method_a"],
            "method_b": pair["method_b"], "level": result["level"],
            "resamples": result["resamples"], "seed": result["seed"], "readouts": readouts,
            "splits": splits, "no_answers": {s: names for s, names in silent.items() if names},
            "questions": {s: q["compared"] for s, q in pair["questions"].items()}}
    left_out = sorted({f"{n} (no answer in {side})"
                       for names in silent.values() for n, side in names.items()})
    changes = any(r["changes"] for r in pair["ranking"].values())
    flags = "".join(f" {text}" for test, text in (
        (changes, "The ranking of A and B changes with the readout."),
        (left_out, f"Not drawn, every answer unknown in a run: {', '.join(left_out)}."),
        (pair["mismatches"],
         "MISMATCHED RUNS (compared with --allow-mismatch): " + "; ".join(pair["mismatches"])),
        (pair.get("incomplete"), "INCOMPLETE RUNS: " + "; ".join(pair.get("incomplete") or [])))
        if test)
    level = round(result["level"] * 100)
    caption = (f"ΔF1 = F1(B) - F1(A), B {labels[1]} ({pair['method_b']['name']}) against A "
               f"{labels[0]} ({pair['method_a']['name']}), per readout and split, with the paired "
               f"bootstrap {level}% interval ({result['resamples']} resamples, seed "
               f"{result['seed']}; questions resampled jointly) and McNemar's exact p on the "
               f"paired correctness. Green or red: the interval excludes 0. {MCNEMAR_LEGEND} From "
               f"{where}.{flags}")
    return data, caption


def delta_by_readout(pairs: list[tuple[str, dict]]) -> list[tuple[str, dict, str]]:
    """Every compared pair under one readout, a figure per readout that all pairs hold: (readout,
    data, caption), the data shaped as delta_f1's with the pairs ("B vs A") as its rows, so the same
    drawing serves."""
    common = [n for n in pairs[0][1]["readouts"] if all(n in d["readouts"] for _, d in pairs)]
    splits = list(dict.fromkeys(s for _, d in pairs for s in d["splits"]))
    out = []
    for readout in common:
        table = {s: {label: d["splits"][s][readout]
                     for label, d in pairs if readout in d["splits"].get(s, {})}
                 for s in splits}
        sizes = {s: {d["questions"].get(s) for _, d in pairs} - {None} for s in splits}
        silent = {s: {label: side for label, d in pairs
                      if (side := d.get("no_answers", {}).get(s, {}).get(readout))}
                  for s in splits}
        data = {"readout": readout, "readouts": [label for label, _ in pairs], "splits": table,
                "no_answers": {s: labels for s, labels in silent.items() if labels},
                "questions": {s: n.pop() if len(n) == 1 else "varies" for s, n in sizes.items()},
                "pairs": [{"label": label, "compare": d["compare"], "a": d["a"], "b": d["b"]}
                          for label, d in pairs]}
        out.append((readout, data, f"ΔF1 under {readout} for every pair compared on this page "
                                   "(rows), per split, with each pair's paired interval and "
                                   "McNemar's p, as in the pair's own figure: one readout's view "
                                   "of every method (and model) at once."))
    return out


def benchmark_bars(result: dict, benchmark) -> tuple[dict, str]:
    """A benchmark run's official headline metric under every readout, and under each of its tools'
    rules that reports that metric (the official rule always does), from score --benchmark's
    numbers."""
    name = benchmark.rules[OFFICIAL].headline[0]
    # each bar drawn on the official unit; `value` stays as the rule's tool reports it (lmms-eval's
    # fractions)
    bars = [{"name": f"rule: {rule}", "kind": "rule", "value": metric(m, name),
             "factor": benchmark.scale / (benchmark.rules[rule].scale or benchmark.scale)}
            for rule, m in result["rules"].items()]
    bars += [{"name": readout, "kind": "readout", "value": metric(m, name), "factor": 1.0}
             for readout, m in result["readouts"].items()]
    bars = [b for b in bars if isinstance(b["value"], (int, float))]
    data = {"source": result["source"], "benchmark": benchmark.name, "metric": name, "bars": bars,
            "scale": benchmark.scale}
    return data, (f"{benchmark.title}: {name} as its official code computes it, from each "
                  "readout's answers (blue) and from the answer text read by each tool's rule that "
                  "reports it (green; the others' numbers are in the table above). Every readout "
                  "and rule reads the same run's answers.")
