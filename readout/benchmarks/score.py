"""A benchmark's numbers from a pope-fast run or from another tool's result file, under every rule.

From a run: each of the benchmark's rules reads the recorded answer text (the run's longest
continuation) and aggregates as its tool does; every readout the records supply (logit readouts,
first token, the text rules of readout/readouts.py) is aggregated with the benchmark's official
formula. From a result file: the texts it holds, under each rule. Either way every number is the
aggregation of yes/no/unknown decisions, so two rules that disagree on one answer text show it here.
"""
from __future__ import annotations

from pathlib import Path

from . import REGISTRY, detect_benchmark, get_benchmark
from ..data import DataError
from ..readouts import READOUTS
from ..records import META_FILE, RECORDS_FILE, Entry, RecordSet, rank_parts, read_meta
from ..cells import csv_text, markdown_table
from ..score import (Unavailable, answer_position_method, predictions, question_order, reason_lines,
                     unknown_reasons)
from .base import Answer, Benchmark, Response
from .reading import read_records

OFFICIAL = "official"


def _answers(entries: list[Entry], decisions: list[str]) -> list[Answer]:
    return [Answer(e.key, e.split, e.image, e.label, d) for e, d in zip(entries, decisions)]


def score_run(records: RecordSet, benchmark: type[Benchmark],
              readouts: list[str] | None = None) -> dict:
    """{"source", "benchmark", "n", "errors", "rules": {rule: metrics}, "readouts": {readout:
    metrics}, "unavailable": {name: why}, "checks": [...]} over the records of the benchmark's
    dataset, and where a logit readout could not decide some answers, "unknown_reasons": {readout:
    {reason: count}}; error records (no answer) are left out and counted."""
    mine = sorted((e for e in records.entries if e.dataset == benchmark.name),
                  key=lambda e: (e.split, *question_order(e)))
    if not mine:
        found = sorted({e.dataset or "(none)" for e in records.entries})
        raise DataError(f"{records.source}: no {benchmark.name} records "
                        f"(datasets here: {', '.join(found)})")
    answered = [e for e in mine if e.error is None]
    out = {"source": records.source, "benchmark": benchmark.name, "n": len(mine),
           "errors": len(mine) - len(answered), "rules": {}, "readouts": {}, "unavailable": {},
           "checks": []}
    texts = [e.decoded for e in answered]
    # eval --protocol TOOL: TOOL's prompt
    asked = (records.meta.get("benchmark_prompt") or {}).get("rule")
    out["notes"] = [_asked_note(asked, records.meta["benchmark_prompt"])] if asked else []
    if any(t is None for t in texts):
        method = answer_position_method(records.meta)
        why = (f"every rule reads answer text, which the run of method {method} does not record: "
               "it is scored under the answer position's logit and first-token readouts, each "
               f"under {benchmark.short_name}'s official formula" if method
               else "the run recorded no answer text (run with a text readout)")
        out["unavailable"].update({name: why for name in benchmark.rules})
    else:
        for name, rule in benchmark.rules.items():
            _aggregate(out, "rules", name, rule.aggregate,
                       _answers(answered, [rule.read(t) for t in texts]))
            if rule.prompt is not None and name != asked:
                what = (f"{asked}'s prompt" if asked
                        else "the benchmark's question as the data has it")
                out["checks"].append(f"{name} asks its own prompt; this run asked {what}, so these "
                                     "are its rule's reading of this run's answers")
    if asked:
        out["checks"].append(f"this run asked {asked}'s prompt: the other rules and the readouts "
                             "read answers to it, not to the question as the data has it")
    out["checks"] += benchmark.checks(_answers(answered, [None] * len(answered)))
    official = benchmark.rules[OFFICIAL].aggregate
    for name in readouts if readouts is not None else READOUTS:
        try:
            decided = predictions(records, name, answered)
        except Unavailable as why:
            out["unavailable"][name] = str(why)
            continue
        _aggregate(out, "readouts", name, official, _answers(answered, decided))
        # as score counts them: a cut run says so
        if reasons := unknown_reasons(records, name, answered):
            out.setdefault("unknown_reasons", {})[name] = reasons
    return out


def _asked_note(rule: str, recorded: dict) -> str:
    """The line saying a run was asked as `rule`'s tool asks (meta.json's benchmark_prompt)."""
    how = "its task's prompt" if recorded.get("changed") else "the question as the data has it"
    return (f"asked with {rule}'s prompt ({how}, in {rule}'s model-class template): the {rule} "
            "rule scores its own run")


