"""`compare` on two benchmark runs (readout/benchmarks/compare.py): the benchmark told from
meta.json, each rule's headline metrics for A and B with B - A, and a paired bootstrap over the
benchmark's units. The runs are written here record by record, so every delta is worked by hand from
the rules' formulas (MME: acc + acc+ per subtask, calculation.py 132-149 as
../shared/benchmarks/mme_synthetic/README.md states it; AMBER: inference.py:174-256 with its
counters from 0.001, AMBER_rating yorn.py:9-47)."""
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, make_record
from pope_fast.readout.benchmarks.compare import compare_benchmark_runs
from pope_fast.store import RecordWriter, write_meta


def _run(folder, benchmark, questions, said):
    folder.mkdir()
    write_meta(folder, {"benchmark": benchmark, "readouts": ["yorn"], "template": "llava_plain"})
    with RecordWriter(folder) as w:
        w.write([make_record(q, "llava_plain", first_token_id=5, candidate_logits={}, decoded=text)
                 for q, text in zip(questions, said)])
    return folder


MME_QUESTIONS = [Question(f"{c}/{img}.png#{k}", f"{c}/{img}.png",
                          f"Is it {img} {k}? Please answer yes or no.", label, c, "mme")
                 for c, img in (("color", "a"), ("color", "b"), ("code_reasoning", "c"))
                 for k, label in enumerate(("yes", "no"))]


@pytest.fixture
def mme_pair(tmp_path):
    # A: color a both right, color b its Yes wrong; code_reasoning c its No wrong. B: every answer
    # right.
    a = _run(tmp_path / "a", "mme", MME_QUESTIONS, ["Yes", "No", "No", "No", "Yes", "Yes"])
    b = _run(tmp_path / "b", "mme", MME_QUESTIONS, ["Yes", "No", "Yes", "No", "Yes", "No"])
    return a, b


def test_mme_deltas_per_rule_and_an_interval_over_images(mme_pair):
    (pair,) = compare_benchmark_runs(list(map(str, mme_pair)), resamples=400)["pairs"]
    assert list(pair["rules"]) == ["official", "lmms-eval", "vlmevalkit"]  # official first
    official = pair["rules"]["official"]
    # color: A acc 3/4*100 + acc+ 1/2*100 = 125, B 200; code_reasoning: A 50 + 0 = 50, B 200
    assert (official["Perception"]["a"], official["Perception"]["b"],
            official["Perception"]["delta"]) == (125, 200, 75)
    assert (official["Cognition"]["a"], official["Cognition"]["b"],
            official["Cognition"]["delta"]) == (50, 200, 150)
    assert pair["rules"]["vlmevalkit"]["perception"]["delta"] == 75 and \
        pair["rules"]["lmms-eval"]["mme_cognition_score"]["delta"] == 150
    assert pair["questions"] \
        == {"joined": 6, "compared": 6, "errors_a": 0, "errors_b": 0, "units": 3}
    # resampling the 3 images: Perception's delta is 0 where only image a of color is drawn, 150
    # where only b, in between for both; each of those two draws has probability 7/26 given a color
    # image, past the 2.5% tails
    assert official["Perception"]["delta_ci95"] == [0.0, 150.0]
    # code_reasoning has one image: always 150
    assert official["Cognition"]["delta_ci95"] == [150.0, 150.0]
    # the recorded readout under the official aggregation: yorn reads these texts as every rule does
    assert pair["readouts"]["yorn"]["Perception"]["delta"] == 75


