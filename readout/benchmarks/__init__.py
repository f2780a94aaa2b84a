"""The yes/no benchmarks beside POPE, one module each (a room per benchmark), imported on demand."""
from __future__ import annotations

import importlib
from pathlib import Path

from .base import Answer, Benchmark, Response, Rule

# name -> the module of its Benchmark: a new benchmark is a room (a folder) here and one line
REGISTRY = {"mme": "mme.benchmark", "amber": "amber.benchmark",
            "hallusionbench": "hallusionbench.benchmark"}


def get_benchmark(name: str) -> type[Benchmark]:
    if name not in REGISTRY:
        raise ValueError(f"unknown benchmark {name!r}; known: pope, repope (score --labels), "
                         f"{', '.join(REGISTRY)}")
    module = importlib.import_module(f".{REGISTRY[name]}", __name__)
    return next(c for c in vars(module).values()
                if isinstance(c, type) and issubclass(c, Benchmark) and c is not Benchmark
                and c.name == name)


def detect_benchmark(path: str | Path) -> type[Benchmark] | None:
    """The one benchmark whose data or result file `path` is, or None (POPE's files, or unknown)."""
    found = []
    for name in REGISTRY:
        benchmark = get_benchmark(name)
        if benchmark.detect(Path(path)):
            found.append(benchmark)
    return found[0] if len(found) == 1 else None


def benchmark_questions(sources: list[str | Path],
                        name: str | None = None) -> tuple[str | None, list | None]:
    """(benchmark, its questions) of `eval --questions`: the benchmark named, else the one every
    source's content is; (None, None) for POPE's files, which its room reads (pope/questions.py)."""
    if name is None:
        found = {getattr(detect_benchmark(s), "name", None) for s in sources}
        if len(found) > 1:
            raise ValueError("--questions: files of different benchmarks "
                             f"({', '.join(sorted(map(str, found)))}); one benchmark a run")
        name = found.pop() if found else None
    if name in (None, "pope"):
        return None, None
    if name == "repope":
        raise ValueError("--benchmark repope: RePOPE asks POPE's questions; run POPE and score it "
                         "with --labels")
    benchmark = get_benchmark(name)
    return name, [q for source in sources for q in benchmark.questions(Path(source))]


__all__ = ["Answer", "Benchmark", "REGISTRY", "Response", "Rule", "benchmark_questions",
           "detect_benchmark", "get_benchmark"]
