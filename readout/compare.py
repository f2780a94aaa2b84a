"""Paired comparison of runs: a baseline and the methods (or models) run on the same questions,
under every readout both runs supply.

Questions are joined on (dataset, split, question_id), never by position; a question that got no
answer in either run (an error record) leaves the pair, and the counts say how many. Decisions come
from `score.predictions`, so each run's metrics are the ones `pope-fast score` reports for the
questions compared. Differences are B - A, with a paired percentile bootstrap (questions resampled
jointly, drawn as `metrics.bootstrap_f1_ci` draws them; one set of resamples per split, shared by
every readout and every metric) and McNemar's exact test on the paired correctness. Every logit
readout also gets bias.py's statistics (yes-rate shift, the yes-rate-matched control, AUROC,
calibration), their intervals drawn by image.

Two runs are comparable when everything that decides an answer, except the method, is the same:
dtype, quantization, image preprocessing, template, token sets, continuation lengths, question set
and library versions. The checkpoint is not on that list: comparing two models of one family (a 7B
and a 13B, a fine-tune) under a fixed readout and precision is a legitimate use, so differing model
files are reported (`same_model`), not refused. Different families differ in template or token sets
anyway.
"""
from __future__ import annotations


import numpy as np

from .bias import bias_statistics, cluster_weights, image_clusters
from .grid import compare_average
from .metrics import answered, mcnemar_exact, ratios, resample_weights, summarize
from .readouts import LOGIT, NO, READOUTS, UNKNOWN, YES
from .records import Entry, RecordSet
from .score import POOLED, Unavailable, predictions, question_order, unknown_reasons
from .tool_steps import TOOL_STEPS

LEVEL = 0.95
DELTAS = ("f1", "precision", "recall", "accuracy", "yes_rate")
# Settings that decide an answer; the rest (device, kernels, batch sizes, prefix reuse, packed or
# dequantized NF4, the probe) change how it is computed, not what is computed.
ANSWER_SETTINGS = ("resolved_dtype", "quant", "quantize_lm_head", "image_aspect", *TOOL_STEPS)
SHOWN = 3  # examples named per kind of question-set difference
TOO_FEW = "compare needs a baseline run and at least one run to compare with it"


def leaf_differences(a, b, first: str, second: str, width: int = 40, name: str = "") -> list[str]:
    """'name: A-value {first}, B-value {second}' for every leaf where two nested dicts differ (their
    dotted key paths, sorted), each value's repr cut to `width` characters."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in leaf_differences(a.get(k), b.get(k), first, second, width,
                                          f"{name}.{k}" if name else str(k))]
    if a == b:
        return []
    start = 0
    if isinstance(a, str) and isinstance(b, str):  # two long texts: from a little before they part
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        start = max(0, at - width // 4)
    short = [("..." if start else "")
             + (text if len(text := repr(v[start:] if start else v)) <= width
                else text[:width - 3] + "...") for v in (a, b)]
    return [f"{name}: {short[0]} {first}, {short[1]} {second}"]


def compare_records(runs: list[tuple[str, RecordSet]], *, seed: int = 0, resamples: int = 1000,
                    allow_mismatch: bool = False, protocol=None) -> dict:
    """Compare every run after the first (B, C, ...) with the first (A), each given as (its name,
    its records): per pair, split and readout, both runs' metrics, B - A with bootstrap intervals,
    McNemar's p and the answers flipped from A to B.

    Runs that differ in more than their method raise ValueError naming each difference; with
    allow_mismatch they are compared on the questions both hold (with the same label) and each pair
    lists its differences under "mismatches". Under a `protocol` (protocols.Protocol): its answer
    rule alone, an unknown answer counted as the protocol counts it (VLMEvalKit: a no).
    """
    if len(runs) < 2:
        raise ValueError(TOO_FEW)
    (name_a, a), others = runs[0], runs[1:]
    pairs = [_pair(name_a, a, name, run, seed, resamples, allow_mismatch, protocol)
             for name, run in others]
    return {"seed": seed, "resamples": resamples, "level": LEVEL, "pairs": pairs,
            **({"protocol": protocol.name} if protocol else {})}


def _pair(name_a: str, a: RecordSet, name_b: str, b: RecordSet, seed: int, resamples: int,
          allow_mismatch: bool, protocol=None) -> dict:
    groups, question_diffs = join_questions(a, b)
    groups = _with_pooled(groups)
    mismatches = meta_mismatches(name_a, a.meta, name_b, b.meta) + question_diffs
    if mismatches and not allow_mismatch:
        raise ValueError(f"{name_a} vs {name_b}: not a paired comparison "
                         f"({'; '.join(mismatches)}); pass --allow-mismatch to compare them anyway "
                         "(every table is then flagged)")
    if not groups:
        raise ValueError(f"{name_a} vs {name_b}: the runs have no question in common")
    names = [n for n in run_readouts(a)
             if n in run_readouts(b) and (protocol is None or n == protocol.readout)]
    one_dataset = len({dataset for dataset, _ in groups}) == 1
    splits, questions, unavailable, labelled = {}, {}, {}, {}
    for (dataset, split), joined in groups.items():
        label = split if one_dataset or not dataset else f"{dataset} {split}"
        labelled[label] = (dataset, split)
        splits[label], questions[label], missing = _split(a, b, joined, names, seed, resamples,
                                                          protocol)
        if missing:
            unavailable[label] = missing
    pair = {"a": name_a, "b": name_b, "method_a": run_method(a.meta),
            "method_b": run_method(b.meta), "same_model": _same_model(a.meta, b.meta),
            "mismatches": mismatches, "readouts": names, "splits": splits, "questions": questions,
            "ranking": {s: _ranking(t) for s, t in splits.items()}}
    if unavailable:
        pair["unavailable"] = unavailable
    # several datasets: their splits' mean, as papers print POPE
    average = compare_average(pair, labelled)
    if average is not None:
        pair["average"] = average
    incomplete = _incomplete("A", a) + _incomplete("B", b)
    if incomplete:
        pair["incomplete"] = incomplete
    return pair


def _incomplete(which: str, records: RecordSet) -> list[str]:
    """'A: adversarial 36 of 48' for each split a run's meta.json asked more of than it recorded."""
    asked = records.meta.get("questions") or {}
    counts: dict[str, int] = {}
    for e in records.entries:
        name = f"{e.dataset}/{e.split}" if e.dataset else e.split
        counts[name] = counts.get(name, 0) + 1
    return [f"{which}: {name} {counts[name]} of {n}" for name, n in asked.items()
            if isinstance(n, int) and counts.get(name, 0) < n and name in counts]