def _aggregate(out: dict, where: str, name: str, aggregate, answers: list[Answer]) -> None:
    """out[where][name] = the aggregation, or out["unavailable"][name] = why the tool's formula
    cannot take these answers (an MME image left with one answer by an error record, say)."""
    try:
        out[where][name] = aggregate(answers)
    except ValueError as err:
        out["unavailable"][name] = str(err)


def score_responses(path: str | Path, benchmark: type[Benchmark],
                    questions_path: str | Path | None = None) -> dict:
    """A result file another tool wrote, under each of the benchmark's rules: {"source",
    "benchmark", "n", "rules": {rule: metrics}}. `questions_path` (the benchmark's data) supplies
    labels and groups where the file has none."""
    questions = benchmark.questions(Path(questions_path)) if questions_path is not None else None
    responses = benchmark.responses(Path(path), questions)
    # every rule would score nothing as 0 (or nan): no file of answers is an empty one
    if not responses:
        raise DataError(f"{path}: no answers in this file (an empty {benchmark.name} result file "
                        "is not scored)")
    unlabelled = [r for r in responses if r.label is None]
    if unlabelled:
        raise DataError(f"{unlabelled[0].line}: the file holds no label for question "
                        f"{unlabelled[0].key}: give the benchmark's data (--data) to score it")
    out = {"source": str(path), "benchmark": benchmark.name, "n": len(responses), "rules": {},
           "unavailable": {}}
    for name, rule in benchmark.rules.items():
        _aggregate(out, "rules", name, rule.aggregate, _from_responses(responses, rule.read))
    out["checks"] = benchmark.checks(_from_responses(responses, lambda text: None))
    return out


def _from_responses(responses: list[Response], read) -> list[Answer]:
    return [Answer(r.key, r.split, r.image, r.label, read(r.text), r.group) for r in responses]


def metric(metrics: dict, name: str):
    """A headline's value (`block/metric`: a nested one, AMBER's printed blocks); "-" if absent."""
    if name in metrics:  # flat names (MME's `<subtask>/acc`)
        return metrics[name]
    value = metrics
    for part in name.split("/"):
        if not isinstance(value, dict) or part not in value:
            return "-"
        value = value[part]
    return value


def format_benchmark(result: dict) -> str:
    """The headline numbers: each rule's (named as its tool names them) and each readout's under the
    official aggregation, one markdown table each; checks and what was unavailable under them."""
    def cells(metrics: dict, names) -> list[str]:
        return [f"{v:.6g}" if isinstance(v := metric(metrics, k), float) else str(v) for k in names]

    benchmark = get_benchmark(result["benchmark"])
    errors = f", {result['errors']} error records left out" if result.get("errors") else ""
    blocks = [f"### {benchmark.title}: {result['source']} (n={result['n']}{errors})"]
    for name, metrics in result["rules"].items():
        rule = benchmark.rules[name]
        blocks.append(f"answer rule and aggregation `{name}` ({'; '.join(rule.sources)}):\n"
                      + markdown_table(list(rule.headline), [cells(metrics, rule.headline)]))
        if rule.rows and metrics.get(rule.rows):
            columns = list(metrics[rule.rows][0])
            blocks.append(f"`{name}`'s score file, its rows:\n" + markdown_table(columns, [
                [str(row[columns[0]]), *cells(row, columns[1:])] for row in metrics[rule.rows]]))
    if result.get("readouts"):
        headline = benchmark.rules[OFFICIAL].headline
        blocks.append("every readout, aggregated as the official code does:\n" + markdown_table(
            ["readout", *headline],
            [[n, *cells(m, headline)] for n, m in result["readouts"].items()]))
    blocks += reason_lines(result.get("unknown_reasons") or {},
                           result["n"] - result.get("errors", 0))
    blocks += result.get("notes", [])
    blocks += [f"! {note}" for note in result.get("checks", [])]
    blocks += [f"unavailable: {name} ({why})"
               for name, why in result.get("unavailable", {}).items()]
    return "\n\n".join(blocks)


CSV_COLUMNS = ("source", "benchmark", "aggregation", "name", "row", "metric", "value")


