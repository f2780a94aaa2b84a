"""VLMEvalKit's prediction tables for MME, AMBER and HallusionBench (readout/formats/vlmevalkit.py
and each room's reader), on tables built here as vlmeval/smp/file.py:173-177 writes them (every
field quoted). The expected numbers are worked by hand from the rules as their sources state them:
YOrN_Extraction (vlmeval/dataset/utils/yorn.py:254-261), MME_rating (yorn.py:50-93), AMBER_rating
(yorn.py:9-47), Hallusion_rating (yorn.py:96-145), MME's calculation.py and lmms-eval's
parse_pred_ans as ../shared/benchmarks/mme_synthetic/README.md states them, AMBER's
inference.py:174-256 with counters from 0.001."""
import csv
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout.benchmarks import detect_benchmark
from pope_fast.readout.benchmarks.amber.benchmark import Amber
from pope_fast.readout.benchmarks.hallusionbench.benchmark import HallusionBench
from pope_fast.readout.benchmarks.mme.benchmark import MME
from pope_fast.readout.benchmarks.score import score_responses
from pope_fast.readout.data import DataError


def _table(path, rows, delimiter="\t"):
    with path.open("w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]), delimiter=delimiter,
                                quoting=csv.QUOTE_ALL)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _mme_rows():
    """color: image a both right; image b's Yes question answered "Yes, no doubt." (yorn: both
    words, Unknown). code_reasoning: image c's Yes answered "no", its No answered "Not sure" (yorn:
    neither word, Unknown; calculation.py's first 4 characters "not " hold "no"); image d right, its
    Yes spanning two lines."""
    answers = [("color", "a", "Yes", "Yes"), ("color", "a", "No", "No"),
               ("color", "b", "Yes", "Yes, no doubt."), ("color", "b", "No", "No"),
               ("code_reasoning", "c", "Yes", "no"), ("code_reasoning", "c", "No", "Not sure"),
               ("code_reasoning", "d", "Yes", "Yes\nit is."), ("code_reasoning", "d", "No", "No")]
    return [{"index": str(i), "question": f"Is it {c} {img}? Please answer yes or no.",
             "answer": gt, "category": c, "image_path": f"{c}/{img}.png", "prediction": pred}
            for i, (c, img, gt, pred) in enumerate(answers)]


def test_mme_table_under_every_rule(tmp_path):
    table = _table(tmp_path / "m_MME.tsv", _mme_rows())
    assert detect_benchmark(table) is MME
    rules = score_responses(table, MME)["rules"]
    # vlmevalkit: color right [1,1,0,1] -> acc 75 + acc_plus (1*1 + 0*1)/2 = 50 -> 125;
    # code_reasoning [0,0,1,1] -> 50 + (0 + 1)/2*100 = 100
    assert rules["vlmevalkit"]["perception"] == 125.0 and rules["vlmevalkit"]["reasoning"] == 100.0
    # official: "yes, no doubt." reads yes from its first 4 characters, "not sure" no: color 200;
    # code_reasoning [0,1,1,1] -> 75 + 50 = 125. lmms-eval reads these texts the same way.
    assert rules["official"]["Perception"] == 200.0 and rules["official"]["Cognition"] == 125.0
    assert rules["lmms-eval"]["mme_perception_score"] == 200.0 \
        and rules["lmms-eval"]["mme_cognition_score"] == 125.0
    printed = CliRunner().invoke(main, ["score", str(table), "--format", "json"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output)["runs"][0]["rules"] == rules


def test_mme_table_as_csv_and_its_row_lines(tmp_path):
    rows = _mme_rows()
    table = _table(tmp_path / "m_MME.csv", rows, delimiter=",")
    responses = MME.responses(table)
    assert [r.key for r in responses] == [str(i) for i in range(8)]
    # header 1, rows 2-8, 8-9
    assert responses[6].text == "Yes\nit is." and responses[6].line == f"{table}:9"
    assert responses[7].line == f"{table}:10"
    # MME's score is answer == extracted, case-sensitive (image_yorn.py:91)
    rows[3]["answer"] = "no"
    with pytest.raises(DataError, match=r"m_MME\.csv:5: answer 'no' is not Yes or No"):
        MME.responses(_table(table, rows, delimiter=","))


def test_missing_column_and_other_dataset_name_file_and_line(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "image_path"} for r in _mme_rows()]
    table = _table(tmp_path / "t.tsv", rows)
    assert detect_benchmark(table) is None  # MME_rating cannot pair images without image_path
    with pytest.raises(DataError,
                       match=r"t\.tsv:1: missing column\(s\) image_path \(a VLMEvalKit MME"):
        MME.responses(table)
    amber = _table(tmp_path / "a.tsv", _amber_rows())
    with pytest.raises(DataError,
                       match=r"a\.tsv:2: category 'discriminative-hallucination' "
                             r"is not one of MME"):
        MME.responses(amber)
    pope = [{**r, "category": "random"} for r in _mme_rows()]
    # POPE's table: benchmarks/pope/vlmevalkit.py's
    assert detect_benchmark(_table(tmp_path / "p.tsv", pope)) is None


