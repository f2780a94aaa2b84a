"""HallusionBench: its question file, the three rules' aggregations on answers built by hand
(expected values derived in the comments), result files read back and written for the official
script, and bad input refused."""
import csv
import io
import json
import re

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout.benchmarks.base import Answer
from pope_fast.readout.benchmarks.hallusionbench.benchmark import (HallusionBench, rows,
                                                                   write_results)
from pope_fast.readout.benchmarks.hallusionbench.metrics import fields, lmms_eval_read
from pope_fast.readout.data import DataError


def _row(category, subcategory, set_id, figure_id, question_id, visual_input, gt):
    filename = None if visual_input == "0" \
        else f"./{category}/{subcategory}/{set_id}_{figure_id}.png"
    return {"category": category, "subcategory": subcategory, "visual_input": visual_input,
            "set_id": set_id, "figure_id": figure_id, "sample_note": "note",
            "question_id": question_id,
            "question": f"Is it {category} {subcategory} {set_id}/{figure_id}/{question_id}?",
            "gt_answer_details": "reference", "gt_answer": gt, "filename": filename}


# 11 questions: 7 figures (VS figure 0 is none), 5 pairs, 5 easy groups, 4 hard ones. VD ocr and VS
# ocr share set 0: VLMEvalKit's keys hold its l2-category (`VD_ocr`, `VS_ocr`), so their figures and
# pairs stay apart.
MINI = [_row("VD", "illusion", "0", "0", "0", "1", "1"),
        _row("VD", "illusion", "0", "0", "1", "1", "0"),
        _row("VD", "illusion", "0", "1", "0", "2", "0"),
        _row("VD", "illusion", "0", "1", "1", "2", "1"),
        _row("VS", "chart", "0", "0", "0", "0", "1"), _row("VS", "chart", "0", "1", "0", "1", "1"),
        _row("VS", "chart", "0", "2", "0", "2", "0"),
        _row("VS", "ocr", "0", "0", "0", "0", "0"), _row("VS", "ocr", "0", "1", "0", "1", "0"),
        _row("VD", "ocr", "0", "0", "0", "1", "1"), _row("VD", "ocr", "0", "1", "0", "2", "0")]
HEADLINE = ("qAcc", "fAcc", "easy aAcc", "hard aAcc", "aAcc")


def _write(path, items):
    path.write_text(json.dumps(items))
    return path


@pytest.fixture
def mini(tmp_path):
    return HallusionBench.questions(_write(tmp_path / "HallusionBench.json", MINI))


@pytest.fixture(scope="module")
def real(shared):
    path = shared / "benchmarks/hallusionbench/HallusionBench.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return path


def _answers(questions, wrong=(), unknown=()):
    flip = {"yes": "no", "no": "yes"}
    return [Answer(q.key, q.split, q.image, q.label,
                   "unknown" if q.key in unknown else flip[q.label] if q.key in wrong else q.label)
            for q in questions]


def _score(rule, answers):
    return HallusionBench.rules[rule].aggregate(answers)


def _headline(rule, answers):
    out = _score(rule, answers)
    return {k: out[k] for k in HallusionBench.rules[rule].headline}


def test_real_file_counts(real):
    """README's counts, and evaluation.py's own (figures without VS figure 0, pairs, easy/hard
    groups)."""
    questions = HallusionBench.questions(real)
    assert len(questions) == 1129 and len({q.key for q in questions}) == 1129
    assert sum(q.image == "" for q in questions) == 178
    assert all(q.split == "VS-none" for q in questions if q.image == "")
    assert [sum(q.label == v for q in questions) for v in ("yes", "no")] == [484, 645]
    splits = {s: sum(q.split == s for q in questions) for s in {q.split for q in questions}}
    assert splits \
        == {"VD-original": 277, "VD-edited": 314, "VS-none": 178, "VS-original": 170,
            "VS-edited": 190}
    first = questions[0]
    assert (first.key, first.dataset, first.label, first.image) \
        == ("VS_chart_0_0_0", "hallusionbench", "no", "")
    assert next(q.image for q in questions if q.key == "VS_table_7_1_5") == "VS/table/7_1.png"
    out = _score("official", _answers(questions))
    assert {k: out[k] for k in HEADLINE} == dict.fromkeys(HEADLINE, 100.0)
    assert (out["questions"], out["figures"], out["figures VD"], out["figures VS"]) \
        == (1129, 346, 230, 116)
    assert (out["pairs"], out["easy pairs"], out["hard pairs"]) == (455, 455, 430)
    assert (out["easy questions VD"], out["easy questions VS"]) == (277, 348)
    assert (out["hard questions VD"], out["hard questions VS"]) == (314, 190)


