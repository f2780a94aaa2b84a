"""--protocol vcd: VCD's experiments/eval/eval_pope.py (DAMO-NLP-SG/VCD d6568ff) over its sampled
baseline. Its rule reads the label ('yes' in the answer for a yes-question, 'no' for a no-question),
against a transcription of that script's loop; its coverage, the settings a run takes from it, and
what score says of a run."""
import json

import pytest
from click.testing import CliRunner

from pope_fast.cli import main
from pope_fast.readout import Question, make_record
from pope_fast.readout.protocols import PROTOCOLS, coverage, get_template
from pope_fast.readout.protocols.vcd import vcd_counted, vcd_metrics
from pope_fast.readout.readouts import READOUTS
from pope_fast.store import RecordWriter, write_meta

TEXTS = ["Yes", "No", "not", "Nothing.", "snow", "Yes, there is no dog", "", "Maybe", "YES!",
         "I don't know", " no "]


def eval_pope(gt: list[dict], gen: list[dict]) -> dict:
    """eval_pope.py l.17-60 transcribed: the loop over the ground truth in order, then its six
    values."""
    true_pos = true_neg = false_pos = false_neg = unknown = yes_answers = 0
    total = len(gt)
    for index, line in enumerate(gt):
        assert line["question_id"] == gen[index]["question_id"]
        gt_answer, gen_answer = line["label"].lower().strip(), gen[index]["text"].lower().strip()
        if gt_answer == "yes":
            if "yes" in gen_answer:
                true_pos += 1
                yes_answers += 1
            else:
                false_neg += 1
        elif gt_answer == "no":
            if "no" in gen_answer:
                true_neg += 1
            else:
                yes_answers += 1
                false_pos += 1
        else:
            unknown += 1
    precision = true_pos / (true_pos + false_pos)
    recall = true_pos / (true_pos + false_neg)
    return {"Precision": precision, "Recall": recall,
            "F1": 2 * precision * recall / (precision + recall),
            "Accuracy": (true_pos + true_neg) / total, "yes": yes_answers / total,
            "unknow": unknown / total}


def _answers(n: int = 22):
    labels = ["yes" if i % 2 else "no" for i in range(n)]
    texts = [TEXTS[(i * 7) % len(TEXTS)] for i in range(n)]
    return labels, texts


def test_the_rule_and_metrics_are_eval_popes():
    """Every text under both labels: 'not', 'nothing', 'snow' and "I don't know" count as no, an
    answer holding both words counts right under either label, one holding neither wrong under
    either."""
    labels, texts = _answers()
    gt = [{"question_id": i, "label": y} for i, y in enumerate(labels)]
    gen = [{"question_id": i, "text": t} for i, t in enumerate(texts)]
    ours = vcd_metrics(labels, [vcd_counted(y, t) for y, t in zip(labels, texts)])
    assert {k: ours[k] for k in ("Precision", "Recall", "F1", "Accuracy", "yes", "unknow")} \
        == eval_pope(gt, gen)
    assert [vcd_counted("no", t) for t in ("not", "nothing", "snow", "I don't know",
                                           "Yes, there is no dog", "Maybe")] \
        == ["no", "no", "no", "no", "no", "yes"]
    assert [vcd_counted("yes", t) for t in ("Yes, there is no dog", "Maybe", "eyes")] \
        == ["yes", "no", "yes"]
    # the label-free readout decides only where one word is there
    assert [READOUTS["vcd"].decide(t) for t in ("Yes", "snow", "Yes, there is no dog", "Maybe")] \
        == ["yes", "no", "unknown", "unknown"]
    stops = vcd_metrics(["yes", "no"], ["no", "no"])
    assert stops["F1"] is None and "ZeroDivisionError" in stops["error"]


def test_vcds_coverage_is_its_scripts():
    """LLaVA-1.5: conv llava_v1 with its one-word instruction, 1024 sampled tokens (temperature 1,
    no top-k, no top-p), fp16, CLIP's own crop; InstructBLIP: LAVIS's bare prompt, top-k 50
    (generate's default there), 256 tokens; no other family (its third script runs Qwen-VL)."""
    from types import SimpleNamespace

    llava = coverage("vcd", _llava(), {})
    assert (llava.template, llava.new_tokens, llava.do_sample, llava.temperature, llava.top_k,
            llava.top_p, llava.image_aspect, llava.dtype) == (
        "vcd_llava", 1024, True, 1.0, 0, 1.0, "processor", "fp16")
    assert get_template("vcd_llava").render("Is there a dog in the image?") == (
        "A chat between a curious human and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the human's questions. "
        "USER: <image>\nIs there a dog in the image? Please answer this question with one word. "
        "ASSISTANT:")
    blip = coverage("vcd", SimpleNamespace(family="instructblip", name="InstructBLIP"), {})
    assert (blip.template, blip.new_tokens, blip.top_k, blip.min_new_tokens, blip.num_beams) == \
        ("vcd_instructblip", 256, 50, 1, 1)
    assert get_template("vcd_instructblip").render("Is there a cat?") == \
        "Is there a cat? Please answer this question with one word."
    with pytest.raises(ValueError, match="^protocol vcd does not cover Qwen2-VL: "
                                         "VCD's scripts run .*Qwen-VL, not"):
        coverage("vcd", SimpleNamespace(family="qwen2_vl", name="Qwen2-VL"), {})
    assert PROTOCOLS["vcd"].readout == "vcd" and PROTOCOLS["vcd"].counted is vcd_counted


