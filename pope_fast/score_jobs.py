"""`pope-fast score` and `compare` as one call each: their options → the text they print. POPE's
records (with RePOPE's labels, under a protocol) go to readout/score.py and readout/compare.py; a
benchmark's runs and other tools' result files to readout/benchmarks/score.py and compare.py. Every
refusal is a ValueError the command line shows as one line."""
from __future__ import annotations

from dataclasses import dataclass

from .readout import compare_runs, expand_runs, format_compare, format_runs
from .readout.attention_stats import parse_layers
from .readout.benchmarks import detect_benchmark, get_benchmark
from .readout.benchmarks.compare import compare_benchmark_runs, format_benchmark_compare
from .readout.benchmarks.pope.relabel import read_labels, relabel
from .readout.benchmarks.reading import read_records
from .readout.benchmarks.score import (benchmark_of, format_benchmark, format_benchmark_csv,
                                          only_rule, rule_of, score_benchmark_paths)
from .readout.data import DataError
from .readout.protocols import format_protocol_runs, get_protocol, score_protocol
from .readout.records import strict_json
from .readout.readouts import parse_readouts
from .readout.report.tables import format_relabelled
from .readout.score import score_records


def score_paths(paths: list[str], readouts: str = "all", protocol: str | None = None, *,
                seed: int = 0, resamples: int = 1000, layers: tuple[int, int] | None = None,
                labels: list[str] | None = None) -> list[dict]:
    """`pope-fast score`: every record file or run folder scored under `readouts` ("all", or names,
    each of which the records must supply), or under a published protocol
    (protocols.score_protocol's runs). With `labels` (RePOPE's files), each run's relabelled records
    are scored too, after its own: runs of dataset `repope`, each with `relabelled`: the labels
    files and what they changed in its split(s)."""
    names, runs = parse_readouts(readouts), []
    corrected = read_labels(labels) if labels else None
    for path in paths:
        records = read_records(path)
        sets = [(records, None)]
        if corrected is not None:
            sets.append(relabel(records, corrected))
        for which, changes in sets:
            if protocol is not None:
                scored = score_protocol(which, get_protocol(protocol))
            else:
                scored = score_records(which, names, strict=readouts.strip() != "all", seed=seed,
                                       resamples=resamples, layers=layers)
            if not scored:
                raise DataError(f"{path}: no records to score")
            for run in scored if changes is not None else ():
                run["relabelled"] = _changed(run, changes)
            runs += scored
    return runs


def _changed(run: dict, changes: dict[str, dict]) -> dict:
    """What the labels changed in a relabelled run's split, or summed over the splits it pools."""
    # a protocol's run (its `rows`) holds every split of its dataset
    splits = list(changes) if "rows" in run else run.get("pooled") or [run["split"]]
    counts = {k: sum(changes[s][k] for s in splits)
              for k, v in changes[splits[0]].items() if isinstance(v, int)}
    return {"labels": [changes[s]["labels"] for s in splits], "from": changes[splits[0]]["from"],
            **counts}