def test_real_file_one_wrong_figure_0_vd_answer(real):
    """One wrong answer on VD_illusion_0_0_0 (an original image, easy): aAcc loses 1 of 1,129
    questions, fAcc 1 of 346 figures, qAcc and easy aAcc 1 of 455 groups; hard aAcc keeps 100."""
    questions = HallusionBench.questions(real)
    out = _score("official", _answers(questions, wrong={"VD_illusion_0_0_0"}))
    assert out["aAcc"] == round(100 * 1128 / 1129, 4) == 99.9114
    assert out["fAcc"] == round(100 * 345 / 346, 4) == 99.711
    assert out["qAcc"] == out["easy aAcc"] == round(100 * 454 / 455, 4) == 99.7802
    assert out["hard aAcc"] == 100.0


def test_real_file_vlmevalkit_groups_hold_the_category(real):
    """VLMEvalKit scores the 951 image questions; its l2-category holds VD/VS (`VD_ocr`), so the 14
    VD ocr figures whose set and figure ids a VS ocr figure also has keep their own key: 346 figures
    and 455 pairs, the counts of the score file in VLMEvalKit#825 (131/346, 200/455), not 332 and
    429. One wrong answer on such a figure costs 1/346 of fAcc, and its VD and VD_ocr rows 1/230 and
    1/43, VS_ocr nothing."""
    questions = HallusionBench.questions(real)
    vs_ocr = {(fields(q.key).set_id, fields(q.key).figure_id) for q in questions
              if q.key.startswith("VS_ocr_") and q.image}
    shared_key = next(q.key for q in questions
                      if q.key.startswith("VD_ocr_")
                      and (fields(q.key).set_id, fields(q.key).figure_id) in vs_ocr)
    answers = _answers(questions, wrong={shared_key})
    vlmevalkit, official = _score("vlmevalkit", answers), _score("official", answers)
    assert (vlmevalkit["aAcc"], vlmevalkit["fAcc"], vlmevalkit["qAcc"]) \
        == (950 / 951 * 100, 345 / 346 * 100, 454 / 455 * 100)
    by_split = {row["split"]: row for row in vlmevalkit["rows"]}
    assert list(by_split) == ["Overall", "VD", "VS", "VD_figure", "VD_illusion", "VD_math",
                              "VD_ocr", "VD_video", "VS_chart", "VS_map", "VS_ocr", "VS_table"]
    assert (by_split["VD"]["aAcc"], by_split["VD"]["fAcc"], by_split["VD"]["qAcc"]) == (
        590 / 591 * 100, 229 / 230 * 100, 276 / 277 * 100)
    assert (by_split["VD_ocr"]["aAcc"], by_split["VD_ocr"]["fAcc"], by_split["VD_ocr"]["qAcc"]) == (
        88 / 89 * 100, 42 / 43 * 100, 42 / 43 * 100)
    assert all(by_split[s][k] == 100.0 for s in ("VS", "VS_ocr", "VD_math")
               for k in ("aAcc", "fAcc", "qAcc"))
    assert official["fAcc"] == round(100 * 345 / 346, 4) \
        and official["qAcc"] == round(100 * 454 / 455, 4)


def test_all_correct_is_100_under_every_rule(mini):
    answers = _answers(mini)
    assert {k: _score("official", answers)[k] for k in HEADLINE} == dict.fromkeys(HEADLINE, 100.0)
    assert _headline("vlmevalkit", answers) == {"aAcc": 100.0, "fAcc": 100.0, "qAcc": 100.0}
    # fractions, its unit
    assert _score("lmms-eval-rule", answers) == {"aAcc": 1.0, "qAcc": 1.0, "fAcc": 1.0}