def _amber_rows():
    """(type, answer, prediction); AMBER_rating compares lower-cased (image_yorn.py:88-89), the
    official script needs exactly "Yes" or "No" (inference.py:189, 214, 233)."""
    rows = [("discriminative-hallucination", "no", "No"),
            ("discriminative-hallucination", "yes", "yes"),
            ("discriminative-attribute-state", "Yes", "Yes"),
            ("discriminative-attribute-number", "no", "No."),
            ("relation", "no", "Yes"), ("discriminative-relation", "yes", "Yes")]
    return [{"index": str(1005 + i), "question": f"Is there a thing{i}?", "answer": a,
             "category": c, "image_path": f"AMBER_{i}.jpg", "prediction": p}
            for i, (c, a, p) in enumerate(rows)]


def test_amber_table_under_both_rules(tmp_path):
    table = _table(tmp_path / "m_AMBER.tsv", _amber_rows())
    assert detect_benchmark(table) is Amber
    rules = score_responses(table, Amber)["rules"]
    # AMBER_rating: Existence [1, 1], Attribute [1, 1] ("No." reads no), Relation [0, 1]; Avg ACC
    # their mean
    assert rules["vlmevalkit"] == {"Existence": 100.0, "Attribute": 100.0, "Relation": 50.0,
                                   "Avg ACC": pytest.approx(250 / 3)}
    # official: "yes" and "No." are no answer; right are rows 1, 3 and 6 of 6, the counter from
    # 0.001
    overall = rules["official"]["Descriminative Task"]
    assert overall["Accuracy"] == round(3 / 6.001 * 100, 1)
    assert overall["Recall"] == round(1 / 3.001 * 100, 1)  # truth no: 3; said "No": row 1 of them
    assert overall["Precision"] == round(1 / 1.001 * 100, 1)  # answered exactly "No": row 1 only
    rows = _amber_rows()
    # folded already: the official blocks need state/number/action
    rows[2]["category"] = "Attribute"
    with pytest.raises(DataError,
                       match=r"m_AMBER\.tsv:4: category 'Attribute' is not one of AMBER's"):
        Amber.responses(_table(table, rows))


