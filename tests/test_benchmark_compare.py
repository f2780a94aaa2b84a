"""`compare` on two benchmark runs (readout/benchmarks/compare.py): the benchmark told from meta.json, each rule's
headline metrics for A and B with B - A, and a paired bootstrap over the benchmark's units. The runs are written
here record by record, so every delta is worked by hand from the rules' formulas (MME: acc + acc+ per subtask,
calculation.py 132-149 as ../shared/benchmarks/mme_synthetic/README.md states it; AMBER: inference.py:174-256
with its counters from 0.001, AMBER_rating yorn.py:9-47)."""
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, RecordWriter, make_record, write_meta
from pope_fast.readout.benchmarks.compare import compare_benchmark_runs


def _run(folder, benchmark, questions, said):
    folder.mkdir()
    write_meta(folder, {"benchmark": benchmark, "readouts": ["yorn"], "template": "llava_plain"})
    with RecordWriter(folder) as w:
        w.write([make_record(q, "llava_plain", first_token_id=5, candidate_logits={}, decoded=text)
                 for q, text in zip(questions, said)])
    return folder


MME_QUESTIONS = [Question(f"{c}/{img}.png#{k}", f"{c}/{img}.png", f"Is it {img} {k}? Please answer yes or no.", label,
                          c, "mme")
                 for c, img in (("color", "a"), ("color", "b"), ("code_reasoning", "c"))
                 for k, label in enumerate(("yes", "no"))]


@pytest.fixture
def mme_pair(tmp_path):
    # A: color a both right, color b its Yes wrong; code_reasoning c its No wrong. B: every answer right.
    a = _run(tmp_path / "a", "mme", MME_QUESTIONS, ["Yes", "No", "No", "No", "Yes", "Yes"])
    b = _run(tmp_path / "b", "mme", MME_QUESTIONS, ["Yes", "No", "Yes", "No", "Yes", "No"])
    return a, b


def test_mme_deltas_per_rule_and_an_interval_over_images(mme_pair):
    (pair,) = compare_benchmark_runs(list(map(str, mme_pair)), resamples=400)["pairs"]
    assert list(pair["rules"]) == ["official", "lmms-eval", "vlmevalkit"]  # official first
    official = pair["rules"]["official"]
    # color: A acc 3/4*100 + acc+ 1/2*100 = 125, B 200; code_reasoning: A 50 + 0 = 50, B 200
    assert (official["Perception"]["a"], official["Perception"]["b"], official["Perception"]["delta"]) == (125, 200, 75)
    assert (official["Cognition"]["a"], official["Cognition"]["b"], official["Cognition"]["delta"]) == (50, 200, 150)
    assert pair["rules"]["vlmevalkit"]["perception"]["delta"] == 75 and \
        pair["rules"]["lmms-eval"]["mme_cognition_score"]["delta"] == 150
    assert pair["questions"] == {"joined": 6, "compared": 6, "errors_a": 0, "errors_b": 0, "units": 3}
    # resampling the 3 images: Perception's delta is 0 where only image a of color is drawn, 150 where only b,
    # in between for both; each of those two draws has probability 7/26 given a color image, past the 2.5% tails
    assert official["Perception"]["delta_ci95"] == [0.0, 150.0]
    assert official["Cognition"]["delta_ci95"] == [150.0, 150.0]  # code_reasoning has one image: always 150
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
    refused = CliRunner().invoke(main, ["compare", a, b, "--protocol", "lmms-eval"])
    assert refused.exit_code != 0 and "--protocol is POPE's" in refused.output


AMBER_QUESTIONS = [Question(qid, f"AMBER_{qid}.jpg", f"Is there a thing{qid}?", label, split, "amber")
                   for qid, label, split in ((1005, "no", "existence"), (1006, "no", "existence"),
                                             (1007, "yes", "attribute-state"), (1008, "yes", "attribute-state"))]


def test_amber_deltas_per_rule(tmp_path):
    a = _run(tmp_path / "a", "amber", AMBER_QUESTIONS, ["No", "Yes", "Yes", "No"])  # 1006 and 1008 wrong
    b = _run(tmp_path / "b", "amber", AMBER_QUESTIONS, ["No", "No", "Yes", "Yes"])  # every answer right
    (pair,) = compare_benchmark_runs([str(a), str(b)], resamples=200)["pairs"]
    overall = pair["rules"]["official"]["Descriminative Task/Accuracy"]
    # the counter of questions starts at 0.001: 2/4.001 and 4/4.001, each x100 and rounded to 1 decimal
    assert (overall["a"], overall["b"]) == (round(2 / 4.001 * 100, 1), round(4 / 4.001 * 100, 1)) == (50.0, 100.0)
    # AMBER_rating: Existence and Attribute 50 each in A, 100 in B; Avg ACC their mean
    assert pair["rules"]["vlmevalkit"]["Avg ACC"]["delta"] == 50.0
    assert pair["questions"]["units"] == 4  # AMBER's numbers are sums over questions: one unit each
    low, high = pair["rules"]["vlmevalkit"]["Avg ACC"]["delta_ci95"]
    assert 0 <= low < 50 < high <= 100  # B is never worse; a resample of only right-in-both questions gives 0


def test_runs_of_different_benchmarks_are_refused(tmp_path, mme_pair):
    amber = _run(tmp_path / "amber", "amber", AMBER_QUESTIONS, ["No"] * 4)
    result = CliRunner().invoke(main, ["compare", str(mme_pair[0]), str(amber)])
    assert result.exit_code != 0 and "different benchmarks" in result.output and "Traceback" not in result.output