def test_compare_command_tells_the_benchmark_from_meta_json(mme_pair):
    a, b = map(str, mme_pair)
    result = CliRunner().invoke(main, ["compare", a, b, "--format", "json", "--resamples", "50"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["benchmark"] == "mme" and out["unit"] == "image"
    assert out["pairs"][0]["rules"]["official"]["Cognition"]["delta"] == 150
    table = CliRunner().invoke(main, ["compare", a, b, "--resamples", "50"]).output
    assert "| rule `official` | Perception | 125 | 200 | +75 | [+0, +150] |" in table
    # --protocol selects that tool's rule, as score does: its numbers alone, the same as in the full
    # comparison
    chosen = CliRunner().invoke(main, ["compare", a, b, "--protocol", "lmms-eval", "--format",
                                       "json", "--resamples", "50"])
    assert chosen.exit_code == 0, chosen.output
    one = json.loads(chosen.output)
    assert one["rule"] == "lmms-eval" and set(one["pairs"][0]["rules"]) == {"lmms-eval"}
    assert one["pairs"][0]["rules"]["lmms-eval"] == out["pairs"][0]["rules"]["lmms-eval"]
    assert one["pairs"][0]["readouts"] == {}
    refused = CliRunner().invoke(main, ["compare", a, b, "--protocol", "llava"])
    assert refused.exit_code != 0 and "--protocol llava: mme has no rule of that tool's " \
        "(its rules: official, lmms-eval, vlmevalkit)" in refused.output, refused.output


AMBER_QUESTIONS = [Question(qid, f"AMBER_{qid}.jpg", f"Is there a thing{qid}?", label, split,
                            "amber")
                   for qid, label, split in ((1005, "no", "existence"), (1006, "no", "existence"),
                                             (1007, "yes", "attribute-state"),
                                             (1008, "yes", "attribute-state"))]


def test_amber_deltas_per_rule(tmp_path):
    # 1006 and 1008 wrong
    a = _run(tmp_path / "a", "amber", AMBER_QUESTIONS, ["No", "Yes", "Yes", "No"])
    # every answer right
    b = _run(tmp_path / "b", "amber", AMBER_QUESTIONS, ["No", "No", "Yes", "Yes"])
    (pair,) = compare_benchmark_runs([str(a), str(b)], resamples=200)["pairs"]
    overall = pair["rules"]["official"]["Descriminative Task/Accuracy"]
    # the counter of questions starts at 0.001: 2/4.001 and 4/4.001, each x100 and rounded to 1
    # decimal
    assert (overall["a"], overall["b"]) == (round(2 / 4.001 * 100, 1), round(4 / 4.001 * 100, 1)) \
        == (50.0, 100.0)
    # AMBER_rating: Existence and Attribute 50 each in A, 100 in B; Avg ACC their mean
    assert pair["rules"]["vlmevalkit"]["Avg ACC"]["delta"] == 50.0
    assert pair["questions"]["units"] == 4  # AMBER's numbers are sums over questions: one unit each
    low, high = pair["rules"]["vlmevalkit"]["Avg ACC"]["delta_ci95"]
    # B is never worse; a resample of only right-in-both questions gives 0
    assert 0 <= low < 50 < high <= 100


def test_runs_of_different_benchmarks_are_refused(tmp_path, mme_pair):
    amber = _run(tmp_path / "amber", "amber", AMBER_QUESTIONS, ["No"] * 4)
    result = CliRunner().invoke(main, ["compare", str(mme_pair[0]), str(amber)])
    assert result.exit_code != 0 and "different benchmarks" in result.output \
        and "Traceback" not in result.output


def test_ambers_per_question_counts_are_its_aggregation_at_weight_one():
    """Rule.resampled with every question drawn once is the rule's own headline
    (inference.py:270-273 and AMBER_rating's Avg ACC), and a question drawn twice counts twice: the
    weights compare draws stand for copies."""
    import numpy as np

    from pope_fast.readout.benchmarks.amber.benchmark import Amber
    from pope_fast.readout.benchmarks.base import Answer
    from pope_fast.readout.benchmarks.score import metric

    said = ["No", "Yes", "Yes", "No", "no", "No"]
    splits = ["existence", "existence", "attribute-state", "attribute-number", "relation",
              "relation"]
    labels = ["no", "no", "yes", "yes", "no", "yes"]
    for name, rule in Amber.rules.items():
        answers = [Answer(str(i), s, None, y, rule.read(t))
                   for i, (s, y, t) in enumerate(zip(splits, labels, said))]
        once = rule.resampled(answers, np.ones((1, len(answers))))
        assert {n: float(v[0]) for n, v in once.items()} == pytest.approx(
            {n: metric(rule.aggregate(answers), n) for n in rule.headline}), name
        twice = rule.resampled(answers, np.array([[2.0, 1, 1, 1, 1, 1]]))
        doubled = rule.aggregate([answers[0], *answers])
        assert {n: float(v[0]) for n, v in twice.items()} == pytest.approx(
            {n: metric(doubled, n) for n in rule.headline}), name


def test_hallusionbench_resamples_whole_sets(tmp_path):
    """Two VD sets of two figures, one question each. A misses set 0's edited figure, B nothing.
    Hallusion_rating (yorn.py:96-145): aAcc 75 -> 100, fAcc 3 of 4 figures -> 4, qAcc 1 of 2
    question pairs -> 2 (delta 50). Resampling the 2 sets: both draws set 0 -> qAcc delta 100, both
    set 1 -> 0, one of each -> 50; each pure draw has probability 1/4, past the 2.5% tails."""
    from pope_fast.readout.benchmarks.hallusionbench.benchmark import HallusionBench

    rows = [{"category": "VD", "subcategory": "illusion", "visual_input": visual, "set_id": s,
             "figure_id": f, "sample_note": "", "question_id": "0", "question": f"Q {s}/{f}?",
             "gt_answer_details": "", "gt_answer": gt, "filename": f"./VD/illusion/{s}_{f}.png"}
            for s, f, visual, gt in (("0", "0", "1", "1"), ("0", "1", "2", "0"),
                                     ("1", "0", "1", "0"), ("1", "1", "2", "1"))]
    (tmp_path / "hb.json").write_text(json.dumps(rows))
    questions = HallusionBench.questions(tmp_path / "hb.json")
    a = _run(tmp_path / "a", "hallusionbench", questions, ["Yes", "Yes", "No", "Yes"])
    b = _run(tmp_path / "b", "hallusionbench", questions, ["Yes", "No", "No", "Yes"])
    result = compare_benchmark_runs([str(a), str(b)], resamples=300)
    (pair,) = result["pairs"]
    assert result["unit"] == "set (subcategory and set_id)" and pair["questions"]["units"] == 2
    vlmevalkit = pair["rules"]["vlmevalkit"]
    assert {n: m["delta"] for n, m in vlmevalkit.items()} \
        == {"aAcc": 25.0, "fAcc": 25.0, "qAcc": 50.0}
    assert vlmevalkit["qAcc"]["delta_ci95"] == [0.0, 100.0]
    assert list(pair["rules"])[0] == "official" \
        and pair["rules"]["official"]["qAcc"]["delta"] == 50.0


def test_an_mme_method_run_says_no_rule_reads_it_and_which_numbers_it_has(tmp_path):
    """A VCD run's MME records hold no text: every rule (all three read the answer text) is
    unavailable, saying it is scored under the answer position's readouts under MME's official
    formula, which follow."""
    from pope_fast.readout import TokenSets, read_records
    from pope_fast.readout.benchmarks import get_benchmark
    from pope_fast.readout.benchmarks.score import score_run

    folder = tmp_path / "vcd"
    folder.mkdir()
    write_meta(folder, {"benchmark": "mme", "readouts": ["legacy_2tok"],
                        "method": {"name": "vcd", "settings": {}},
                        "token_sets": {"legacy_2tok": TokenSets((5,), (6,)).to_json()}})
    with RecordWriter(folder) as w:
        w.write([make_record(q, "llava_plain", first_token_id=5, candidate_logits={5: 1.0, 6: 0.0})
                 for q in MME_QUESTIONS])
    scored = score_run(read_records(folder), get_benchmark("mme"), ["legacy_2tok", "yorn"])
    assert scored["rules"] == {} and set(scored["readouts"]) == {"legacy_2tok"}
    why = scored["unavailable"]
    assert set(why) == {"official", "lmms-eval", "vlmevalkit", "yorn"}
    assert why["official"] \
        == ("every rule reads answer text, which the run of method vcd does not record: it is "
            "scored under the answer position's logit and first-token readouts, each under MME's "
            "official formula")
    assert why["yorn"].startswith("the run of method vcd is scored under the answer position's "
                                  "readouts only")