def _hallusionbench(tmp_path):
    def row(category, sub, set_id, figure, visual, answer, filename):
        return {"category": category, "subcategory": sub, "visual_input": visual, "set_id": set_id,
                "figure_id": figure, "sample_note": "", "question_id": "0",
                "question": f"Q {sub} {set_id}/{figure}?", "gt_answer_details": "",
                "gt_answer": answer, "filename": filename}
    rows = [row("VD", "illusion", "0", "0", "1", "1", "./VD/illusion/0_0.png"),
            row("VD", "illusion", "0", "1", "2", "0", "./VD/illusion/0_1.png"),
            row("VS", "chart", "1", "0", "0", "1", None),
            row("VS", "chart", "1", "1", "1", "0", "./VS/chart/1_1.png")]
    data = tmp_path / "HallusionBench.json"
    data.write_text(json.dumps(rows))
    # VLMEvalKit's table holds only questions with a figure (image_base.py:154-155); the ids are the
    # 4th-6th parts of index (yorn.py:117-119); l2-category `VD_illusion` as VLMEvalKit's TSV has it
    # (metrics.l2_category)
    table = [{"index": f"hb_{c}_{s}_{st}_{f}_0", "question": "Q?", "answer": a, "category": c,
              "l2-category": f"{c}_{s}", "prediction": p}
             for c, s, st, f, a, p in (("VD", "illusion", "0", "0", "Yes", "Yes"),
                                       ("VD", "illusion", "0", "1", "No", "Yes"),
                                       ("VS", "chart", "1", "1", "No", "No"))]
    return data, table


@pytest.mark.parametrize("bare", [False, True],
                         ids=["l2-category VD_illusion", "l2-category illusion"])
def test_hallusionbench_table_joined_to_its_data(tmp_path, bare):
    data, rows = _hallusionbench(tmp_path)
    for row in rows if bare else ():
        row["l2-category"] = row["l2-category"].split("_", 1)[1]
    table = _table(tmp_path / "m_HallusionBench.tsv", rows)
    assert detect_benchmark(table) is HallusionBench
    responses = HallusionBench.responses(table, HallusionBench.questions(data))
    assert [(r.key, r.split) for r in responses] == [("VD_illusion_0_0_0", "VD-original"),
                                                     ("VD_illusion_0_1_0", "VD-edited"),
                                                     ("VS_chart_1_1_0", "VS-original")]
    result = CliRunner().invoke(main,
                                ["score", str(table), "--data", str(data), "--format", "json"])
    assert result.exit_code == 0, result.output
    # Hallusion_rating: right [1, 0, 1] -> aAcc 200/3; figures illusion_0_0, illusion_0_1, chart_1_1
    # -> 2 of 3; question pairs illusion_0_0 [1, 0] and chart_1_0 [1] -> 1 of 2
    scored = json.loads(result.output)["runs"][0]["rules"]["vlmevalkit"]
    assert (scored["aAcc"], scored["fAcc"], scored["qAcc"]) == (2 / 3 * 100, 2 / 3 * 100, 50.0)
    # its rows are the table's own l2-category values, as Hallusion_rating groups them
    # (yorn.py:136-143)
    l2 = ("illusion", "chart") if bare else ("VD_illusion", "VS_chart")
    assert [(r["split"], r["aAcc"]) for r in scored["rows"]] \
        == [("Overall", 2 / 3 * 100), ("VD", 50.0), ("VS", 100.0), *sorted(zip(l2, (50.0, 100.0)))]


def test_hallusionbench_table_groups_by_its_own_l2_category_column(tmp_path):
    """A table whose l2-category is the bare subcategory files VD's and VS's ocr figures under one
    `ocr`: its figures (`l2-category_set_id_figure_id`, yorn.py:110) are VLMEvalKit's, one figure of
    two questions here."""
    def row(category, visual, answer):
        return {"category": category, "subcategory": "ocr", "visual_input": visual, "set_id": "0",
                "figure_id": "1", "sample_note": "", "question_id": "0",
                "question": f"Q {category}?", "gt_answer_details": "", "gt_answer": answer,
                "filename": f"./{category}/ocr/0_1.png"}
    data = tmp_path / "HallusionBench.json"
    data.write_text(json.dumps([row("VD", "2", "1"), row("VS", "1", "1")]))
    table = [{"index": f"hb_{c}_ocr_0_1_0", "question": "Q?", "answer": "Yes", "category": c,
              "l2-category": l2, "prediction": p}
             for c, l2, p in (("VD", "ocr", "Yes"), ("VS", "ocr", "No"))]
    tsv = _table(tmp_path / "m_HallusionBench.tsv", table)
    result = CliRunner().invoke(main, ["score", str(tsv), "--data", str(data), "--format", "json"])
    assert result.exit_code == 0, result.output
    scored = json.loads(result.output)["runs"][0]["rules"]["vlmevalkit"]
    # composed names: 50.0 each
    assert (scored["aAcc"], scored["fAcc"], scored["qAcc"]) == (50.0, 0.0, 0.0)
    assert [r["split"] for r in scored["rows"]] == ["Overall", "VD", "VS", "ocr"]


