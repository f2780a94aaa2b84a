"""Runs compared from their folders or files (reading.py reads each): POPE's under every readout
(`compare_runs`, readout/compare.py's comparison), and two runs of one benchmark on its own headline
metrics, under each rule (official first) and under every readout both runs hold (aggregated as the
official code does), with B - A and a paired bootstrap interval.

Runs are paired as readout/compare.py pairs POPE runs (the same questions joined on (dataset, split,
question_id), the same answer settings, or --allow-mismatch); a question with an error record in
either run leaves the pair. POPE's F1 is a function of per-question counts, so readout/compare.py
resamples questions with weights; these metrics are not all per question: MME's acc+ takes an
image's two answers together, HallusionBench's fAcc and qAcc a figure's questions and a question
across figures, AMBER's official numbers are rounded ratios of counters. Where every rule declares
its headline as a function of per-question counts (`Rule.resampled`: AMBER's), questions are
resampled with the weights readout/compare.py draws, for every rule and readout. Otherwise (MME,
HallusionBench) the bootstrap resamples the benchmark's units (Benchmark.unit: MME's image,
HallusionBench's set), the same draws for A and B, and recomputes each rule's own aggregation on
every resample, for the rules only (readouts get A, B and B - A). The interval is the percentile
interval of B - A.
"""
from __future__ import annotations

import numpy as np

from ..cells import markdown_table
from ..compare import (TOO_FEW, compare_records, join_questions, meta_mismatches, run_method,
                       run_readouts)
from ..metrics import resample_weights
from ..data import DataError
from ..records import Entry, RecordSet
from ..score import Unavailable, predictions, question_order
from .base import Answer, Benchmark
from .reading import read_records
from .score import OFFICIAL, metric, run_benchmark

LEVEL = 0.95


def read_runs(paths) -> list[tuple[str, RecordSet]]:
    """Each run's path and records (read_records: ours or another tool's file), baseline first."""
    paths = [str(p) for p in paths]
    if len(paths) < 2:
        raise ValueError(TOO_FEW)
    return [(path, read_records(path)) for path in paths]


def compare_runs(paths, *, seed: int = 0, resamples: int = 1000, allow_mismatch: bool = False,
                 protocol=None) -> dict:
    """`pope-fast compare` of POPE runs: compare_records (readout/compare.py) over the runs at
    `paths`, the first the baseline (A); under a `protocol` (protocols.Protocol), its answer rule
    alone."""
    return compare_records(read_runs(paths), seed=seed, resamples=resamples,
                           allow_mismatch=allow_mismatch, protocol=protocol)


def compare_benchmark_runs(paths: list[str], benchmark: type[Benchmark] | None = None, *,
                           seed: int = 0, resamples: int = 1000,
                           allow_mismatch: bool = False) -> dict:
    """Every run after the first (B, C, ...) against the first (A): {"benchmark", "seed",
    "resamples", "level", "unit", "pairs": [{"a", "b", "method_a", "method_b", "mismatches",
    "questions", "rules": {rule: {metric: {"a", "b", "delta", "delta_ci95"}}}, "readouts": {...},
    "unavailable": {name: why}}]}."""
    runs = read_runs(paths)
    found = {getattr(benchmark or run_benchmark(r), "name", None) for _, r in runs}
    if None in found or len(found) != 1:
        raise DataError("compare --benchmark: the runs are not all of one benchmark "
                        f"({', '.join(p for p, _ in runs)})")
    benchmark = benchmark or run_benchmark(runs[0][1])
    (name_a, a), others = runs[0], runs[1:]
    pairs = [_pair(benchmark, name_a, a, name, run, seed, resamples, allow_mismatch)
             for name, run in others]
    return {"benchmark": benchmark.name, "seed": seed, "resamples": resamples, "level": LEVEL,
            "unit": benchmark.unit_name,
            "pairs": pairs}