def test_one_wrong_figure_0_vd_answer(mini):
    """VD_illusion_0_0_0 wrong: aAcc 10/11 = 90.9091 (100 - 100/11), fAcc 6/7 = 85.7143 (its
    figure), qAcc 4/5 = 80 (its pair), easy aAcc 4/5 = 80 (the pair's easy group), hard aAcc 4/4 =
    100."""
    out = _score("official", _answers(mini, wrong={"VD_illusion_0_0_0"}))
    assert {k: out[k] for k in HEADLINE} == {"qAcc": 80.0, "fAcc": 85.7143, "easy aAcc": 80.0,
                                             "hard aAcc": 100.0, "aAcc": 90.9091}
    # the consistency test: 6 of 7 figures correct; the wrong figure has 1 of 2 right, so
    # inconsistent
    assert (out["Consistency Test (correct)"], out["Consistency Test (inconsistent)"],
            out["Consistency Test (wrong)"]) == (85.7143, 14.2857, 0.0)
    # yes_ratio_stats as written: its "yes" is correct == gt; 10 right answers (5 of them to yes
    # questions) and the wrong one to a yes question give 5/11 "yes" against 6/11 gt yes; the one
    # wrong row is gt yes, FP ratio 0
    assert out["Yes/No Bias (Pct Diff)"] == pytest.approx(5 / 11 - 6 / 11)
    assert out["Yes/No Bias (FP Ratio)"] == 0.0


def test_unknown_counts_correct_only_without_the_figure(mini):
    """assign_correctness's 'unclear' (code 2) is correct on VS figure 0 only: an unknown there
    leaves 100; on VS_chart_0_1_0 (figure 1) it is wrong officially and under VLMEvalKit's exact
    matching."""
    assert _score("official", _answers(mini, unknown={"VS_chart_0_0_0"}))["aAcc"] == 100.0
    out = _score("official", _answers(mini, unknown={"VS_chart_0_1_0"}))
    # aAcc 10/11; fAcc 6/7 (figure VS_chart_0_1); qAcc 4/5 (pair VS_chart_0_0); easy 4/5 (vi 1);
    # hard 4/4
    assert {k: out[k] for k in HEADLINE} == {"qAcc": 80.0, "fAcc": 85.7143, "easy aAcc": 80.0,
                                             "hard aAcc": 100.0, "aAcc": 90.9091}
    # VLMEvalKit's 9 image questions: aAcc 8/9; figures (7 keys) 6/7; pairs (5 keys) 4/5
    assert _headline("vlmevalkit", _answers(mini, unknown={"VS_chart_0_1_0"})) == pytest.approx(
        {"aAcc": 800 / 9, "fAcc": 600 / 7, "qAcc": 80.0})


def test_tools_leave_the_image_less_questions_out(mini):
    """Both image-less answers wrong: officially aAcc 9/11 = 81.8182, qAcc 3/5 (pairs VS_chart_0_0,
    VS_ocr_0_0), easy aAcc 3/5, fAcc 100 (VS figure 0 is no figure); VLMEvalKit's and lmms-eval's
    data lack those questions."""
    answers = _answers(mini, wrong={"VS_chart_0_0_0", "VS_ocr_0_0_0"})
    out = _score("official", answers)
    assert {k: out[k] for k in HEADLINE} == {"qAcc": 60.0, "fAcc": 100.0, "easy aAcc": 60.0,
                                             "hard aAcc": 100.0, "aAcc": 81.8182}
    assert _headline("vlmevalkit", answers) == {"aAcc": 100.0, "fAcc": 100.0, "qAcc": 100.0}
    assert _score("lmms-eval-rule", answers) == {"aAcc": 1.0, "qAcc": 1.0, "fAcc": 1.0}


