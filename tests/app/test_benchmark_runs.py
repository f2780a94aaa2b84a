"""Each benchmark end to end: `eval` on synthetic images in its layout (the benchmark told from the
data), the records scored by its rules (`score`, benchmark told from the records), and another
tool's result file for the same questions scored the same way. The rooms' own tests check their
rules against the official code; these check that the engine's answers reach them intact."""
import ast
import json

import pytest
from click.testing import CliRunner
from PIL import Image

from pope_fast.cli import main
from pope_fast.readout import read_records
from pope_fast.readout.benchmarks import get_benchmark
from pope_fast.readout.benchmarks.amber.benchmark import write_responses
from pope_fast.readout.benchmarks.amber.metrics import ACTION, EXISTENCE, NUMBER, RELATION, STATE
from pope_fast.readout.benchmarks.score import score_responses
from tinymodels import make_tiny_llava

pytestmark = pytest.mark.slow  # eval and score end to end on tiny checkpoints


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("bench-ckpt") / "ckpt", init_std=0.3)


def _eval(checkpoint, questions, images, out, *extra):
    result = CliRunner().invoke(main, ["eval", "--model", str(checkpoint), "--questions",
                                       str(questions), "--images", str(images), "--out", str(out),
                                       "--device", "cpu", "--max-new-tokens", "3", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def _amber(root):
    """A small AMBER data folder: generative ids 1-1004 (left out), then 12 discriminative queries
    of every type on 3 images."""
    (root / "data/query").mkdir(parents=True)
    (root / "images").mkdir()
    kinds = ["discriminative-attribute-state", "discriminative-hallucination",
             "discriminative-relation", "relation", "discriminative-attribute-number",
             "discriminative-attribute-action"]
    annotations = [{"id": i, "type": "generative", "truth": [], "hallu": []}
                   for i in range(1, 1005)]
    queries = []
    for qid in range(1005, 1017):
        kind = kinds[qid % len(kinds)]
        truth = "no" if kind in ("discriminative-hallucination", "relation") \
            else "yes" if qid % 2 else "no"
        annotations.append({"id": qid, "type": kind, "truth": truth})
        queries.append({"id": qid, "image": f"AMBER_{qid % 3 + 1}.jpg",
                        "query": f"Is the thing{qid} red in this image?"})
    (root / "data/annotations.json").write_text(json.dumps(annotations))
    (root / "data/query/query_discriminative.json").write_text(json.dumps(queries))
    for n, size in zip((1, 2, 3), ((50, 30), (30, 50), (40, 40))):
        Image.new("RGB", size, (70 * n, 120, 200)).save(root / f"images/AMBER_{n}.jpg")
    return root / "data", root / "images"


def test_amber_end_to_end(checkpoint, tmp_path):
    data, images = _amber(tmp_path)
    printed = _eval(checkpoint, data, images, tmp_path / "run")
    assert ("### AMBER (discriminative): " in printed
            and "every readout, aggregated as the official code does" in printed)
    records = read_records(tmp_path / "run")
    assert {e.dataset for e in records.entries} == {"amber"} and len(records.entries) == 12
    assert {e.split for e in records.entries} == {EXISTENCE, STATE, NUMBER, ACTION, RELATION}
    meta = json.loads((tmp_path / "run/meta.json").read_text())
    assert meta["benchmark"] == "amber"
    scored = json.loads(CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--format",
                                                  "json"]).output)["runs"][0]
    # the run's texts written as AMBER's response file and scored as one: the same numbers under
    # every rule
    texts = {int(e.key): e.decoded for e in records.entries}
    file = write_responses(tmp_path / "responses.json", texts)
    assert score_responses(file, get_benchmark("amber"), data)["rules"] == scored["rules"]
    out = CliRunner().invoke(main, ["score", str(file), "--data", str(data), "--format", "json"])
    assert json.loads(out.output)["runs"][0]["rules"] == scored["rules"]
    # a logit readout under the official aggregation: its decisions, counted by AMBER's formula
    official = get_benchmark("amber").rules["official"]
    from pope_fast.readout.benchmarks import Answer
    from pope_fast.readout.score import predictions
    answered = records.entries
    expected = official.aggregate([Answer(e.key, e.split, e.image, e.label, d) for e, d in
                                   zip(answered, predictions(records, "template_aware", answered))])
    assert scored["readouts"]["template_aware"] == expected
    # report: the benchmark's numbers and its headline figure, from the same scores
    # the headline's one-column layout too
    result = CliRunner().invoke(main, ["report", str(tmp_path / "run"), "--out",
                                       str(tmp_path / "report"), "--formats", "png,column"])

    assert result.exit_code == 0, result.output
    bars = json.loads((tmp_path / "report/run/amber_headline.json").read_text())
    accuracy = "Descriminative Task/Accuracy"
    assert bars["metric"] == accuracy \
        and {b["name"]: b["value"] for b in bars["bars"]}["template_aware"] == \
        expected["Descriminative Task"]["Accuracy"]
    # the official rule reports it; vlmevalkit's is another
    assert len(bars["bars"]) == 1 + len(scored["readouts"])
    assert "AMBER (discriminative)</h2>" in (tmp_path / "report/report.html").read_text()


