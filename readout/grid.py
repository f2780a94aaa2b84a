"""POPE's datasets and splits as mitigation papers print them (VCD's Table 1 and the papers that
copy it): a row per dataset and split (COCO, A-OKVQA, GQA; random, popular, adversarial each) and
their average, the unweighted mean of the rows, each an answer file of its own (3,000 questions in
POPE). For records that hold more than one dataset (`eval --questions POPE/output`: its 27,000
questions); a dataset's pooled `Overall` is no row of it."""
from __future__ import annotations

from .metrics import answered
from .score import POOLED

DATASET_ORDER = ("coco", "aokvqa", "gqa")  # as POPE's paper and the papers after it print them
SPLIT_ORDER = ("random", "popular", "adversarial")
AVERAGE = "average"
METRICS = ("accuracy", "precision", "recall", "f1", "yes_rate")


def paper_order(groups: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(dataset, split) groups in the papers' order, a dataset or split they do not name after those
    they do (in the order given); pooled groups left out."""
    def rank(names: tuple[str, ...], name: str) -> int:
        return names.index(name) if name in names else len(names)

    kept = [g for g in groups if g[1] != POOLED]
    return sorted(kept, key=lambda g: (rank(DATASET_ORDER, g[0]), rank(SPLIT_ORDER, g[1]),
                                       kept.index(g)))


def mean_of_rows(rows: list[dict]) -> dict:
    """Per metric the mean of the rows' values (a readout's metrics per row); None where a row has
    none (no answer there: no F1, precision, recall or yes-rate)."""
    out = {}
    for name in METRICS:
        values = [r.get(name) for r in rows]
        missing = not rows or any(v is None for v in values)
        out[name] = None if missing else sum(values) / len(values)
    return out


def _shown(metrics: dict) -> dict:
    """A readout's metrics as a row gives them: those of answered questions None if none was."""
    silent = not answered(metrics)
    return {name: None if silent and name != "accuracy" else metrics[name] for name in METRICS}


def score_grids(runs: list[dict]) -> list[dict]:
    """Per source whose scored runs (score_records') hold more than one dataset: a row per dataset
    and split in the papers' order, each readout's metrics in it, and their average (`mean_of_rows`)
    per readout."""
    sources: dict[str, dict[tuple[str, str], dict]] = {}
    for run in runs:
        if not run.get("pooled"):
            sources.setdefault(run["source"], {})[run.get("dataset", ""), run["split"]] = run
    grids = []
    for source, by_group in sources.items():
        if len({dataset for dataset, _ in by_group}) < 2:
            continue
        order = paper_order(list(by_group))
        names = [n for n in by_group[order[0]]["readouts"]
                 if all(n in by_group[g]["readouts"] for g in order)]
        rows = [{"dataset": d, "split": s, "n": by_group[d, s]["n"],
                 "readouts": {n: _shown(by_group[d, s]["readouts"][n]) for n in names}}
                for d, s in order]
        average = {n: mean_of_rows([r["readouts"][n] for r in rows]) for n in names}
        grids.append({"source": source, "rows": rows, AVERAGE: average})
    return grids


def compare_average(pair: dict, groups: dict[str, tuple[str, str]]) -> dict | None:
    """A compared pair's average over its dataset and split groups (`groups`: each column label's
    (dataset, split)), where they hold more than one dataset: per readout the mean F1 and accuracy
    of A and of B and the mean ΔF1, over the groups where both runs answered. No interval: each
    group's paired interval is in its column."""
    order = paper_order(list(groups.values()))
    if len({dataset for dataset, _ in order}) < 2:
        return None
    labels = [next(label for label, g in groups.items() if g == group) for group in order]
    out = {}
    for name in pair["readouts"]:
        tables = [pair["splits"][label].get(name) for label in labels]
        if any(t is None or not answered(t["a"]) or not answered(t["b"]) for t in tables):
            continue
        mean = {f"{m}_{side}": sum(t[side][m] for t in tables) / len(tables)
                for m in ("f1", "accuracy") for side in ("a", "b")}
        out[name] = {**mean, "delta_f1": sum(t["delta_f1"] for t in tables) / len(tables)}
    return {"groups": labels, "readouts": out}
