"""A readout that cannot decide says so (issue 48): a logit readout whose every candidate a method's
plausibility cut removed (-inf) answers unknown, and score, compare and report count why, per
readout and run; a readout with no answer has no F1 ("–", never the best of its row) and no say in
whether a ranking changes; McNemar's p = 1 beside a significant ΔF1 has its legend."""
import json
import math

from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import (Question, compare_runs, format_compare, format_runs, make_record,
                               read_records)
from pope_fast.readout import score_records
from pope_fast.readout.readouts import ALL_CUT, NON_FINITE
from pope_fast.readout.report import figure_data
from pope_fast.readout.report.compare_format import MCNEMAR_LEGEND
from pope_fast.readout.report.tables import f1_tables, format_f1_tables
from pope_fast.store import RecordWriter, write_meta

IDS = {"legacy_2tok": (3582, 1217), "template_aware": (3869, 1939)}
NAMES = list(IDS)
# a token below the plausibility cut, as a method's records hold it (null, read back as -inf)
CUT = -math.inf
LABELS = "yyyyyyyynnnnnnnn"


def _logits(answer: str) -> tuple[float, float]:
    """The (yes, no) candidate logits that answer 'y' or 'n', or 'c': both cut, 'N': a NaN on the
    yes side."""
    return {"y": (1.0, 0.0), "n": (0.0, 1.0), "c": (CUT, CUT), "N": (math.nan, 0.0)}[answer]


def _run(folder, answers: dict[str, str], method: str = "none"):
    """A run folder of len(LABELS) adversarial questions whose readouts answer as `answers` spells
    it per question."""
    folder.mkdir(parents=True)
    write_meta(folder, {"model": {"family": "llava"}, "template": "llava_plain", "readouts": NAMES,
                        "token_sets": {n: {"yes_ids": [y], "no_ids": [no]}
                                       for n, (y, no) in IDS.items()},
                        "tokenizer": {"library_versions": {"transformers": "5.25.0"}},
                        "settings": {"resolved_dtype": "float32"}, "method": {"name": method}})
    records = []
    for i, label in enumerate(LABELS):
        q = Question(i + 1, f"COCO_{i}.jpg", "Is there a dog in the image?",
                     {"y": "yes", "n": "no"}[label], "adversarial", "coco")
        logits = {}
        for name, (yes_id, no_id) in IDS.items():
            logits[yes_id], logits[no_id] = _logits(answers[name][i])
        records.append(make_record(q, "llava_plain", first_token_id=29871, candidate_logits=logits,
                                   image_sha256="0" * 64))
    with RecordWriter(folder) as w:
        w.write(records)
    return folder


def _score(folder):
    [run] = score_records(read_records(folder), NAMES)
    return run


def test_every_candidate_cut_is_unknown_and_counted_per_readout(tmp_path):
    # VCD's cut left no candidate of legacy_2tok (ids the model never emits) and only the no side of
    # template_aware on the last question: that one is the method's answer, not a reason
    b = _run(tmp_path / "vcd", {"legacy_2tok": "c" * 16, "template_aware": LABELS[:-1] + "c"},
             "vcd")
    run = _score(b)
    legacy, aware = run["readouts"]["legacy_2tok"], run["readouts"]["template_aware"]
    # was 16 "no"
    assert (legacy["unknown"], legacy["tp"] + legacy["fp"] + legacy["tn"] + legacy["fn"]) == (16, 0)
    assert legacy["unknown_reasons"] == {ALL_CUT: 16}
    assert (aware["unknown"], aware["unknown_reasons"], aware["f1"]) == (1, {ALL_CUT: 1}, 1.0)
    table = format_runs([run], "table")
    row = next(line.split() for line in table.splitlines() if line.startswith("legacy_2tok"))
    # TP TN FP FN unk, acc (over every question: 0), then prec, rec, F1, its interval, yes-rate:
    # none without answers
    assert row[1:] == ["0", "0", "0", "0", "16", "0.0000", "–", "–", "–", "–", "–", "0.0000"]
    assert ("unknown, all candidates cut (every candidate logit -inf: "
            "the method's plausibility cut removed them): "
            "legacy_2tok 16 of 16, template_aware 1 of 16") in table
    shown = json.loads(format_runs([run], "json"))["runs"][0]["readouts"]
    assert shown["legacy_2tok"]["unknown_reasons"] == {"all candidates cut": 16}


def test_one_side_cut_is_the_methods_answer():
    from pope_fast.readout import READOUTS, TokenSets

    sets = TokenSets((3869,), (1939,))
    assert READOUTS["template_aware"](sets, {3869: CUT, 1939: -2.0}, None, None) == "no"
    assert READOUTS["template_aware"](sets, {3869: -2.0, 1939: CUT}, None, None) == "yes"