def run_method(meta: dict) -> dict:
    """The method that made a run; runs from before methods existed are the baseline."""
    return meta.get("method") or {"name": "none"}


def _same_model(meta_a: dict, meta_b: dict) -> bool | None:
    """Whether both runs read the same checkpoint bytes; None where a run does not record them."""
    files_a, files_b = ((m.get("model") or {}).get("files") for m in (meta_a, meta_b))
    return None if not files_a or not files_b else files_a == files_b


def run_readouts(run: RecordSet) -> list[str]:
    """The readouts a run was made with (every readout for an imported file, whose stored
    predictions say which it has), in registry order."""
    made = run.meta.get("readouts")
    return [n for n in READOUTS if n in made] if isinstance(made, list) else list(READOUTS)


# --- what makes two runs a pair ---

def _no_meta(meta: dict) -> str:
    if meta.get("imported_from"):
        return ("is an imported ugaa-research record file: it has no meta.json, so its dtype, "
                "quantization, template, token sets and library versions cannot be checked")
    if not meta:
        return ("has no meta.json, so its dtype, quantization, template, token sets and library "
                "versions cannot be checked")
    return ""


def _fingerprint(meta: dict, other: dict) -> dict:
    """What must be equal for two runs to be a pair; token sets and continuation lengths only of the
    readouts both runs have."""
    settings = meta.get("settings") or {}

    def shared(key):
        return {n: v for n, v in (meta.get(key) or {}).items() if n in (other.get(key) or {})}

    versions = (meta.get("tokenizer") or {}).get("library_versions")
    return {"settings": {k: settings.get(k) for k in ANSWER_SETTINGS},
            "template": meta.get("template"), "token_sets": shared("token_sets"),
            "generation": shared("generation"),
            "tokenizer": {"library_versions": versions}}


def meta_mismatches(name_a: str, meta_a: dict, name_b: str, meta_b: dict) -> list[str]:
    missing = [f"{name} {_no_meta(meta)}" for name, meta in ((name_a, meta_a), (name_b, meta_b))
               if _no_meta(meta)]
    if missing:
        return missing
    return leaf_differences(_fingerprint(meta_a, meta_b), _fingerprint(meta_b, meta_a),
                            "in A", "in B", width=60)


def _keyed(run: RecordSet, other: RecordSet) -> dict[tuple[str, str, str], Entry]:
    """A run's entries by key. A run that names no dataset (a published file, records from before
    datasets were named) is taken to be of the other run's dataset where that run has only one."""
    datasets, others = {e.dataset for e in run.entries}, {e.dataset for e in other.entries}
    dataset = next(iter(others)) if datasets == {""} and len(others) == 1 else None
    return {(e.dataset if dataset is None else dataset, e.split, e.key): e for e in run.entries}