def test_hallusionbench_table_needs_its_data_and_agreeing_answers(tmp_path):
    data, rows = _hallusionbench(tmp_path)
    table = _table(tmp_path / "t.tsv", rows)
    with pytest.raises(DataError, match=r"t\.tsv: .*no visual_input.*--data"):
        HallusionBench.responses(table)
    rows[1]["answer"] = "Yes"
    with pytest.raises(DataError,
                       match=r"t\.tsv:3: question VD_illusion_0_1_0 has answer 'Yes'; "
                             "the question data says no"):
        HallusionBench.responses(_table(table, rows), HallusionBench.questions(data))
    rows[1]["index"] = "hb_VD_illusion_7_1_0"
    with pytest.raises(DataError,
                       match=r"t\.tsv:3: question VD_illusion_7_1_0 is not in the question data"):
        HallusionBench.responses(_table(table, rows), HallusionBench.questions(data))


def test_xlsx_stays_refused_in_one_line(tmp_path):
    sheet = tmp_path / "m_MME.xlsx"
    sheet.write_bytes(b"PK\x03\x04")
    result = CliRunner().invoke(main, ["score", str(sheet)])
    assert result.exit_code != 0 and "PRED_FORMAT=tsv" in result.output \
        and len(result.output.strip().splitlines()) == 1


def _pope_rows():
    return [{"index": str(i), "question": f"Is there a thing {i} in the image?",
             "answer": "Yes" if i % 2 else "No", "category": "adversarial",
             "prediction": "Yes" if i % 3 else "No"} for i in range(1, 9)]


