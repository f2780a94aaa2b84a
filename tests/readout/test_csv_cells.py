"""Every CSV pope-fast writes is safe to open in a spreadsheet (issue 33): a text cell that would
run as a formula (OWASP: a leading =, +, -, @, tab or carriage return) gets a leading ', a number
stays a number."""
import csv
import io

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, TokenSets, make_record
from pope_fast.readout.cells import csv_text, spreadsheet_cell
from pope_fast.store import RecordWriter, write_meta

LINK = '=HYPERLINK("https:\\evil.example","click")'  # a folder name holds no /


@pytest.mark.parametrize("cell,expected", [
    (LINK, "'" + LINK), ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"), ("-2+3", "'-2+3"),
    ("@SUM(A1:A2)", "'@SUM(A1:A2)"), ("\t=1", "'\t=1"), ("\r=1", "'\r=1"),
    ("-0.5", "-0.5"), ("+1.5e-3", "+1.5e-3"), ("-inf", "-inf"), ("nan", "nan"), (-0.5, -0.5),
    (3, 3),
    ("random", "random"), ("a=b", "a=b"), ("", ""),
], ids=repr)
def test_a_formula_is_neutralised_and_a_number_is_not(cell, expected):
    assert spreadsheet_cell(cell) == expected


def test_csv_text_reads_back_the_neutralised_cells():
    rows = list(csv.reader(io.StringIO(csv_text([["source", "value"], [LINK, -0.5],
                                                 ["-x", repr(-0.25)]]))))
    assert rows == [["source", "value"], ["'" + LINK, "-0.5"], ["'-x", "-0.25"]]


def _run(folder):
    """A run whose folder name and split are formulas."""
    folder.mkdir()
    write_meta(folder, {"token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    questions = [Question(i, f"img{i}.jpg", "Is there a dog?", "yes" if i % 2 else "no", "@split",
                          "coco")
                 for i in range(1, 7)]
    with RecordWriter(folder) as w:
        w.write([make_record(q, "t", first_token_id=5, candidate_logits={5: 0.1 * i, 6: 0.3},
                             decoded="Yes" if i % 3 else "No")
                 for i, q in enumerate(questions)])


@pytest.mark.parametrize("extra", [[], ["--protocol", "vlmevalkit"], ["--benchmark", "pope"]],
                         ids=["scores", "protocol", "benchmark"])
def test_a_run_named_as_a_formula_reaches_every_csv_neutralised(tmp_path, monkeypatch, extra):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / LINK)
    out = CliRunner().invoke(main, ["score", LINK, "--format", "csv", *extra])
    assert out.exit_code == 0, out.output
    rows = list(csv.reader(io.StringIO(out.output)))
    cells = [c for row in rows[1:] for c in row]
    assert rows[1:] and all(row[0].startswith("'" + LINK) for row in rows[1:]), out.output
    assert not [c for c in cells if c.startswith(("=", "@", "+"))
                or (c.startswith("-") and not _number(c))]
    assert any(_number(c) for c in cells)  # the metrics stay numbers


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_a_benchmark_result_folder_named_as_a_formula_is_neutralised(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / LINK).mkdir()
    (tmp_path / LINK / "OCR.txt").write_text("a.jpg\tIs it red?\tYes\tYes\n"
                                             "a.jpg\tIs it blue?\tNo\tYes\n")
    out = CliRunner().invoke(main, ["score", LINK, "--benchmark", "mme", "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = list(csv.reader(io.StringIO(out.output)))
    assert rows[0][:2] == ["source", "benchmark"] and rows[1:], out.output
    assert (all(row[0] == "'" + LINK for row in rows[1:])
            and any(_number(row[-1]) for row in rows[1:]))