def _joined(benchmark, name_a: str, a: RecordSet, name_b: str, b: RecordSet, allow_mismatch: bool):
    groups, question_diffs = join_questions(a, b)
    mismatches = meta_mismatches(name_a, a.meta, name_b, b.meta) + question_diffs
    if mismatches and not allow_mismatch:
        raise ValueError(f"{name_a} vs {name_b}: not a paired comparison "
                         f"({'; '.join(mismatches)}); pass --allow-mismatch to compare them anyway "
                         "(every table is then flagged)")
    joined = sorted((p for (dataset, _), ps in groups.items() if dataset == benchmark.name
                     for p in ps),
                    key=lambda p: (p[0].split, *question_order(p[0])))  # score_run's order
    if not joined:
        raise ValueError(f"{name_a} vs {name_b}: the runs have no {benchmark.name} question in "
                         "common")
    kept = [(ea, eb) for ea, eb in joined if ea.error is None and eb.error is None]
    counts = {"joined": len(joined), "compared": len(kept),
              "errors_a": sum(ea.error is not None for ea, _ in joined),
              "errors_b": sum(eb.error is not None for _, eb in joined)}
    return kept, counts, mismatches, run_method(a.meta), run_method(b.meta)


def _answers(entries: list[Entry], decisions: list[str]) -> list[Answer]:
    return [Answer(e.key, e.split, e.image, e.label, d) for e, d in zip(entries, decisions)]


def _decisions(benchmark, a: RecordSet, b: RecordSet, kept) -> tuple[dict, dict]:
    """{("rules"|"readouts", name): (the rule that aggregates, decisions of A, decisions of B)}, and
    what is unavailable; a readout aggregates as the official rule does."""
    entries_a, entries_b = [ea for ea, _ in kept], [eb for _, eb in kept]
    out, unavailable = {}, {}
    if any(e.decoded is None for e in entries_a + entries_b):
        unavailable.update({name: "a run recorded no answer text" for name in benchmark.rules})
    else:
        for name, rule in benchmark.rules.items():
            out[("rules", name)] = (rule, [rule.read(e.decoded) for e in entries_a],
                                    [rule.read(e.decoded) for e in entries_b])
    official = benchmark.rules[OFFICIAL]
    for name in (n for n in run_readouts(a) if n in run_readouts(b)):
        try:
            out[("readouts", name)] = (official, predictions(a, name, entries_a),
                                       predictions(b, name, entries_b))
        except Unavailable as why:
            unavailable[name] = str(why)
    return out, unavailable


def _headline(aggregate, names, answers: list[Answer]) -> dict:
    """The headline values that are numbers ("-" and None, a metric the answers cannot give, are
    left out)."""
    metrics = aggregate(answers)
    return {n: float(v) for n in names
            if isinstance(v := metric(metrics, n), (int, float)) and not isinstance(v, bool)}


def _per_question(decided: dict, entries: list[Entry], deltas: dict, seed: int,
                  resamples: int) -> None:
    """Every rule's (and readout's) B - A under the per-question draws readout/compare.py makes
    (resample_weights: one set for all), from the rule's `resampled` counts."""
    weights = resample_weights(len(entries), seed, resamples)
    for key, (rule, decided_a, decided_b) in decided.items():
        by_a = rule.resampled(_answers(entries, decided_a), weights)
        by_b = rule.resampled(_answers(entries, decided_b), weights)
        for n, found in deltas[key].items():
            if n in by_a and n in by_b:
                found.extend(float(v) for v in by_b[n] - by_a[n] if not np.isnan(v))


def _per_unit(benchmark, decided: dict, entries: list[Entry], deltas: dict, seed: int,
              resamples: int) -> int:
    """The rules' B - A recomputed by each rule's own aggregation on resampled units (the same draws
    for A and B); returns the number of units. Only the rules: a resample costs an aggregation per
    rule and side (about 6 ms on an MME run of 2,374 answers), and the readouts, ten or more, would
    multiply that."""
    units: dict[str, list[int]] = {}
    template = _answers(entries, ["unknown"] * len(entries))
    for i, answer in enumerate(template):
        units.setdefault(benchmark.unit(answer), []).append(i)
    members = list(units.values())
    resampled = {k: v for k, v in decided.items() if k[0] == "rules"}
    draws = np.random.default_rng(seed).integers(0, len(members), size=(resamples, len(members)))
    for draw in draws:
        # (answer index, its ids in this resample): a unit drawn twice counts twice, with own ids
        picked = [(i, benchmark.copy(template[i], k))
                  for k, unit in enumerate(draw) for i in members[unit]]
        for key, (rule, decided_a, decided_b) in resampled.items():
            got_a = _headline(rule.aggregate, deltas[key],
                              [Answer(c.key, c.split, c.image, c.label, decided_a[i])
                               for i, c in picked])
            got_b = _headline(rule.aggregate, deltas[key],
                              [Answer(c.key, c.split, c.image, c.label, decided_b[i])
                               for i, c in picked])
            for n, found in deltas[key].items():
                if n in got_a and n in got_b:
                    found.append(got_b[n] - got_a[n])
    return len(members)


