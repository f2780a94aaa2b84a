"""`pope-fast score` and `compare` as one call each: their options → the text they print. POPE's records (with
RePOPE's labels, under a protocol) go to readout/score.py and readout/compare.py; a benchmark's runs and other
tools' result files to readout/benchmarks/score.py and compare.py. Every refusal is a ValueError the command
line shows as one line."""
from __future__ import annotations

import json
from dataclasses import dataclass

from .readout import expand_runs, format_runs
from .readout.attention_stats import parse_layers
from .readout.benchmarks.score import benchmark_of, format_benchmark, score_benchmark_paths
from .readout.protocols import format_protocol_runs, get_protocol
from .readout.readouts import parse_readouts
from .readout.report.tables import format_relabelled
from .readout.score import score_paths


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
        benchmark = self.benchmark or benchmark_of(paths)
        if benchmark not in (None, "pope", "repope"):
            if self.protocol or self.labels:
                raise ValueError(f"--benchmark {benchmark}: its rules are the tools' own (see the README); "
                                 "--protocol and --labels are POPE's")
            results = score_benchmark_paths(paths, benchmark, self.data,
                                            None if self.readouts.strip() == "all" else parse_readouts(self.readouts))
            return json.dumps(results, indent=2) if self.fmt == "json" else "\n\n".join(map(format_benchmark, results))
        self._check(benchmark)
        runs = score_paths(paths, self.readouts, self.protocol, seed=self.seed, resamples=self.resamples,
                           layers=parse_layers(self.layers), labels=list(self.labels))
        if self.protocol:
            return format_protocol_runs(runs, self.fmt)
        text = format_runs(runs, self.fmt, self.percent)
        if self.labels and self.fmt in ("table", "markdown"):
            text += "\n\n" + format_relabelled(runs, self.percent)
        return text

    def _check(self, benchmark: str | None) -> None:
        if benchmark == "repope" and not self.labels:
            raise ValueError("--benchmark repope: give RePOPE's label files with --labels (see the README)")
        if self.protocol and self.fmt not in ("table", "json", "csv"):
            raise ValueError(f"--protocol {self.protocol} shows the tool's own table: --format table, csv or json")
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
        """A benchmark's runs (named, or told from each run's meta.json) on its own metrics; POPE's by F1."""
        from .readout import compare_runs, format_compare

        benchmark = self.benchmark or benchmark_of(list(self.runs))
        if benchmark not in (None, "pope", "repope"):
            return self._benchmark(benchmark)
        protocol = self.protocol and get_protocol(self.protocol)
        result = compare_runs(list(self.runs), seed=self.seed, resamples=self.resamples,
                              allow_mismatch=self.allow_mismatch, protocol=protocol)
        tables = protocol and format_protocol_runs(score_paths(list(self.runs), "all", protocol.name), "table")
        return format_compare(result, self.fmt) + (f"\n\n{tables}" if tables and self.fmt == "markdown" else "")

    def _benchmark(self, name: str) -> str:
        from .readout.benchmarks import get_benchmark
        from .readout.benchmarks.compare import compare_benchmark_runs, format_benchmark_compare

        if self.protocol:
            raise ValueError(f"--protocol {self.protocol}: {name}'s runs compare under its tools' own rules, each "
                             "shown; --protocol is POPE's")
        result = compare_benchmark_runs(list(self.runs), get_benchmark(name), seed=self.seed,
                                        resamples=self.resamples, allow_mismatch=self.allow_mismatch)
        return json.dumps(result, indent=2) if self.fmt == "json" else format_benchmark_compare(result)