def test_the_protocol_settings_sample_and_meta_records_the_seed():
    from pope_fast.engine.utils.settings import Settings  # torch: the settings are the engine's
    from pope_fast.evaluate import protocol_settings

    covered = coverage("vcd", _llava(), {})
    settings = protocol_settings(Settings(seed=55), covered)
    assert (settings.do_sample, settings.top_k, settings.dtype, settings.generation_config) == \
        (True, 0, "fp16", "greedy")
    recorded = settings.to_json()
    assert recorded["seed"] == 55 and recorded["do_sample"] is True and "top_k" not in recorded


def _run(folder, texts, labels, settings):
    folder.mkdir()
    write_meta(folder, {"template": "vcd_llava", "settings": settings, "readouts": ["vcd"],
                        "generation": {"vcd": {"max_new_tokens": 1024, "first_sentence": False}},
                        "protocol_coverage": {"vcd": coverage("vcd", _llava(), {}).to_json()}})
    with RecordWriter(folder) as w:
        w.write([make_record(Question(i, f"img{i // 6}.jpg", "Is there a dog?", y, split, "coco"),
                             "vcd_llava", first_token_id=5, candidate_logits={}, decoded=t)
                 for split in ("random", "adversarial")
                 for i, (y, t) in enumerate(zip(labels, texts))])


def _llava():
    from types import SimpleNamespace

    return SimpleNamespace(family="llava", name="LLaVA-1.5")


def test_score_counts_the_recorded_texts_by_label_and_checks_the_sampling(tmp_path):
    """`score --protocol vcd` on a run's records: per split, eval_pope.py's numbers from the texts;
    a run that decoded greedily is told apart from VCD's sampled baseline."""
    labels, texts = _answers()
    sampled = {"do_sample": True, "seed": 55, "dtype": "fp16", "resolved_dtype": "float16",
               "generation_config": "greedy"}
    _run(tmp_path / "sampled", texts, labels, sampled)
    out = CliRunner().invoke(main, ["score", str(tmp_path / "sampled"), "--protocol", "vcd",
                                    "--format", "json"])
    assert out.exit_code == 0, out.output
    [run] = json.loads(out.output)["runs"]
    expected = eval_pope([{"question_id": i, "label": y} for i, y in enumerate(labels)],
                         [{"question_id": i, "text": t} for i, t in enumerate(texts)])
    assert [r["split"] for r in run["rows"]] == ["random", "adversarial"]
    assert {k: run["rows"][0][k] for k in expected} == expected
    assert not any("generation" in c for c in run["checks"])
    _run(tmp_path / "greedy", texts, labels,
         {k: v for k, v in sampled.items() if k not in ("do_sample", "seed")})
    table = CliRunner().invoke(
        main, ["score", str(tmp_path / "greedy"), "--protocol", "vcd"]).output
    assert "! generation: this run's do_sample is False, vcd's True" in table


@pytest.mark.slow
def test_the_demo_under_vcd_samples_and_records_its_seed(tmp_path):
    """The demo under --protocol vcd: meta.json records the sampling and its --seed, and score finds
    nothing between the run and VCD's protocol but what the engine does not reproduce and the demo's
    cap. (The demo's stand-in tokenizer decodes few of the ids drawn: the draws themselves are
    tests/engine/test_sampling.py's.)"""
    result = CliRunner().invoke(main, ["eval", "--out", str(tmp_path / "a"), "--device", "cpu",
                                       "--demo-questions", "12", "--protocol", "vcd",
                                       "--seed", "3"])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "a/meta.json").read_text())
    assert {k: meta["settings"].get(k)
            for k in ("do_sample", "seed", "generation_config", "dtype")} == \
        {"do_sample": True, "seed": 3, "generation_config": "greedy", "dtype": "fp16"}
    assert meta["template"] == "vcd_llava"
    scored = CliRunner().invoke(main, ["score", str(tmp_path / "a"), "--protocol", "vcd",
                                       "--format", "json"])
    [run] = json.loads(scored.output)["runs"]
    assert [r["n"] for r in run["rows"]] == [12]
    assert [c for c in run["checks"] if not c.startswith("not reproduced")] == \
        ["generation: 12 answers were cut at 6 new tokens; vcd generates up to 1024"]


def test_compare_under_vcd_counts_each_side_by_label(tmp_path):
    """compare --protocol vcd: each run's F1 and accuracy are eval_pope.py's over its texts, and ΔF1
    their difference, not the label-free readout's."""
    from pope_fast.readout import compare_runs
    from pope_fast.readout.protocols import get_protocol

    labels, texts = _answers()
    other = [{"Yes": "snow", "No": "Yes, there is no dog"}.get(t, t) for t in texts]
    settings = {"do_sample": True, "seed": 55, "dtype": "fp16", "resolved_dtype": "float16",
                "generation_config": "greedy"}
    _run(tmp_path / "a", texts, labels, settings)
    _run(tmp_path / "b", other, labels, settings)
    [pair] = compare_runs([tmp_path / "a", tmp_path / "b"], resamples=20,
                          protocol=get_protocol("vcd"))["pairs"]
    got = pair["splits"]["random"]["vcd"]
    theirs = [eval_pope([{"question_id": i, "label": y} for i, y in enumerate(labels)],
                        [{"question_id": i, "text": t} for i, t in enumerate(said)])
              for said in (texts, other)]
    assert (got["a"]["f1"], got["b"]["f1"]) == pytest.approx((theirs[0]["F1"], theirs[1]["F1"]))
    assert (got["a"]["accuracy"], got["b"]["accuracy"]) == pytest.approx(
        (theirs[0]["Accuracy"], theirs[1]["Accuracy"]))
    assert (got["delta_f1"] == pytest.approx(theirs[1]["F1"] - theirs[0]["F1"])
            and got["delta_f1"] != 0)