def _pair(benchmark, name_a, a, name_b, b, seed, resamples, allow_mismatch) -> dict:
    kept, counts, mismatches, method_a, method_b = _joined(benchmark, name_a, a, name_b, b,
                                                           allow_mismatch)
    decided, unavailable = _decisions(benchmark, a, b, kept)
    entries = [ea for ea, _ in kept]
    values, deltas = {}, {}
    for key, (rule, decided_a, decided_b) in list(decided.items()):
        try:
            value_a = _headline(rule.aggregate, rule.headline, _answers(entries, decided_a))
            value_b = _headline(rule.aggregate, rule.headline, _answers(entries, decided_b))
        # the tool's formula cannot take these answers (an MME image with one answer)
        except ValueError as err:
            unavailable[key[1]] = str(err)
            del decided[key]
            continue
        values[key], deltas[key] = (value_a, value_b), {n: [] for n in value_a if n in value_b}
    if all(rule.resampled is not None for rule in benchmark.rules.values()):
        _per_question(decided, entries, deltas, seed, resamples)
        units = len(entries)
    else:
        units = _per_unit(benchmark, decided, entries, deltas, seed, resamples)
    pair = {"a": name_a, "b": name_b, "method_a": method_a, "method_b": method_b,
            "mismatches": mismatches, "questions": {**counts, "units": units}, "rules": {},
            "readouts": {}, "unavailable": unavailable}
    tail = (1 - LEVEL) / 2
    for (where, name), (value_a, value_b) in values.items():
        pair[where][name] = {
            n: {"a": value_a[n], "b": value_b[n], "delta": value_b[n] - value_a[n],
                "delta_ci95": ([float(q) for q in np.quantile(found, [tail, 1 - tail])]
                               if found else None)}
            for n, found in deltas[(where, name)].items()}
    return pair


def format_benchmark_compare(result: dict) -> str:
    """Per pair, one markdown table: each rule's headline metrics (official first), then each
    readout's under the official aggregation, with A, B, B - A and its interval."""
    level = round(result["level"] * 100)
    blocks = [f"## {result['benchmark']}: B - A on its own metrics",
              f"Intervals: paired bootstrap over the benchmark's units ({result['unit']}), "
              f"{level}%, {result['resamples']} resamples, seed {result['seed']}; every rule "
              "recomputed on each resample."]
    for pair in result["pairs"]:
        q = pair["questions"]
        errors = q['errors_a'] + q['errors_b']
        blocks.append(f"### A `{pair['a']}` ({pair['method_a'].get('name')}) vs B `{pair['b']}` "
                      f"({pair['method_b'].get('name')}): {q['compared']} questions, "
                      f"{q['units']} units"
                      + (f", {errors} error records left out" if errors else ""))
        rows = []
        for where, label in (("rules", "rule"), ("readouts", "readout (official aggregation)")):
            for name, metrics in pair[where].items():
                for n, m in metrics.items():
                    low_high = m["delta_ci95"]
                    ci = "-" if low_high is None else f"[{low_high[0]:+.4g}, {low_high[1]:+.4g}]"
                    rows.append([f"{label} `{name}`", n, f"{m['a']:.6g}", f"{m['b']:.6g}",
                                 f"{m['delta']:+.6g}", ci])
        header = ["scored by", "metric", "A", "B", "B - A", f"{level}% interval"]
        blocks.append(markdown_table(header, rows))
        blocks += [f"! {m}" for m in pair["mismatches"]]
        blocks += [f"unavailable: {n} ({why})" for n, why in pair["unavailable"].items()]
    return "\n\n".join(blocks)