def _where(key: tuple[str, str, str]) -> str:
    dataset, split, qid = key
    return f"{dataset + ' ' if dataset else ''}{split} #{qid}"


def _listed(what: str, items: list[str]) -> list[str]:
    """'<n> questions <what> (first examples)', or nothing."""
    if not items:
        return []
    more = ", ..." if len(items) > SHOWN else ""
    plural = "s" if len(items) > 1 else ""
    return [f"{len(items)} question{plural} {what} ({', '.join(items[:SHOWN])}{more})"]


def join_questions(a: RecordSet, b: RecordSet
                   ) -> tuple[dict[tuple[str, str], list[tuple[Entry, Entry]]], list[str]]:
    """The questions both runs hold with the same label, grouped by (dataset, split) in A's order
    and in question order within, and every difference between the two question sets (a text or an
    image name counts where both records keep it)."""
    in_a, in_b = _keyed(a, b), _keyed(b, a)
    both = [k for k in in_a if k in in_b]
    diffs = _listed("only in A", [_where(k) for k in in_a if k not in in_b])
    diffs += _listed("only in B", [_where(k) for k in in_b if k not in in_a])
    for field in ("label", "text", "image"):
        differ = [k for k in both if None not in (getattr(in_a[k], field), getattr(in_b[k], field))
                  and getattr(in_a[k], field) != getattr(in_b[k], field)]
        diffs += _listed(f"with another {field}",
                         [f"{_where(k)}: {getattr(in_a[k], field)!r} in A, "
                          f"{getattr(in_b[k], field)!r} in B" for k in differ])
    groups: dict[tuple[str, str], list[tuple[Entry, Entry]]] = {}
    for k in both:
        if in_a[k].label == in_b[k].label:  # another label is another question: never paired
            groups.setdefault(k[:2], []).append((in_a[k], in_b[k]))
    for joined in groups.values():
        joined.sort(key=lambda pair: question_order(pair[0]))
    return groups, diffs


def _with_pooled(groups: dict[tuple[str, str], list]) -> dict[tuple[str, str], list]:
    """After each dataset's splits, where it has several, those splits pooled (`Overall`), in the
    order `score` pools them (split name, then question): the pooled ΔF1 has its own paired
    interval."""
    splits: dict[str, list[str]] = {}
    for dataset, split in groups:
        splits.setdefault(dataset, []).append(split)
    out = {}
    for dataset, names in splits.items():
        out.update({(dataset, s): groups[(dataset, s)] for s in names})
        if len(names) > 1 and POOLED not in names:
            out[(dataset, POOLED)] = [pair for s in sorted(names) for pair in groups[(dataset, s)]]
    return out


# --- the paired statistics of one split ---

def _split(a: RecordSet, b: RecordSet, joined: list[tuple[Entry, Entry]], names: list[str],
           seed: int, resamples: int, protocol=None) -> tuple[dict, dict, dict]:
    kept = [(ea, eb) for ea, eb in joined if ea.error is None and eb.error is None]
    counts = {"joined": len(joined), "compared": len(kept),
              "errors_a": sum(ea.error is not None for ea, _ in joined),
              "errors_b": sum(eb.error is not None for _, eb in joined)}
    if not kept:
        return {}, counts, {}
    entries_a, entries_b = [ea for ea, _ in kept], [eb for _, eb in kept]
    labels = [e.label for e in entries_a]
    weights = resample_weights(len(kept), seed, resamples)
    by_image = None  # the bias statistics' resamples, images drawn: made once a logit readout asks
    table, unavailable = {}, {}
    for name in names:
        try:
            decided_a = _decided(a, name, entries_a, "A", protocol)
            decided_b = _decided(b, name, entries_b, "B", protocol)
        except Unavailable as why:
            unavailable[name] = str(why)
            continue
        table[name] = _readout(labels, decided_a, decided_b, weights, seed, resamples)
        # the unknown answers' reasons, as score counts them
        table[name]["a"]["unknown_reasons"] = unknown_reasons(a, name, entries_a)
        table[name]["b"]["unknown_reasons"] = unknown_reasons(b, name, entries_b)
        if READOUTS[name].kind == LOGIT:
            if by_image is None:
                by_image = cluster_weights(image_clusters(entries_a), seed, resamples)
            table[name]["bias"] = bias_statistics(labels, entries_a, a.token_sets.get(name),
                                                  entries_b, b.token_sets.get(name), by_image)
    return table, counts, unavailable