def test_a_nan_never_decides_and_is_its_own_reason(tmp_path):
    run = _score(_run(tmp_path / "nan", {"legacy_2tok": "N" + LABELS[1:],
                                         "template_aware": LABELS}))
    legacy = run["readouts"]["legacy_2tok"]
    assert (legacy["unknown"], legacy["unknown_reasons"]) == (1, {NON_FINITE: 1})
    assert run["non_finite"] == ["1"] and run["readouts"]["template_aware"]["unknown_reasons"] == {}
    assert ("unknown, non-finite logit (NaN or +inf among the candidates): legacy_2tok 1 of 16"
            in format_runs([run]))


def test_a_readout_with_no_answer_prints_no_f1_and_is_never_the_best(tmp_path):
    runs = [_score(_run(tmp_path / name, answers, name)) for name, answers in (
        ("none", {"legacy_2tok": "y" * 16, "template_aware": LABELS}),
        # all cut; all no: F1 0 of answers
        ("vcd", {"legacy_2tok": "c" * 16, "template_aware": "n" * 16}),
        # nothing answered at all
        ("pai", {"legacy_2tok": "c" * 16, "template_aware": "c" * 16}))]
    [table] = f1_tables(runs)
    assert [(r["cells"], r["best"]) for r in table["rows"]] == [
        (["0.6667", "1.0000"], [False, True]),
        (["–", "0.0000"], [False, True]),   # was 0.0000 and 0.0000, both bold
        (["–", "–"], [False, False])]       # an all-zero row had both bold
    # the F1 figure's grey "-"
    assert [r["values"] for r in table["rows"]][1:] == [[None, 0.0], [None, None]]
    assert table["notes"] == [
        "vcd: unknown, all candidates cut (every candidate logit -inf: "
        "the method's plausibility cut removed them): legacy_2tok 16 of 16",
        "pai: unknown, all candidates cut (every candidate logit -inf: "
        "the method's plausibility cut removed them): "
        "legacy_2tok 16 of 16, template_aware 16 of 16"]
    markdown, latex = format_f1_tables(runs), format_f1_tables(runs, "latex")
    assert "| pai | 16 | – | – |" in markdown and "| vcd | 16 | – | **0.0000** |" in markdown
    assert table["notes"][1] in markdown
    assert (r"pai & 16 & -- & -- \\" in latex
            and r"legacy\_2tok 16 of 16, template\_aware 16 of 16}" in latex)


def test_compare_leaves_readouts_without_answers_out_of_the_ranking(tmp_path):
    # legacy_2tok answered nothing in either run (every candidate cut); template_aware: B right
    # where A said no
    a = _run(tmp_path / "none", {"legacy_2tok": "c" * 16, "template_aware": "n" * 16})
    b = _run(tmp_path / "vcd", {"legacy_2tok": "c" * 16, "template_aware": LABELS}, "vcd")
    result = compare_runs([a, b])
    [pair] = result["pairs"]
    table, ranking = pair["splits"]["adversarial"], pair["ranking"]["adversarial"]
    assert table["template_aware"]["delta_f1_ci95"][0] > 0
    # before: legacy_2tok's ΔF1 0 [0, 0] beside an interval excluding 0 read as "the ranking
    # changes"
    assert not ranking["changes"] and ranking["no_answers"] == {"legacy_2tok": "A and B"}
    assert ranking["excludes_zero"] == ["template_aware"]
    assert table["legacy_2tok"]["a"]["unknown_reasons"] \
        == table["legacy_2tok"]["b"]["unknown_reasons"] == {ALL_CUT: 16}
    text = format_compare(result, "markdown")
    assert ("The ranking of A and B is the same under every readout" in text
            and "changes with the readout" not in text)
    assert "| legacy_2tok | – (no answer in A and B) |" in text
    assert "not counted: legacy_2tok (no answer in A and B)" in text
    for side in "AB":
        assert (f"adversarial, {side}: unknown, all candidates cut (every candidate logit -inf"
                in text)
    detail = text.split("## Metrics of each run")[1]
    row = next(line for line in detail.splitlines() if line.startswith("| legacy_2tok |"))
    assert row.split(" | ")[1:4] == ["–", "–", "–"]  # F1 A, F1 B, ΔF1


