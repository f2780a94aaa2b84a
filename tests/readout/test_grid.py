"""POPE's three datasets as one benchmark (readout/grid.py): score, compare and score --protocol
show a row per dataset and split in the papers' order and their average, the unweighted mean of the
rows, on records of several datasets; records of one dataset show none of it."""
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import (Question, TokenSets, compare_runs, make_record, read_records,
                               score_records)
from pope_fast.readout.grid import paper_order, score_grids
from pope_fast.readout.report.compare_format import format_compare
from pope_fast.readout.report.tables import format_grids, format_runs
from pope_fast.store import RecordWriter, write_meta

DATASETS = ("gqa", "coco", "aokvqa")  # written out of the papers' order
SPLITS = ("adversarial", "random", "popular")


def _run(folder, shift: float = 0.0, datasets=DATASETS, method: str = "none"):
    """Every dataset x split of 8 questions, legacy_2tok's logits drawn so that each group's F1
    differs; `shift` moves yes up (a method's run over the same questions); the pope_official text
    answers by label parity."""
    import random

    rng = random.Random(7)
    folder.mkdir()
    write_meta(folder, {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()},
                        "template": "t", "method": {"name": method}})
    records = []
    for d, dataset in enumerate(datasets):
        for s, split in enumerate(SPLITS):
            for i in range(1, 9):
                label = "yes" if i % 2 else "no"
                yes = rng.gauss(0.3 * (d + s) + (label == "yes"), 1.0) + shift
                records.append(make_record(Question(i, f"{dataset}{i}.jpg", "Is there a dog?",
                                                    label, split, dataset),
                                           "t", first_token_id=5, candidate_logits={5: yes, 6: 0.5},
                                           decoded="No" if (i + d + s) % 3 == 0 else "Yes"))
    with RecordWriter(folder) as w:
        w.write(records)


def test_the_papers_order_and_no_pooled_group():
    groups = [("gqa", "adversarial"), ("coco", "Overall"), ("mine", "random"), ("coco", "popular"),
              ("coco", "random"), ("aokvqa", "random")]
    assert paper_order(groups) == [("coco", "random"), ("coco", "popular"), ("aokvqa", "random"),
                                   ("gqa", "adversarial"), ("mine", "random")]


def test_score_shows_each_dataset_and_split_and_their_mean(tmp_path):
    _run(tmp_path / "run")
    runs = score_records(read_records(tmp_path / "run"), ["legacy_2tok", "pope_official"],
                         resamples=10)
    [grid] = score_grids(runs)
    assert [(r["dataset"], r["split"]) for r in grid["rows"]] == \
        [(d, s) for d in ("coco", "aokvqa", "gqa") for s in ("random", "popular", "adversarial")]
    by_group = {(r["dataset"], r["split"]): r for r in runs if not r.get("pooled")}
    for name in ("legacy_2tok", "pope_official"):
        for metric in ("accuracy", "f1"):
            values = [by_group[r["dataset"], r["split"]]["readouts"][name][metric]
                      for r in grid["rows"]]
            assert grid["average"][name][metric] == pytest.approx(sum(values) / 9)
            assert len(set(values)) > 1  # the rows differ: a mean of one of them would not pass
    pooled = {r["dataset"]: r for r in runs if r.get("pooled")}
    # not the pooled runs' mean
    assert grid["average"]["legacy_2tok"]["f1"] != pytest.approx(
        sum(p["readouts"]["legacy_2tok"]["f1"] for p in pooled.values()) / 3)
    table = format_runs(runs, "table")
    block = table[table.index("by dataset and split"):].splitlines()
    assert [line.split()[:2] for line in block[3:]] == [
        *([d, s] for d in ("coco", "aokvqa", "gqa") for s in ("random", "popular", "adversarial")),
        ["average", "9"]]
    f1 = grid["average"]["legacy_2tok"]["f1"]
    assert f"{grid['average']['legacy_2tok']['accuracy']:.4f} / {f1:.4f}" in block[-1]
    assert json.loads(format_runs(runs, "json"))["by_dataset_and_split"][0]["average"][
        "legacy_2tok"]["f1"] == f1
    assert (format_grids(runs, "markdown").startswith("### ")
            and "| average | 9 rows | 72 |" in format_grids(runs))


def test_one_dataset_shows_no_grid(tmp_path):
    _run(tmp_path / "run", datasets=("coco",))
    runs = score_records(read_records(tmp_path / "run"), ["legacy_2tok"], resamples=10)
    assert score_grids(runs) == [] and "by dataset and split" not in format_runs(runs, "table")
    assert format_grids(runs) == ""
    assert "by_dataset_and_split" not in json.loads(format_runs(runs, "json"))


def test_compare_averages_the_groups_delta_f1(tmp_path):
    _run(tmp_path / "a")
    _run(tmp_path / "b", shift=0.8, method="other")
    result = compare_runs([tmp_path / "a", tmp_path / "b"], resamples=20, allow_mismatch=True)
    [pair] = result["pairs"]
    groups = [f"{d} {s}" for d in ("coco", "aokvqa", "gqa")
              for s in ("random", "popular", "adversarial")]
    assert pair["average"]["groups"] == groups
    tables = [pair["splits"][g]["legacy_2tok"] for g in groups]
    mean = pair["average"]["readouts"]["legacy_2tok"]
    assert (mean["delta_f1"] == pytest.approx(sum(t["delta_f1"] for t in tables) / 9)
            and mean["delta_f1"] != 0)
    assert mean["f1_b"] == pytest.approx(sum(t["b"]["f1"] for t in tables) / 9)
    assert mean["accuracy_a"] == pytest.approx(sum(t["a"]["accuracy"] for t in tables) / 9)
    text = format_compare(result)
    assert "average (9 dataset x split groups)" in text and f"{mean['delta_f1']:+.4f}" in text
    assert "### average of 9 dataset x split groups (coco random, coco popular," in text


def test_score_under_a_protocol_averages_its_rows_over_the_datasets(tmp_path):
    _run(tmp_path / "run")
    out = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--protocol", "llava",
                                    "--format", "json"])
    assert out.exit_code == 0, out.output
    scored = json.loads(out.output)
    rows = [row for run in scored["runs"] for row in run["rows"]]
    [average] = scored["averages"].values()
    assert average["rows"] == 9 and average["F1 score"] == pytest.approx(
        sum(r["F1 score"] for r in rows) / 9)
    table = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--protocol", "llava"]).output
    assert "the mean of its 9 dataset x split rows" in table and repr(average["Accuracy"]) in table