@dataclass(frozen=True)
class ScoreJob:
    files: tuple[str, ...]
    readouts: str = "all"
    fmt: str = "table"
    percent: bool = False
    seed: int = 0
    resamples: int = 1000
    layers: str | None = None
    protocol: str | None = None
    labels: tuple[str, ...] = ()
    benchmark: str | None = None
    data: str | None = None

    def run(self) -> str:
        paths = expand_runs(self.files)
        implied = self._implied()
        benchmark = self.benchmark or implied or benchmark_of(paths)
        if benchmark not in (None, "pope", "repope"):
            if self.labels:
                raise ValueError(f"--benchmark {benchmark}: --labels are POPE's (RePOPE's)")
            # refused before any reading
            rule = self.protocol and rule_of(get_benchmark(benchmark), self.protocol)
            names = None if self.readouts.strip() == "all" else parse_readouts(self.readouts)
            results = score_benchmark_paths(paths, benchmark, self.data, names)
            if rule:  # that tool's rule alone: the number it prints
                results = [only_rule(r, rule) for r in results]
            if self.fmt not in ("table", "markdown", "json", "csv"):
                raise ValueError(f"--format {self.fmt}: a benchmark's scores come as its own "
                                 "tables (table, markdown), csv or json")
            if self.fmt in ("json", "csv"):  # one JSON shape for every score: {"runs": [...]}
                return (strict_json({"runs": results}, indent=2) if self.fmt == "json"
                        else format_benchmark_csv(results))
            return "\n\n".join(map(format_benchmark, results))
        self._check(benchmark)
        runs = score_paths(paths, self.readouts, self.protocol, seed=self.seed,
                           resamples=self.resamples, layers=parse_layers(self.layers),
                           labels=list(self.labels))
        if self.protocol:
            return format_protocol_runs(runs, self.fmt)
        text = format_runs(runs, self.fmt, self.percent)
        if self.labels and self.fmt in ("table", "markdown"):
            text += "\n\n" + format_relabelled(runs, self.percent)
        return text

    def _implied(self) -> str | None:
        """The benchmark --data's files are (it implies it, so a result file is read and refused as
        that benchmark's); --data that is no benchmark's, or another than --benchmark's, is
        refused."""
        if self.data is None:
            return None
        found = detect_benchmark(self.data)
        if found is None:
            raise ValueError(f"--data {self.data}: no benchmark's question data (AMBER's data "
                             "folder, HallusionBench.json, MME's parquet)")
        if self.benchmark not in (None, found.name):
            raise ValueError(f"--data {self.data} is {found.name}'s data, not {self.benchmark}'s")
        return found.name

    def _check(self, benchmark: str | None) -> None:
        if benchmark == "repope" and not self.labels:
            raise ValueError("--benchmark repope: give RePOPE's label files with --labels "
                             "(see the README)")
        if self.protocol and self.fmt not in ("table", "json", "csv"):
            raise ValueError(f"--protocol {self.protocol} shows the tool's own table: "
                             "--format table, csv or json")
        if self.percent and self.protocol:
            raise ValueError(f"--percent: --protocol {self.protocol} prints in the tool's own unit")
        if self.percent and self.fmt == "json":
            raise ValueError("--percent: JSON holds every value as a fraction at full precision")


@dataclass(frozen=True)
class CompareJob:
    runs: tuple[str, ...]
    fmt: str = "markdown"
    seed: int = 0
    resamples: int = 1000
    allow_mismatch: bool = False
    protocol: str | None = None
    benchmark: str | None = None

    def run(self) -> str:
        """A benchmark's runs (named, or told from each run's meta.json) on its own metrics; POPE's
        by F1."""
        benchmark = self.benchmark or benchmark_of(list(self.runs))
        if benchmark not in (None, "pope", "repope"):
            return self._benchmark(benchmark)
        protocol = self.protocol and get_protocol(self.protocol)
        result = compare_runs(list(self.runs), seed=self.seed, resamples=self.resamples,
                              allow_mismatch=self.allow_mismatch, protocol=protocol)
        tables = protocol and format_protocol_runs(
            score_paths(list(self.runs), "all", protocol.name), "table")
        return format_compare(result, self.fmt) + (
            f"\n\n{tables}" if tables and self.fmt == "markdown" else "")

    def _benchmark(self, name: str) -> str:
        """Every rule's and readout's B - A; under --protocol, that tool's rule alone (as `score`
        selects it)."""
        # refused before any reading
        rule = self.protocol and rule_of(get_benchmark(name), self.protocol)
        result = compare_benchmark_runs(list(self.runs), get_benchmark(name), seed=self.seed,
                                        resamples=self.resamples,
                                        allow_mismatch=self.allow_mismatch)
        if rule:
            pairs = [only_rule(pair, rule) for pair in result["pairs"]]
            result = {**result, "rule": rule, "pairs": pairs}
        return (strict_json(result, indent=2) if self.fmt == "json"
                else format_benchmark_compare(result))