@pytest.mark.parametrize("wrong, other", [("VD_ocr_0_1_0", "VS_ocr"), ("VS_ocr_0_1_0", "VD_ocr")])
def test_vlmevalkit_keeps_vd_and_vs_ocr_apart(mini, wrong, other):
    """Either ocr figure 1 wrong: officially fAcc 6/7 and qAcc 4/5 (its own figure and pair), and so
    under VLMEvalKit, whose keys `VD_ocr_0_1` and `VS_ocr_0_1` differ: aAcc 8/9, fAcc 6/7, qAcc 4/5
    (merged keys would give 5/6 and 3/4); its own l2-category's row loses, the other ocr row stays
    100."""
    answers = _answers(mini, wrong={wrong})
    official = _score("official", answers)
    assert (official["fAcc"], official["qAcc"]) == (85.7143, 80.0)
    assert _headline("vlmevalkit", answers) \
        == {"aAcc": 8 / 9 * 100, "fAcc": 6 / 7 * 100, "qAcc": 4 / 5 * 100}
    by_split = {row["split"]: row for row in _score("vlmevalkit", answers)["rows"]}
    assert by_split[other] == {"split": other, "aAcc": 100.0, "fAcc": 100.0, "qAcc": 100.0}
    assert by_split[wrong[:6]]["fAcc"] < 100.0


# Two wrong image answers (VD_illusion_0_1_1, VS_ocr_0_1_0) and one wrong image-less one (left out).
# Hallusion_rating (yorn.py:96-145) on the 9 image questions, np.mean(...) * 100 unrounded, keys
# holding the l2-category:
#   Overall  aAcc 7/9; figures VD_illusion_0_0 VD_illusion_0_1(x) VS_chart_0_1 VS_chart_0_2
#            VS_ocr_0_1(x) VD_ocr_0_0 VD_ocr_0_1: 5/7; pairs VD_illusion_0_0 VD_illusion_0_1(x)
#            VS_chart_0_0 VS_ocr_0_0(x) VD_ocr_0_0: 3/5
#   VD       6 questions 5 right; figures 3/4; pairs 2/3
#   VS       3 questions 2 right; figures 2/3; pairs 1/2
#   VD_illusion 3/4, 1/2, 1/2   VD_ocr 2/2, 2/2, 1/1   VS_chart 2/2, 2/2, 1/1   VS_ocr 0/1, 0/1, 0/1
BREAKDOWN_WRONG = {"VD_illusion_0_1_1", "VS_ocr_0_1_0", "VS_chart_0_0_0"}
BREAKDOWN = [("Overall", 7 / 9, 5 / 7, 3 / 5), ("VD", 5 / 6, 3 / 4, 2 / 3),
             ("VS", 2 / 3, 2 / 3, 1 / 2),
             ("VD_illusion", 3 / 4, 1 / 2, 1 / 2), ("VD_ocr", 1.0, 1.0, 1.0),
             ("VS_chart", 1.0, 1.0, 1.0), ("VS_ocr", 0.0, 0.0, 0.0)]
BREAKDOWN_ROWS = [{"split": s, "aAcc": a * 100, "fAcc": f * 100, "qAcc": q * 100}
                  for s, a, f, q in BREAKDOWN]


def test_vlmevalkit_score_file_rows(mini):
    """Hallusion_rating's rows: Overall, each category, each l2-category (category sorted, its own
    order being a set's), every value as its mean-then-times-100 gives it, bit for bit; the headline
    is the Overall row."""
    out = _score("vlmevalkit", _answers(mini, wrong=BREAKDOWN_WRONG))
    assert out["rows"] == BREAKDOWN_ROWS
    assert {k: out[k] for k in ("aAcc", "fAcc", "qAcc")} \
        == {k: BREAKDOWN_ROWS[0][k] for k in ("aAcc", "fAcc", "qAcc")}
    assert HallusionBench.rules["vlmevalkit"].rows == "rows"
    # no image question: its Overall row alone, None, where numpy's mean would be nan
    imageless = _answers([q for q in mini if q.split == "VS-none"])
    assert [r["split"] for r in _score("vlmevalkit", imageless)["rows"]] == ["Overall"]


def _result_file(tmp_path, mini):
    texts = {q.key: {"yes": "No", "no": "Yes"}[q.label] if q.key in BREAKDOWN_WRONG
             else q.label.capitalize() for q in mini}
    return write_results(tmp_path / "HallusionBench_result.json",
                         rows(tmp_path / "HallusionBench.json"), texts)