def _mme(path):
    """An lmms-lab/MME-shaped parquet: 2 subtasks (one perception, one cognition) x 2 images x (Yes,
    No)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for category in ("color", "code_reasoning"):
        for n, size in enumerate(((48, 32), (32, 48))):
            buffer = io.BytesIO()
            Image.new("RGB", size, (90 * n, 40, 160)).save(buffer, "PNG")
            qid = f"{category}/{n:04d}.png"
            for answer, thing in (("Yes", "red"), ("No", "blue")):
                rows.append({"question_id": qid,
                             "image": {"bytes": buffer.getvalue(), "path": f"{n:04d}.png"},
                             "question": f"Is the {thing} shape shown? Please answer yes or no.",
                             "answer": answer, "category": category})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_mme_end_to_end(checkpoint, tmp_path):
    from pope_fast.readout.benchmarks.mme.benchmark import read_questions, write_result_folder

    data = _mme(tmp_path / "mme.parquet")
    # images are embedded: --images unused
    printed = _eval(checkpoint, data, tmp_path, tmp_path / "run")
    # MME's own numbers lead; no yes-positive F1 table per subtask (issue 35: ~290 lines of them
    # before)
    lines = printed.splitlines()
    after = next(i for i, line in enumerate(lines) if "unique prompts evaluated" in line) + 1
    assert lines[after].startswith("### MME") and "F1 95% CI" not in printed, printed
    # the progress line names it
    assert "MME: 8 of 8 questions recorded" in lines and "POPE:" not in printed
    records = read_records(tmp_path / "run")
    assert {e.dataset for e in records.entries} == {"mme"} and len(records.entries) == 8
    scored = json.loads(CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--format",
                                                  "json"]).output)["runs"][0]
    assert set(scored["rules"]) == {"official", "lmms-eval", "vlmevalkit"}
    # asked as the data has it: lmms-eval's rule is flagged (its task asks another prompt), no
    # "asked with" note
    assert scored["notes"] == [] and any(c.startswith("lmms-eval asks its own prompt; this run "
                                                      "asked the benchmark's question as the data "
                                                      "has it") for c in scored["checks"])
    # the same texts as the official tool's result folder: the same numbers under every rule
    write_result_folder(tmp_path / "results", read_questions(data),
                        {e.key: e.decoded for e in records.entries})
    assert (score_responses(tmp_path / "results", get_benchmark("mme"), data)["rules"]
            == scored["rules"])
    for group, total in (("Perception", "color/score"), ("Cognition", "code_reasoning/score")):
        assert (scored["readouts"]["template_aware"][group]
                == scored["readouts"]["template_aware"][total])


def _hallusionbench(root):
    """A HallusionBench.json in small: a VD set (original and edited figure, one question pair) and
    a VS set with its no-image question and one figure."""
    def row(category, sub, set_id, figure, qid, visual, answer, filename):
        return {"category": category, "subcategory": sub, "visual_input": visual, "set_id": set_id,
                "figure_id": figure, "sample_note": "", "question_id": qid,
                "question": f"Is the {sub} {set_id}/{figure} bigger than the other?",
                "gt_answer_details": "", "gt_answer": answer, "filename": filename}
    rows = [row("VD", "illusion", "0", "0", "0", "1", "1", "./VD/illusion/0_0.png"),
            row("VD", "illusion", "0", "1", "0", "2", "0", "./VD/illusion/0_1.png"),
            row("VS", "chart", "1", "0", "0", "0", "1", None),
            row("VS", "chart", "1", "1", "0", "1", "0", "./VS/chart/1_1.png")]
    for r in rows:
        if r["filename"]:
            (root / "images" / r["filename"]).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (40, 30), (50 * int(r["figure_id"]), 90, 140)).save(
                root / "images" / r["filename"])
    (root / "HallusionBench.json").write_text(json.dumps(rows))
    return root / "HallusionBench.json", root / "images", rows


def test_hallusionbench_end_to_end(checkpoint, tmp_path, monkeypatch):
    """The no-image question is answered as a text-only prompt (its record has no image hash); a run
    that recorded it as an error (a family that refused it) answers it on resume."""
    from pope_fast.engine.models.llava import LlavaModel
    from pope_fast.readout.benchmarks.hallusionbench.benchmark import write_results

    data, images, rows = _hallusionbench(tmp_path)
    with monkeypatch.context() as patched:  # a family that cannot run text-only prompts
        patched.setattr(LlavaModel, "text_only_refusal", "no text path")
        # three new tokens, as every run here: the refusal comes after the load and the warm-up,
        # which would otherwise decode each text readout's reference length (the random model never
        # ends its answer)
        refused = CliRunner().invoke(main, ["eval", "--model", str(checkpoint), "--questions",
                                            str(data), "--images", str(images), "--out",
                                            str(tmp_path / "refused"), "--device", "cpu",
                                            "--max-new-tokens", "3"])
        assert refused.exit_code != 0 \
            and "cannot answer a text-only question (no image): no text path" in \
            refused.output and "--skip-bad" in refused.output
        assert "1 error records" in _eval(checkpoint, data, images, tmp_path / "run", "--skip-bad")
        [error] = [e for e in read_records(tmp_path / "run").entries if e.error is not None]
        assert error.key == "VS_chart_1_0_0" and "no text path" in error.error
    # resumed: the error record's question is asked
    printed = _eval(checkpoint, data, images, tmp_path / "run")
    assert "### HallusionBench" in printed and "3 of 4 questions were already recorded" in printed
    assert ("1 unique prompts evaluated for the 1 question not yet recorded; 0 error records"
            in printed)
    assert "HallusionBench: 4 of 4 questions recorded" in printed and "POPE:" not in printed
    records = read_records(tmp_path / "run")
    assert len(records.entries) == 4 and all(e.error is None for e in records.entries)
    stored = {r["question_id"]: r
              for r in map(json.loads, (tmp_path / "run/records.jsonl").read_text().splitlines())}
    text_only = stored["VS_chart_1_0_0"]
    # answered (its text readouts' continuation recorded, whatever the tokenizer decodes it to), not
    # an error
    assert text_only["image"] == "" and "image_sha256" not in text_only and "error" not in text_only
    assert text_only["candidate_logits"] and "decoded" in text_only
    assert all("image_sha256" in r for k, r in stored.items() if k != "VS_chart_1_0_0")
    scored = json.loads(CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--format",
                                                  "json"]).output)["runs"][0]
    assert scored["n"] == 4 and scored["errors"] == 0
    # report: VLMEvalKit's score-file rows (its 3 image questions) as score prints them
    assert CliRunner().invoke(main, ["report", str(tmp_path / "run"), "--out",
                                     str(tmp_path / "report"), "--formats", "png"]).exit_code == 0
    page = (tmp_path / "report/report.html").read_text()
    shown = [f"| {r['split']} |" for r in scored["rules"]["vlmevalkit"]["rows"]]
    assert shown == ["| Overall |", "| VD |", "| VS |", "| VD_illusion |", "| VS_chart |"]
    assert "score file, its rows:" in page and all(
        f'<tr><td style="text-align:left">{cell[2:-2]}</td>' in page
        for cell in shown)  # a column of names: aligned left
    assert "<pre>" not in page  # tables, not markdown text in a box (issue 35)
    # a fresh run gives the text-only question the same answer as the resumed one
    _eval(checkpoint, data, images, tmp_path / "fresh")
    fresh = {e.key: e for e in read_records(tmp_path / "fresh").entries}
    assert {e.key: (e.decoded, e.first_token_id) for e in records.entries} == \
        {k: (e.decoded, e.first_token_id) for k, e in fresh.items()}
    # every question's text as HallusionBench_result.json: the same numbers under every rule
    file = write_results(tmp_path / "result.json", rows,
                         {e.key: e.decoded for e in records.entries})
    assert score_responses(file, get_benchmark("hallusionbench"))["rules"] == scored["rules"]


def test_documented_table_of_what_each_rule_reads():
    """docs/benchmarks.md's table is what the rules read: each cell recomputed from the code."""
    from pathlib import Path

    from pope_fast.readout.readouts import exact_match, pope_official, yorn

    page = (Path(__file__).resolve().parents[2] / "docs/benchmarks.md").read_text()
    table = page.split("What each rule reads on the same answer text:\n\n")[1].split(
        "\n\n")[0].splitlines()

    rules = [get_benchmark("mme").rules["official"].read,
             get_benchmark("mme").rules["lmms-eval"].read, yorn,
             get_benchmark("amber").rules["official"].read,
             get_benchmark("hallusionbench").rules["lmms-eval-rule"].read, pope_official,
             exact_match]
    rows = table[2:]
    assert len(rows) == 10
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        text = ast.literal_eval(cells[0].strip("`"))
        assert cells[1:] == [read(text) for read in rules], line