def _decided(run: RecordSet, name: str, entries: list[Entry], side: str,
             protocol=None) -> list[str]:
    """A readout's decisions of one side, as a protocol counts them where one is given: an unknown
    as a no (VLMEvalKit), or each answer by its label (VCD's `counted`)."""
    try:
        decided = predictions(run, name, entries)
        if protocol is not None and protocol.counted is not None:
            return protocol.counted_answers(entries)
    except Unavailable as why:
        raise Unavailable(f"{side} ({run.source}): {why}") from None
    if protocol is not None and protocol.unknown_is_no:
        return [NO if d == UNKNOWN else d for d in decided]
    return decided


def _readout(labels: list[str], decided_a: list[str], decided_b: list[str], weights: np.ndarray,
             seed: int, resamples: int) -> dict:
    metrics_a = summarize(labels, decided_a, seed=seed, resamples=resamples)
    metrics_b = summarize(labels, decided_b, seed=seed, resamples=resamples)
    delta = {m: metrics_b[m] - metrics_a[m] for m in DELTAS}  # full precision: tables round them
    intervals = delta_intervals(labels, decided_a, decided_b, weights)
    return {"f1_a": metrics_a["f1"], "f1_b": metrics_b["f1"], "delta_f1": delta["f1"],
            "delta_f1_ci95": intervals["f1"],
            "mcnemar_p": mcnemar_exact(labels, decided_a, decided_b),
            "flips": {"yes_to_no": sum(x == YES and y == NO for x, y in zip(decided_a, decided_b)),
                      "no_to_yes": sum(x == NO and y == YES for x, y in zip(decided_a, decided_b))},
            "a": metrics_a, "b": metrics_b, "delta": delta, "delta_ci95": intervals}


def resampled_metrics(labels: list[str], decided: list[str],
                      weights: np.ndarray) -> dict[str, np.ndarray]:
    """Each metric of `summarize` under every resample (unknown answers out of the confusion matrix,
    accuracy over all questions)."""
    y = np.array([label == YES for label in labels])
    yes = np.array([d == YES for d in decided])
    no = np.array([d == NO for d in decided])
    tp, fp = weights @ (yes & y), weights @ (yes & ~y)
    fn, tn = weights @ (no & y), weights @ (no & ~y)
    return {"f1": ratios(2 * tp, 2 * tp + fp + fn), "precision": ratios(tp, tp + fp),
            "recall": ratios(tp, tp + fn), "accuracy": ratios(tp + tn, weights.sum(axis=1)),
            "yes_rate": ratios(tp + fp, tp + fp + fn + tn)}


def delta_intervals(labels: list[str], decided_a: list[str], decided_b: list[str],
                    weights: np.ndarray) -> dict[str, list[float]]:
    """Percentile interval of each metric's B - A over the paired resamples."""
    by_a = resampled_metrics(labels, decided_a, weights)
    by_b = resampled_metrics(labels, decided_b, weights)
    tail = (1 - LEVEL) / 2
    return {m: [float(q) for q in np.quantile(by_b[m] - by_a[m], [tail, 1 - tail])] for m in DELTAS}


def silent_sides(r: dict) -> str | None:
    """"A", "B" or "A and B": the runs of a compared readout that answered no question (every answer
    unknown, as when a method's cut removed every candidate), whose F1 is no F1 and whose ΔF1 is no
    effect; None if both did."""
    silent = [side for side in ("a", "b") if not answered(r[side])]
    return " and ".join(side.upper() for side in silent) or None


def _ranking(table: dict) -> dict:
    """Whether A vs B rank the same under every readout of a split. The ranking changes when ΔF1 is
    positive under one readout and negative under another, or when its interval excludes 0 under
    some readouts and not others (a zero ΔF1 has no sign). A readout that answered no question in A
    or in B does not count (`no_answers`: which run it was silent in): its ΔF1 compares an F1 with
    nothing."""
    no_answers = {n: side for n, r in table.items() if (side := silent_sides(r))}
    counted = {n: r for n, r in table.items() if n not in no_answers}
    positive = [n for n, r in counted.items() if r["delta_f1"] > 0]
    negative = [n for n, r in counted.items() if r["delta_f1"] < 0]
    excludes = [n for n, r in counted.items()
                if r["delta_f1_ci95"][0] > 0 or r["delta_f1_ci95"][1] < 0]
    return {"changes": bool(positive and negative) or 0 < len(excludes) < len(counted),
            "positive": positive, "negative": negative, "excludes_zero": excludes,
            "no_answers": no_answers}


# --- rendering ---