def test_compare_of_a_method_whose_cut_removed_every_candidate(tmp_path):
    # the run: the baseline answers under legacy_2tok, the method's cut leaves it nothing
    a = _run(tmp_path / "none", {"legacy_2tok": "y" * 16, "template_aware": LABELS})
    b = _run(tmp_path / "vcd", {"legacy_2tok": "c" * 16, "template_aware": LABELS}, "vcd")
    result = compare_runs([a, b])
    [pair] = result["pairs"]
    ranking = pair["ranking"]["adversarial"]
    # before: ΔF1 -0.6667 with an interval below 0 under legacy_2tok, 0 under template_aware:
    # "changes"
    assert (not ranking["changes"] and ranking["no_answers"] == {"legacy_2tok": "B"}
            and ranking["negative"] == [])
    text = format_compare(result, "markdown")
    assert "| legacy_2tok | – (no answer in B) |" in text and "-0.6667" not in text
    assert ("adversarial, B: unknown, all candidates cut" in text
            and "adversarial, A: unknown" not in text)
    data, caption = figure_data.delta_f1(pair, result, ("none", "vcd"), "methods/compare.json")
    # no ΔF1 drawn of answers that are not there
    assert list(data["splits"]["adversarial"]) == ["template_aware"]
    assert data["no_answers"] == {"adversarial": {"legacy_2tok": "B"}}
    assert "Not drawn, every answer unknown in a run: legacy_2tok (no answer in B)." in caption
    assert "changes with the readout" not in caption


def test_mcnemar_p_of_one_beside_a_significant_delta_has_its_legend(tmp_path):
    # B trades A's 8 false positives for 8 unknowns: F1 rises (precision 0.5 → 1), correctness does
    # not change
    a = _run(tmp_path / "none", {"legacy_2tok": LABELS, "template_aware": "y" * 16})
    b = _run(tmp_path / "vcd", {"legacy_2tok": LABELS, "template_aware": "y" * 8 + "c" * 8}, "vcd")
    result = compare_runs([a, b])
    r = result["pairs"][0]["splits"]["adversarial"]["template_aware"]
    assert r["mcnemar_p"] == 1.0 and r["delta_f1_ci95"][0] > 0
    assert MCNEMAR_LEGEND in format_compare(result, "markdown")
    assert "p = 1 beside an interval that excludes 0 is no contradiction" in MCNEMAR_LEGEND
    _, caption = figure_data.delta_f1(result["pairs"][0], result, ("none", "vcd"), "compare.json")
    assert MCNEMAR_LEGEND in caption


def test_score_cli_prints_the_reason_under_each_method(tmp_path):
    """A paired run's folder: score reads each method's run and says, under each, which readouts'
    unknowns the cut made."""
    _run(tmp_path / "out" / "none", {"legacy_2tok": "y" * 16, "template_aware": LABELS})
    _run(tmp_path / "out" / "vcd", {"legacy_2tok": "c" * 16, "template_aware": LABELS}, "vcd")
    result = CliRunner().invoke(main, ["score", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    none, vcd = result.output.split("\n\n")
    assert "all candidates cut" not in none
    assert "unknown, all candidates cut" in vcd and "legacy_2tok 16 of 16" in vcd


def test_a_benchmark_run_names_its_cut_readouts(tmp_path):
    """An MME run under a method: the official aggregation of a readout whose every candidate was
    cut is made of unknowns, and the benchmark's table says so under it."""
    from pope_fast.readout.benchmarks.score import format_benchmark, score_benchmark_paths

    folder = tmp_path / "mme-vcd"
    folder.mkdir()
    write_meta(folder, {"benchmark": "mme", "readouts": ["template_aware"],
                        "template": "llava_plain",
                        "token_sets": {"template_aware": {"yes_ids": [3869], "no_ids": [1939]}}})
    questions = [Question(f"color/{img}.png#{k}", f"color/{img}.png",
                          f"Is it {img} {k}? Please answer yes or no.", label, "color", "mme")
                 for img in "ab" for k, label in enumerate(("yes", "no"))]
    with RecordWriter(folder) as w:
        w.write([make_record(q, "llava_plain", first_token_id=5,
                             candidate_logits={3869: CUT, 1939: CUT},
                             decoded="Yes") for q in questions[:3]]
                + [make_record(questions[3], "llava_plain", first_token_id=5, decoded="No",
                               candidate_logits={3869: 0.0, 1939: 1.0})])
    [result] = score_benchmark_paths([str(folder)], readouts=["template_aware"])
    assert result["unknown_reasons"] == {"template_aware": {ALL_CUT: 3}}
    assert "unknown, all candidates cut (every candidate logit -inf" in format_benchmark(result)
    assert "template_aware 3 of 4" in format_benchmark(result)
