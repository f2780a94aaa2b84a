"""`score --data`: the benchmark's question data implies the benchmark, so a result file that is not
that benchmark's is refused as that benchmark's (what is wrong with it as one), never as POPE
records; --data that is no benchmark's data, or another benchmark's than --benchmark names, is
refused in one line."""
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main


def _score(*args):
    return CliRunner().invoke(main, ["score", *map(str, args)])


def test_data_implies_its_benchmark(shared, tmp_path):
    amber = shared / "benchmarks/amber/data"
    hallusion = shared / "benchmarks/hallusionbench/HallusionBench.json"
    if not amber.is_dir() or not hallusion.is_file():
        pytest.skip(f"{amber} or {hallusion} is absent")
    result_file = tmp_path / "answers.json"
    result_file.write_text(json.dumps({"id": 1, "response": "Yes"}))
    out = _score(result_file, "--data", amber)
    assert out.exit_code == 1 and "answers.json: not a JSON list, as an AMBER response file is " \
        "(a dict here)" in out.output, out.output
    out = _score(result_file, "--data", hallusion)
    assert out.exit_code == 1 \
        and "answers.json: not a JSON list of HallusionBench rows" in out.output, out.output
    out = _score(result_file, "--data", result_file)
    assert out.exit_code == 1 \
        and f"--data {result_file}: no benchmark's question data" in out.output
    out = _score(result_file, "--benchmark", "mme", "--data", hallusion)
    assert out.exit_code == 1 and "is hallusionbench's data, not mme's" in out.output
    assert "Traceback" not in out.output
