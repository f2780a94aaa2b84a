"""POPE's three datasets as one benchmark, end to end on the demo model:
`eval --questions ../shared/data/pope` reads COCO's, A-OKVQA's and GQA's files (27,000 questions:
tests/benchmarks/test_pope_questions.py counts them; here the first rows of each, two of each split
asked), and prints them as mitigation papers do, a row per dataset and split and their average."""
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main

pytestmark = pytest.mark.slow  # builds the demo model and runs it


def _head(shared, folder, rows: int = 4):
    """../shared/data/pope's layout (COCO's files, seem/ with A-OKVQA's and GQA's) with the first
    rows of each file: the demo writes a stand-in for every image the questions name, which for all
    27,000 takes minutes."""
    from pope_fast.readout import find_question_files

    for path in find_question_files(shared / "data/pope"):
        if "_pope_" in path.name:
            text = path.read_text().strip()
            head = json.loads(text)[:rows] if text.startswith("[") else \
                [json.loads(line) for line in text.splitlines()[:rows]]
            target = folder / path.relative_to(shared / "data/pope")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(json.dumps(row) + "\n" for row in head))
    return folder


def test_the_three_datasets_run_and_score_in_one_command(shared, tmp_path):
    pope = _head(shared, tmp_path / "pope")
    result = CliRunner().invoke(main, ["eval", "--out", str(tmp_path / "run"), "--device", "cpu",
                                       "--questions", str(pope), "--limit-per-split", "2"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line)
               for line in (tmp_path / "run/records.jsonl").read_text().splitlines()]
    groups = [(d, s) for d in ("coco", "aokvqa", "gqa")
              for s in ("random", "popular", "adversarial")]
    assert sorted((r["dataset"], r["split"]) for r in records) == sorted(groups * 2)
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    [grid] = summary["by_dataset_and_split"]
    assert (len(grid["rows"]) == 9
            and "by dataset and split" in (tmp_path / "run/summary.md").read_text())
    block = result.output[result.output.index("by dataset and split"):].splitlines()
    assert [line.split()[:3] for line in block[3:13]] == [[d, s, "2"] for d, s in groups] + [
        ["average", "9", "rows"]]
    scored = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--protocol",
                                       "pope-official", "--format", "json"])
    runs = json.loads(scored.output)
    assert [run["dataset"] for run in runs["runs"]] == ["coco", "aokvqa", "gqa"]
    [average] = runs["averages"].values()
    rows = [row for run in runs["runs"] for row in run["rows"]]
    assert average["rows"] == 9 and average["Accuracy"] == pytest.approx(
        sum(r["Accuracy"] for r in rows) / 9)