def test_bad_benchmark_input_is_one_line_naming_file_and_line(tmp_path):
    """Through the command line: an AMBER response with an id the data lacks, an MME parquet without
    a column, an MME result file with a malformed line: one line each, naming the file and where in
    it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, _ = _amber(tmp_path)
    responses = tmp_path / "responses.json"
    responses.write_text(json.dumps([{"id": 1005, "response": "Yes"},
                                     {"id": 99999, "response": "No"}]))
    (tmp_path / "results").mkdir()
    (tmp_path / "results/color.txt").write_text("0001.png\tIs it red?\tYes\tYes\n"
                                                "0001.png\tIs it blue?\tNo\n")

    pq.write_table(pa.Table.from_pylist([{"question_id": "color/1.png", "question": "q",
                                          "category": "color"}]),
                   tmp_path / "mme.parquet")
    cases = [(["score", str(responses), "--data", str(data)], f"{responses} item 2: id 99999"),
             (["eval", "--questions", str(tmp_path / "mme.parquet"), "--benchmark", "mme", "--out",
               str(tmp_path / "o")],
              f"{tmp_path / 'mme.parquet'}: missing column(s) image, answer"),
             (["score", str(tmp_path / "results"), "--benchmark", "mme"],
              f"{tmp_path / 'results/color.txt'}:2:")]
    for args, message in cases:
        result = CliRunner().invoke(main, args)
        assert result.exit_code != 0 and message in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_eval_asks_lmms_evals_mme_prompt_and_score_says_so(checkpoint, tmp_path):
    """`eval --protocol lmms-eval` on MME: lmms-eval's mme_doc_to_text (utils.py:37-45 at cb45ac4d:
    stripped, " Please answer yes or no." replaced, mme.yaml:29's post_prompt appended) inside its
    llava_hf class's prompt, which renders that post_prompt itself (protocols/lmms_eval.py
    lmms_eval_llava_hf): asked once, recorded in meta.json."""
    from pope_fast.readout.protocols import get_template

    data = _mme(tmp_path / "mme.parquet")
    result = CliRunner().invoke(main, ["eval", "--model", str(checkpoint), "--questions", str(data),
                                       "--images", str(tmp_path), "--out", str(tmp_path / "run"),
                                       "--device", "cpu", "--protocol", "lmms-eval", "--limit",
                                       "2"])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "run/meta.json").read_text())
    assert meta["protocol"] == "lmms-eval" and meta["template"] == "lmms_eval_llava_hf"
    assert meta["benchmark_prompt"] == {
        "rule": "lmms-eval", "changed": True,
        "template_renders": "\nAnswer the question using a single word or phrase."}
    texts = {json.loads(line)["text"]
             for line in (tmp_path / "run/records.jsonl").read_text().splitlines()}
    assert texts == {"Is the red shape shown?", "Is the blue shape shown?"}
    assert get_template(meta["template"]).render("Is the red shape shown?") == (
        "USER: <image>\nIs the red shape shown?\nAnswer the question using a single word or "
        "phrase. ASSISTANT:")
    scored = json.loads(CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--format",
                                                  "json"]).output)["runs"][0]
    assert scored["notes"] == ["asked with lmms-eval's prompt (its task's prompt, in lmms-eval's "
                               "model-class template): the lmms-eval rule scores its own run"]
    assert not any(c.startswith("lmms-eval asks its own prompt") for c in scored["checks"])
    assert any(c.startswith("this run asked lmms-eval's prompt: the other rules")
               for c in scored["checks"])
    printed = CliRunner().invoke(main, ["score", str(tmp_path / "run")]).output
    assert "\nasked with lmms-eval's prompt" in printed and "! lmms-eval asks" not in printed


def test_each_tools_task_prompt_and_the_protocols_a_benchmark_takes():
    """Rule.prompt per tool: VLMEvalKit's AMBER suffix (image_yorn.py:33-37) after the bare query;
    lmms-eval's MME post_prompt in full where the template does not render it; VLMEvalKit's MME
    question as is (image_base.py:320-337)."""
    from pope_fast.readout.benchmarks.asking import asked_questions, check_protocol
    from pope_fast.readout.data import Question

    amber = [Question(1005, "AMBER_1.jpg", "Is there a dog in this image?", "no", EXISTENCE,
                      "amber")]
    (q,), asked = asked_questions("amber", "vlmevalkit", amber, "vlmevalkit_llava")
    assert (q.text == "Is there a dog in this image?\nPlease answer yes or no."
            and asked["template_renders"] == "")
    mme = [Question("color/0.png#0", "color/0.png", " Is it red? Please answer yes or no.", "yes",
                    "color", "mme")]
    (q,), asked = asked_questions("mme", "lmms-eval", mme, "llava_plain")
    assert (q.text == "Is it red?\nAnswer the question using a single word or phrase."
            and asked["changed"])
    (q,), asked = asked_questions("mme", "vlmevalkit", mme, "vlmevalkit_llava")
    assert q.text == mme[0].text and asked == {"rule": "vlmevalkit", "changed": False,
                                               "template_renders": ""}
    with pytest.raises(ValueError,
                       match="--protocol llava: mme's rules are official, lmms-eval, vlmevalkit"):
        check_protocol("mme", "llava")


def test_a_paired_benchmark_run_is_compared_once_on_its_own_metrics(checkpoint, tmp_path):
    """eval --method none --method vcd on AMBER writes the comparison `pope-fast compare` makes of
    its two folders (AMBER's metrics, "no" positive), not POPE's ΔF1, and prints it."""
    data, images = _amber(tmp_path)
    printed = _eval(checkpoint, data, images, tmp_path / "paired", "--method", "none", "--method",
                    "vcd", "--readouts", "template_aware,first_token")
    written = json.loads((tmp_path / "paired/compare.json").read_text())
    again = CliRunner().invoke(main, ["compare", str(tmp_path / "paired/none"),
                                      str(tmp_path / "paired/vcd"), "--format", "json"])
    assert written["benchmark"] == "amber" and written == json.loads(again.output)
    assert "## amber: B - A on its own metrics" in printed and "ΔF1" not in printed


def test_report_of_a_benchmark_leads_with_its_own_metrics(checkpoint, tmp_path):
    """report on a paired AMBER folder: titled by the benchmark, its tables as tables, the
    comparison on AMBER's metrics, no POPE F1 tables (AMBER's all-"no" existence split drew a bold
    F1 of 0 before); --protocol selects that tool's rule, and a tool the benchmark has no rule of is
    refused before anything is written."""
    data, images = _amber(tmp_path)
    _eval(checkpoint, data, images, tmp_path / "paired", "--method", "none", "--method", "pai")
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(tmp_path / "paired"), "--out", str(out),
                                       "--formats", "png"])
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert "<title>AMBER (discriminative): pope-fast report</title>" in page and "<pre>" not in page
    assert "F1 by readout" not in page and "amber: B - A on its own metrics" in page
    assert "Commands: none: <code>" in page and "; pai: <code>" in page  # how each run was made
    # and no folder of this machine
    assert str(checkpoint) not in page and str(tmp_path) not in page
    assert json.loads((out / "scores.json").read_text()) == {"runs": []}
    results = json.loads((out / "benchmarks.json").read_text())["runs"]
    assert [r["benchmark"] for r in results] == ["amber", "amber"] and len(results[0]["rules"]) > 1
    chosen = CliRunner().invoke(main, ["report", str(tmp_path / "paired"), "--out",
                                       str(tmp_path / "r2"), "--protocol", "vlmevalkit",
                                       "--formats", "png"])
    assert chosen.exit_code == 0, chosen.output
    chosen_runs = json.loads((tmp_path / "r2/benchmarks.json").read_text())["runs"]
    assert all(set(r["rules"]) | set(r["unavailable"]) == {"vlmevalkit"} and not r["readouts"]
               for r in chosen_runs)
    # the baseline's text answers
    assert chosen_runs[0]["rules"]["vlmevalkit"] == results[0]["rules"]["vlmevalkit"]
    refused = CliRunner().invoke(main, ["report", str(tmp_path / "paired"), "--out",
                                        str(tmp_path / "r3"), "--protocol", "llava"])

    assert refused.exit_code == 1 and "amber has no rule of that tool's" in refused.output
    assert not (tmp_path / "r3").exists()
