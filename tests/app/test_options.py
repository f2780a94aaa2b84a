"""Options and folders refused before anything runs (no model loads): one click error line each,
never a traceback."""
import json
import re

import pytest
from click.testing import CliRunner

from pope_fast.cli import main


def refused(args, pattern, code):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, result.output
    # a click error, not a crash
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    [line] = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert re.search(pattern, line), line
    return line


@pytest.mark.parametrize("value", ["0", "-5"])
def test_every_command_that_resamples_takes_the_same_range(tmp_path, value):
    """score, compare and report draw bootstrap resamples: 0 (an IndexError in report) and -5
    (numpy's negative dimensions) are the same one line in all three, before any record is read."""
    lines = {command: refused([command, tmp_path, tmp_path,
                               *(["--out", tmp_path / "r"] if command == "report" else []),
                               "--resamples", value], r"Invalid value for '--resamples'", code=2)
             for command in ("score", "compare", "report")}
    assert len(set(lines.values())) == 1 and f"{value} is not in the range x>=1" in lines["report"]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", ["-3", "0"])
def test_bench_reference_sample_is_a_count(value):
    refused(["bench", "--reference-sample", value],
            rf"Invalid value for '--reference-sample': {value} is not in "
            r"the range x>=1", code=2)


def _paired_folder(out):
    for method in ("none", "vcd"):
        (out / method).mkdir(parents=True)
        (out / method / "meta.json").write_text(json.dumps({"method": {"name": method}}))
        (out / method / "records.jsonl").write_text("")
    (out / "compare.json").write_text(json.dumps({"pairs": []}))
    return out


def test_a_plain_run_into_a_paired_runs_folder_is_refused(tmp_path):
    """A plain eval would write records.jsonl beside OUT/none/ and OUT/vcd/, and `report OUT` would
    show it alone."""
    out = _paired_folder(tmp_path / "paired")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    line = refused(["eval", "--out", out, "--device", "cpu"], r"paired", code=1)
    assert line == (f"Error: {out}: holds a paired run (none/, vcd/, compare.json); a plain run's "
                    "records here would sit beside its method folders and `report` would show "
                    "this run alone; resume it with its --method options, or choose a new --out")
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.name != ".lock") == before


def test_a_paired_run_into_a_plain_runs_folder_is_refused(tmp_path):
    out = tmp_path / "plain"
    out.mkdir()
    (out / "meta.json").write_text("{}")
    (out / "records.jsonl").write_text("")
    refused(["eval", "--out", out, "--device", "cpu", "--method", "none", "--method", "vcd"],
            rf"^Error: {re.escape(str(out))}: holds a plain run \(its meta\.json and records\); "
            rf"a paired run "
            r"\(--method\) writes a folder per method", code=1)

    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "records.jsonl"]