@pytest.mark.parametrize("line", [3, 7])
def test_a_quote_left_open_is_refused_not_a_row_lost(tmp_path, line):
    """A POPE table (every field quoted, as VLMEvalKit writes it) whose row on `line` lost the quote
    closing its prediction: the lenient reader merged it with the next row and scored 7 rows of 8
    without a word; it is refused naming the line after which the broken row starts. The same table
    whole scores 8."""
    good = _table(tmp_path / "good_POPE.csv", _pope_rows(), delimiter=",")
    lines = good.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[line] = lines[line].rstrip("\r\n")[:-1] + "\r\n"
    bad = tmp_path / "model_POPE.csv"
    bad.write_text("".join(lines), encoding="utf-8")
    result = CliRunner().invoke(main, ["score", str(good)])
    assert result.exit_code == 0 and "n=8" in result.output, result.output
    result = CliRunner().invoke(main, ["score", str(bad)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"model_POPE.csv: the row after line {line} is no well-formed ','-separated row" \
        in result.output


def test_a_bom_and_a_padded_index_read_as_the_table_means_them(tmp_path):
    """A spreadsheet's BOM before the header and an index with spaces around it (saved by hand) read
    as the clean table; the same index twice, once padded, is refused as a repeat."""
    rows = _pope_rows()
    clean = _table(tmp_path / "clean_POPE.tsv", rows)
    padded = [{**r, "index": f" {r['index']} "} for r in rows]
    bom = _table(tmp_path / "bom_POPE.tsv", padded)
    bom.write_bytes(b"\xef\xbb\xbf" + bom.read_bytes())
    outputs = [CliRunner().invoke(main, ["score", str(p), "--format", "json"])
               for p in (clean, bom)]
    assert [o.exit_code for o in outputs] == [0, 0], outputs[1].output
    scored = [{k: v for k, v in json.loads(o.output)["runs"][0].items() if k != "source"}
              for o in outputs]
    assert scored[0] == scored[1] and scored[0]["n"] == 8
    twice = _table(tmp_path / "twice_POPE.tsv", rows + [{**rows[0], "index": " 1"}])
    result = CliRunner().invoke(main, ["score", str(twice)])
    assert result.exit_code == 1 and "index 1 repeats" in result.output, result.output


def test_an_mme_result_missing_subtasks_is_marked_partial(tmp_path):
    """A result holding 1 of Perception's 10 subtasks and 1 of Cognition's 4: each total is marked
    partial, naming the subtasks missing, in the table (a '!' line) and the JSON; all 14 present,
    nothing is marked."""
    result = score_responses(_table(tmp_path / "m_MME.tsv", _mme_rows()), MME)
    perception, cognition = result["checks"]
    assert perception.startswith("Perception is a partial total: 1 of its 10 subtasks "
                                 "(missing: existence, count, position, posters")
    assert cognition.startswith("Cognition is a partial total: 1 of its 4 subtasks "
                                "(missing: commonsense_reasoning")
    printed = CliRunner().invoke(main, ["score", str(tmp_path / "m_MME.tsv")])
    assert "! Perception is a partial total" in printed.output \
        and "! Cognition is a partial total" in printed.output
    from pope_fast.readout.benchmarks.mme.rules import SUBTASKS

    rows = [{**row, "index": f"{subtask}-{i}", "category": subtask,
             "image_path": f"{subtask}/{row['image_path']}"}
            for subtask in SUBTASKS for i, row in enumerate(_mme_rows()[:2])]
    assert score_responses(_table(tmp_path / "all_MME.tsv", rows), MME)["checks"] == []


def test_every_score_json_is_one_shape_and_pope_formats_are_refused_on_a_benchmark(tmp_path):
    """A benchmark's --format json is {"runs": [...]} as POPE's and --protocol's are; models and
    latex (POPE's multi-model tables) are refused on it in one line, not answered with the markdown
    table."""
    table = _table(tmp_path / "m_MME.tsv", _mme_rows())
    scored = json.loads(CliRunner().invoke(main, ["score", str(table), "--format", "json"]).output)
    assert list(scored) == ["runs"] and scored["runs"][0]["benchmark"] == "mme"
    for fmt in ("models", "latex"):
        result = CliRunner().invoke(main, ["score", str(table), "--format", fmt])
        assert result.exit_code == 1 \
            and f"--format {fmt}: a benchmark's scores come as" in result.output


def test_score_protocol_on_a_benchmark_selects_that_tools_rule(tmp_path):
    """`score FILE --benchmark NAME --protocol TOOL`, the shape POPE's users know: that tool's rule
    alone (its numbers as under all rules), no readouts; HallusionBench's lmms-eval rule answers to
    --protocol lmms-eval; a tool the benchmark has no rule of is refused naming the rules it has."""
    table = _table(tmp_path / "m_MME.tsv", _mme_rows())
    every = score_responses(table, MME)["rules"]
    out = CliRunner().invoke(main,
                             ["score", str(table), "--protocol", "vlmevalkit", "--format", "json"])
    assert out.exit_code == 0, out.output
    [run] = json.loads(out.output)["runs"]
    assert run["rules"] == {"vlmevalkit": every["vlmevalkit"]} and run.get("readouts", {}) == {}
    from pope_fast.readout.benchmarks.score import rule_of

    assert rule_of(HallusionBench, "lmms-eval") == "lmms-eval-rule"
    refused = CliRunner().invoke(main,
                                 ["score", str(table), "--benchmark", "mme", "--protocol", "llava"])
    assert refused.exit_code == 1 and "mme has no rule of that tool's " \
        "(its rules: official, lmms-eval, vlmevalkit)" in refused.output