def test_score_prints_vlmevalkits_rows_in_every_format(tmp_path, mini):
    """`score` on a result file: the rows under the vlmevalkit rule in the table (6 significant
    digits, as every benchmark table), in csv and json at full precision."""
    path = _result_file(tmp_path, mini)
    table = CliRunner().invoke(main, ["score", str(path)])
    assert table.exit_code == 0, table.output
    block = table.output.split("`vlmevalkit`'s score file, its rows:\n")[1].split("\n\n")[0]
    rows_block = block.splitlines()
    assert rows_block[0] == "| split | aAcc | fAcc | qAcc |"
    assert rows_block[2:] == [f"| {s} | {a * 100:.6g} | {f * 100:.6g} | {q * 100:.6g} |"
                              for s, a, f, q in BREAKDOWN]
    assert rows_block[3] == "| VD | 83.3333 | 75 | 66.6667 |"
    printed = CliRunner().invoke(main, ["score", str(path), "--format", "json"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output)["runs"][0]["rules"]["vlmevalkit"]["rows"] == BREAKDOWN_ROWS
    printed = CliRunner().invoke(main, ["score", str(path), "--format", "csv"])
    assert printed.exit_code == 0, printed.output
    lines = list(csv.DictReader(io.StringIO(printed.output)))
    assert [(r["row"], r["metric"], float(r["value"])) for r in lines
            if r["name"] == "vlmevalkit"] == [
        (row["split"], k, row[k]) for row in BREAKDOWN_ROWS for k in ("aAcc", "fAcc", "qAcc")]
    official = {r["metric"]: r["value"] for r in lines if r["name"] == "official"}
    assert (lines[0]["source"], lines[0]["benchmark"], lines[0]["aggregation"]) \
        == (str(path), "hallusionbench", "rule")
    # the official rule's headline, rounded to 4 places as evaluation.py rounds: aAcc 8/11; figures
    # 5/7; pairs 2/5 (VS_chart_0_0 holds the wrong image-less answer); easy groups 3/5; hard 3/4
    assert official == {"qAcc": "40.0", "fAcc": "71.4286", "easy aAcc": "60.0", "hard aAcc": "75.0",
                        "aAcc": "72.7273"}


def test_lmms_eval_rule_reads_a_substring_and_gives_unknown_no(mini):
    assert [lmms_eval_read(t) for t in ("Yesterday it rained.", "No.", "I cannot tell.", "YES")] \
        == ["yes", "no", "no", "yes"]
    # unknown is its '0': right on VS_ocr_0_1_0 (gt no), wrong on VS_chart_0_1_0 (gt yes). Of the 9
    # image questions 8 right; its pair keys hold the category: 5 pairs, VS_chart_0_0 wrong (4/5); 7
    # figures, VS_chart_0_1 wrong (6/7)
    out = _score("lmms-eval-rule", _answers(mini, unknown={"VS_ocr_0_1_0", "VS_chart_0_1_0"}))
    assert out == pytest.approx({"aAcc": 8 / 9, "qAcc": 4 / 5, "fAcc": 6 / 7})


def test_per_split_groups_have_no_figure_or_hard_group(mini):
    """The VS-none split alone (score's per-split run): its 2 questions, no figure, no hard group:
    None, not a ZeroDivisionError as evaluation.py:91 raises."""
    out = _score("official", _answers([q for q in mini if q.split == "VS-none"]))
    assert (out["aAcc"], out["qAcc"], out["fAcc"], out["hard aAcc"]) == (100.0, 100.0, None, None)
    assert _score("vlmevalkit", _answers([q for q in mini if q.split == "VS-none"]))["aAcc"] is None


def test_a_split_that_contradicts_the_key_is_refused(mini):
    bad = [Answer("VD_illusion_0_0_0", "VS-original", "x.png", "yes", "yes")]
    with pytest.raises(ValueError, match="not of category VD"):
        _score("official", bad)
    with pytest.raises(ValueError, match="not a HallusionBench split"):
        _score("official", [Answer("VD_illusion_0_0_0", "adversarial", "x.png", "yes", "yes")])


def test_rules_and_their_headlines(mini):
    assert list(HallusionBench.rules) == ["official", "lmms-eval-rule", "vlmevalkit"]
    for rule in HallusionBench.rules.values():
        assert set(rule.headline) <= set(rule.aggregate(_answers(mini))) and rule.sources
    # yorn: both words
    assert HallusionBench.rules["official"].read("Yes, there is no dog.") == "unknown"


def test_round_trip_write_results_then_responses(tmp_path, mini):
    """write_results keeps every row and its order and adds model_prediction; responses reads it
    back by key."""
    texts = {q.key: f"Answer to {q.key}" for q in mini}
    question_rows = rows(tmp_path / "HallusionBench.json")
    path = write_results(tmp_path / "HallusionBench_result.json", question_rows, texts)
    written = json.loads(path.read_text(encoding="ascii"))
    assert written == [{**row, "model_prediction": texts[q.key]} for row, q in zip(MINI, mini)]
    back = HallusionBench.responses(path, mini)
    assert [(r.key, r.split, r.text, r.label, r.image) for r in back] == \
        [(q.key, q.split, texts[q.key], q.label, q.image) for q in mini]
    assert back[2].line == f"{path} item 3"
    assert HallusionBench.detect(path) and HallusionBench.detect(tmp_path)


def test_write_results_needs_one_answer_per_question(tmp_path, mini):
    question_rows = rows(tmp_path / "HallusionBench.json")
    texts = {q.key: "yes" for q in mini[1:]}
    with pytest.raises(ValueError,
                       match="1 question.s. without an answer .first .'VD_illusion_0_0_0'"):
        write_results(tmp_path / "out.json", question_rows, texts)
    with pytest.raises(ValueError, match="1 answer.s. to no question"):
        write_results(tmp_path / "out.json", question_rows,
                      {**texts, "VD_illusion_0_0_0": "", "VD_x_9_9_9": ""})
    assert not (tmp_path / "out.json").exists()


def _result(row, **change):
    out = {**row, "model_prediction": "Yes."}
    out.update(change)
    return {k: v for k, v in out.items() if v is not KeyError}


@pytest.mark.parametrize("items, expected", [
    ([_result(MINI[0]), _result(MINI[1], set_id="7")],
     "item 2: question VD_illusion_7_0_1 is not in the question"),
    ([_result(MINI[0]), _result(MINI[0])], "item 2: question VD_illusion_0_0_0 repeats item 1"),
    ([_result(MINI[0], model_prediction=KeyError)], "item 1: missing field.s. model_prediction"),
    ([_result(MINI[0], visual_input=KeyError)], "item 1: missing field.s. visual_input"),
    ([_result(MINI[0], model_prediction=None)], "item 1: model_prediction is not a string"),
    ([_result(MINI[0], gt_answer="yes")], "item 1: gt_answer 'yes' is not '1' or '0'"),
    ([_result(MINI[0], gt_answer="0")],
     "item 1: question VD_illusion_0_0_0 differs from the question data"),
    ([_result(MINI[0], category="VX")], "item 1: category 'VX' is not VD or VS"),
    (["not an object"], "item 1: not a JSON object"),
], ids=["unknown-key", "duplicate", "no-prediction", "no-visual-input", "null-prediction", "bad-gt",
        "other-label", "bad-category", "not-object"])
def test_bad_result_files_are_refused_in_one_line(tmp_path, mini, items, expected):
    path = _write(tmp_path / "HallusionBench_result.json", items)
    with pytest.raises(DataError, match=expected) as err:
        HallusionBench.responses(path, mini)
    assert str(err.value).startswith(f"{path} item ") and "\n" not in str(err.value)
    # `score` tells the file as HallusionBench's and says the same (a row without visual_input was
    # "neither pope-fast JSON-lines records nor a ugaa-research record file")
    if items != ["not an object"]:
        result = CliRunner().invoke(main, ["score", str(path), "--data",
                                           str(tmp_path / "HallusionBench.json")])
        assert result.exit_code != 0 and re.search(expected, result.output) \
            and "neither" not in result.output, result.output


@pytest.mark.parametrize("text, expected", [('[{"category": "VD",', ":1: malformed JSON"),
                                            ('{"category": "VD"}', ": not a JSON list")])
def test_non_json_result_files_are_refused(tmp_path, text, expected):
    path = tmp_path / "HallusionBench_result.json"
    path.write_text(text)
    with pytest.raises(DataError, match=expected) as err:
        HallusionBench.responses(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_responses_without_questions_take_the_file_labels(tmp_path):
    path = _write(tmp_path / "r.json", [_result(MINI[4]), _result({k: v for k, v in MINI[5].items()
                                                                   if k != "gt_answer"})])
    back = HallusionBench.responses(path)
    assert [(r.key, r.split, r.label, r.image) for r in back] == [
        ("VS_chart_0_0_0", "VS-none", "yes", ""),
        ("VS_chart_0_1_0", "VS-original", None, "VS/chart/0_1.png")]


@pytest.mark.parametrize("items, expected", [
    (MINI + [MINI[3]], "item 12: question VD_illusion_0_1_1 repeats item 4"),
    ([{k: v for k, v in MINI[0].items() if k != "question"}], "item 1: missing field.s. question"),
    ([{**MINI[0], "filename": None}], "item 1: visual_input '1' needs a filename"),
    ([{**MINI[4], "filename": "./VS/chart/0_0.png"}],
     "item 1: visual_input '0' .no figure. but filename"),
    ([{**MINI[0], "set_id": "0_1"}], "item 1: set_id cannot make a key"),
], ids=["duplicate", "no-question", "no-filename", "filename-without-figure", "underscore-id"])
def test_bad_question_files_are_refused(tmp_path, items, expected):
    path = _write(tmp_path / "HallusionBench.json", items)
    with pytest.raises(DataError, match=expected) as err:
        HallusionBench.questions(path)
    assert str(err.value).startswith(f"{path} item ")


def test_detect_real_file(real):
    assert HallusionBench.detect(real) and HallusionBench.detect(real.parent)


def test_detect(tmp_path, mini):
    assert HallusionBench.detect(tmp_path / "HallusionBench.json") \
        and HallusionBench.detect(tmp_path)
    (tmp_path / "HallusionBench.json").unlink()
    pope = tmp_path / "coco_pope_random.json"
    pope.write_text('{"question_id": 1, "image": "a.jpg", "text": "Is there a dog?", '
                    '"label": "yes"}\n')
    # a row without visual_input is still HallusionBench's (reading it names the field); one without
    # its ids is not
    lacking = _write(tmp_path / "lacking.json",
                     [{k: v for k, v in MINI[0].items() if k != "visual_input"}])
    assert HallusionBench.detect(lacking)
    lacking.unlink()
    other = _write(tmp_path / "other.json", [{k: v for k, v in MINI[0].items() if k != "set_id"}])
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    assert not any(HallusionBench.detect(p) for p in (pope, other, broken, tmp_path / "absent.json",
                                                      tmp_path))


def test_fields_parse_the_official_key():
    ids = fields("VS_chart_12_1_3")
    assert (ids.category, ids.subcategory, ids.set_id, ids.figure_id, ids.question_id) \
        == ("VS", "chart", "12", "1", "3")
    with pytest.raises(ValueError):
        fields("VS_chart_1_3")


@pytest.mark.parametrize("field", ["question", "filename"])
def test_a_lone_surrogate_in_a_question_is_named_by_item_and_field(tmp_path, field):
    """Issue 49: "\\ud800" is valid JSON but no Unicode text (no tokenizer or file name takes it).
    """
    rows = [dict(row) for row in MINI]
    rows[2][field] = rows[2][field].replace("0", "\ud800", 1)
    path = _write(tmp_path / "HallusionBench.json", rows)
    with pytest.raises(DataError) as refused:
        HallusionBench.questions(path)
    at = rows[2][field].index("\ud800") + 1
    assert str(refused.value) \
        == (f"{path} item 3: {field} {rows[2][field]!r} holds a lone surrogate ('\\ud800' at "
            f"character {at}), which is no Unicode text (a \\u escape of half a character "
            "pair?)")