def format_benchmark_csv(results: list[dict]) -> str:
    """One line per result, rule or readout, and headline metric, at full precision (an absent value
    empty); a rule whose tool writes its own score-file rows gives those instead, `row` its first
    column (VLMEvalKit's HallusionBench `split`: Overall, VD, VS, each l2-category)."""
    rows = [CSV_COLUMNS]
    for result in results:
        benchmark = get_benchmark(result["benchmark"])
        head = (result["source"], benchmark.name)
        for name, metrics in result["rules"].items():
            rule = benchmark.rules[name]
            if rule.rows and metrics.get(rule.rows):
                for row in metrics[rule.rows]:
                    first, *columns = row
                    rows.extend([*head, "rule", name, row[first], c, _csv_value(row[c])]
                                for c in columns)
                continue
            rows.extend([*head, "rule", name, "", k, _csv_value(metric(metrics, k))]
                        for k in rule.headline)
        for name, metrics in result.get("readouts", {}).items():
            rows.extend([*head, "readout", name, "", k, _csv_value(metric(metrics, k))]
                        for k in benchmark.rules[OFFICIAL].headline)
    return csv_text(rows)


def _csv_value(value) -> str:
    if value is None or value == "-":
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def is_run(path: str | Path) -> bool:
    """A pope-fast run folder (or its records.jsonl), as opposed to another tool's result file."""
    path = Path(path)
    return (path.is_dir() and ((path / RECORDS_FILE).is_file() or bool(rank_parts(path)))) \
        or path.name == RECORDS_FILE


def run_benchmark(records: RecordSet) -> type[Benchmark] | None:
    """The benchmark a run's records are of, when all are of one (None for POPE's datasets)."""
    datasets = {e.dataset for e in records.entries}
    one = len(datasets) == 1 and datasets <= set(REGISTRY)
    return get_benchmark(datasets.pop()) if one else None


def rule_of(benchmark: type[Benchmark], protocol: str) -> str:
    """The rule of a benchmark that a POPE protocol's tool applies to it (`score --benchmark B
    --protocol T`): the tool's own (HallusionBench's lmms-eval rule is named lmms-eval-rule), or a
    one-line refusal naming the rules the benchmark has."""
    for name in benchmark.rules:
        if name == protocol or name == f"{protocol}-rule":
            return name
    raise ValueError(f"--protocol {protocol}: {benchmark.name} has no rule of that tool's "
                     f"(its rules: {', '.join(benchmark.rules)})")


def only_rule(result: dict, rule: str) -> dict:
    """A run's or a compared pair's numbers under one rule alone (what its tool prints), no
    readouts."""
    return {**result, "rules": {k: v for k, v in result["rules"].items() if k == rule},
            "readouts": {},
            "unavailable": {k: v for k, v in result.get("unavailable", {}).items() if k == rule}}


def score_benchmark_paths(paths: list[str], name: str | None = None, data: str | Path | None = None,
                          readouts: list[str] | None = None) -> list[dict]:
    """`pope-fast score --benchmark`: each run scored by score_run, each other tool's result file by
    score_responses; the benchmark named, else told from each path's content (never guessed)."""
    named = get_benchmark(name) if name is not None else None
    out = []
    for path in paths:
        if is_run(path):
            records = read_records(path)
            benchmark = named or run_benchmark(records)
            if benchmark is None:
                raise DataError(f"{path}: its records are not of one benchmark "
                                f"({', '.join(REGISTRY)}): give --benchmark")
            out.append(score_run(records, benchmark, readouts))
            continue
        benchmark = named or detect_benchmark(path)
        if benchmark is None:
            raise DataError(f"{path}: neither a pope-fast run nor a result file of "
                            f"{', '.join(REGISTRY)} that its content tells apart: give --benchmark")
        out.append(score_responses(path, benchmark, data))
    return out


def _recorded_benchmark(path: str | Path) -> str | None:
    """The benchmark a run's meta.json names (eval records it), without reading its records."""
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    name = read_meta(folder / META_FILE).get("benchmark")
    return name if name in REGISTRY else None


def benchmark_of(paths: list[str]) -> str | None:
    """The benchmark the paths name (each run's meta.json, each result file's layout), or None where
    none does (POPE); paths of two benchmarks are refused."""
    found = {}
    for path in paths:
        if is_run(path):
            found[path] = _recorded_benchmark(path)
            continue
        benchmark = detect_benchmark(path)
        found[path] = benchmark.name if benchmark is not None else None
    names = set(found.values())
    if len(names) > 1:
        raise DataError("the paths are of different benchmarks: "
                        + ", ".join(f"{p}: {n or 'pope'}" for p, n in found.items()))
    return names.pop() if names else None
