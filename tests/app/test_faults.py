"""The second fault probe (73 faults tried as a new user would): each fault that was mishandled, as
a test that fails without its fix. Every one ends in one line naming what is wrong, or is handled,
and never leaves a folder holding two runs' records."""
import json
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from tinymodels import QUESTIONS, eval_args, make_tiny_llava, synthetic_image, write_pope_set

from pope_fast.cli import main
from pope_fast.engine import CheckpointError, Engine, Settings, parse_method
from pope_fast.readout import Question, make_record
from pope_fast.readout.records import part_name
from pope_fast.store import write_meta

pytestmark = pytest.mark.slow  # eval, score and their faults end to end on tiny checkpoints

READOUTS = "template_aware,legacy_2tok"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("faults") / "ckpt", builtin_tokenizer=True)


@pytest.fixture(scope="module")
def pope(tmp_path_factory):
    return write_pope_set(tmp_path_factory.mktemp("pope"), n_images=3)


def _eval(checkpoint, pope, out, *extra):
    return CliRunner().invoke(main,
                              eval_args(checkpoint, *pope, out, "--readouts", READOUTS, *extra))


def refused(result, *patterns):
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    for pattern in patterns:
        assert re.search(pattern, line), line
    return line


# High: data mixed or a silently wrong result ------------------------------------------------------

def test_records_without_their_meta_are_not_resumed_under_other_settings(checkpoint, pope,
                                                                         tmp_path):
    out = tmp_path / "out"
    assert _eval(checkpoint, pope, out).exit_code == 0
    before = (out / "records.jsonl").read_bytes()
    (out / "meta.json").unlink()
    refused(_eval(checkpoint, pope, out, "--dtype", "bf16", "--template", "llava_yesno"),
            r"records\.jsonl: holds records but .*meta\.json is missing", r"choose a new --out")
    assert (out / "records.jsonl").read_bytes() == before and not (out / "meta.json").exists()


def test_an_integer_dtype_for_a_float_weight_is_refused_naming_the_tensor(checkpoint, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    name = next(k for k, v in header.items()
                if k != "__metadata__" and v["dtype"] == "F32" and "q_proj" in k)
    header[name]["dtype"] = "I32"  # the same bytes, read as integers
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    path.write_bytes(bytes(data[:8]) + text + bytes(data[8 + size:]))
    with pytest.raises(CheckpointError,
                       match=rf"tensor {re.escape(name)} is stored as int32, but it is a weight"):
        Engine.load(ckpt, Settings())


def test_api_arguments_are_checked_up_front(checkpoint):
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    image = synthetic_image(3, (60, 50))
    with pytest.raises(TypeError, match="questions must be a list of question strings"):
        engine.answer(image, "Is there a dog in the image?")
    prepared = engine.prepare([image, image])
    with pytest.raises(ValueError, match="2 prepared images but 1 question lists"):
        engine.run_methods(prepared, [QUESTIONS[:2]], [parse_method("none")])
    with pytest.raises(ValueError, match="1 prepared images but 2 question lists"):
        engine.run_methods(prepared[:1], [QUESTIONS[:2]] * 2, [parse_method("none")])
    with pytest.raises(TypeError, match="image must be a file path, a file's bytes, a PIL image "
                                        "or a LoadedImage"):
        engine.answer(1234, QUESTIONS[:1])
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    from_bytes, from_image = (engine.answer(buffer.getvalue(), QUESTIONS[:2]),
                              engine.answer(image, QUESTIONS[:2]))
    assert [a.candidate_logits for a in from_bytes] == [a.candidate_logits for a in from_image]


# Medium: tracebacks, runs that are not idempotent -------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ("vcd:noise_step=5000", r"method vcd: noise_step must lie in \[0, 999\], not 5000"),
    ("vcd:beta=0", r"method vcd: beta must lie in \(0\.0, 1\.0\], not 0"),
    ("vcd:alpha=abc", r"method vcd: alpha must be a number, not 'abc'"),
    ("vcd:noise_step=-1", r"method vcd: noise_step must lie in \[0, 999\], not -1"),
    ("vcd:alpha=", r"method vcd: alpha must be a number, not ''"),
    ("pai:layers=3", r"method pai: layers takes FIRST-LAST"),
])
def test_method_settings_are_checked_before_the_model_loads(checkpoint, pope, tmp_path, monkeypatch,
                                                            spec, message):
    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Engine, "load", never)
    refused(_eval(checkpoint, pope, tmp_path / "out", "--method", "none", "--method", spec),
            message)


def test_report_into_an_unwritable_place_is_one_line(checkpoint, pope, tmp_path):
    assert _eval(checkpoint, pope, tmp_path / "out").exit_code == 0
    (tmp_path / "file").write_text("a file, not a folder")
    pytest.importorskip("matplotlib")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "out"), "--out",
                                       str(tmp_path / "file" / "report")])

    refused(result, r"file/report|Not a directory|File exists")


# Low: unclear or misleading -----------------------------------------------------------------------

def test_compare_says_when_a_run_stopped_part_way(checkpoint, pope, tmp_path):
    out = tmp_path / "paired"
    assert _eval(checkpoint, pope, out, "--method", "none", "--method", "vcd").exit_code == 0
    for method in ("none", "vcd"):
        lines = (out / method / "records.jsonl").read_text().splitlines(keepends=True)
        (out / method / "records.jsonl").write_text("".join(lines[:-5]))
    result = CliRunner().invoke(main, ["compare", str(out / "none"), str(out / "vcd")])
    assert result.exit_code == 0, result.output
    assert "**INCOMPLETE RUNS**" in result.output and re.search(r"A: \S+ \d+ of 12", result.output)
    scored = CliRunner().invoke(main, ["score", str(out / "none")])
    assert "of 12 asked (incomplete: the run stopped part way)" in scored.output


def _folder(tmp_path, records: dict[str, list[dict]]):
    tmp_path.mkdir()
    write_meta(tmp_path, {"token_sets": {"legacy_2tok": {"yes_ids": [1], "no_ids": [2]}}})
    for name, recs in records.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    return tmp_path


def _rec(qid, error=None):
    q = Question(qid, f"img{qid}.jpg", f"question {qid}", "yes", "demo")
    if error:
        return make_record(q, "llava_plain", error=error)
    return make_record(q, "llava_plain", first_token_id=1, candidate_logits={1: 1.0, 2: 0.0},
                       predictions={"legacy_2tok": "yes"})


def test_a_stopped_torchrun_folder_is_scored_and_repaired_from_its_parts(tmp_path):
    run = _folder(tmp_path / "run", {part_name(0): [_rec(1), _rec(2)], part_name(1): [_rec(3)]})
    scored = CliRunner().invoke(main, ["score", str(run), "--format", "json"])
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.output)["runs"][0]["n"] == 3
    repaired = CliRunner().invoke(main, ["repair", str(run)])
    assert repaired.exit_code == 0 and "kept 3 records" in repaired.output, repaired.output
    assert sorted(p.name for p in run.glob("records*")) == ["records.jsonl"]


def test_an_empty_records_file_says_so(tmp_path):
    run = _folder(tmp_path / "run", {"records.jsonl": []})
    refused(CliRunner().invoke(main, ["score", str(run)]), r"records\.jsonl: no records yet")


def test_f1_tables_of_a_run_with_only_errors_bold_nothing(tmp_path):
    from pope_fast.readout import read_records, score_records
    from pope_fast.readout.report.tables import format_f1_tables

    run = _folder(tmp_path / "run",
                  {"records.jsonl": [_rec(1, error="img1.jpg: image file not found")]})
    table = format_f1_tables(score_records(read_records(run), ["legacy_2tok"]))
    assert "**" not in table and "1 (1 errors)" in table and "| - |" in table


def test_a_category_must_name_a_pope_split_and_is_normalized(tmp_path):
    from pope_fast.readout import DataError, load_questions

    path = tmp_path / "coco_pope_random.json"
    row = {"question_id": 1, "image": "a.jpg", "text": "Is there a cat?", "label": "yes"}
    path.write_text(json.dumps(dict(row, category=" Adversarial")) + "\n")
    assert load_questions(path)[0].split == "adversarial"
    path.write_text(json.dumps(dict(row, category="animal")) + "\n")
    with pytest.raises(DataError,
                       match=r"coco_pope_random\.json:1: category 'animal' is not one of"):
        load_questions(path)
    assert load_questions(path, split="mine")[0].split == "mine"  # --split names such a file
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    def parquet(categories):
        image = {"bytes": b"\x89PNG fake", "path": "a.png"}
        table = pa.table({"question_id": [str(i) for i in range(len(categories))],
                          "question": ["Is there a cat?"] * len(categories),
                          "answer": ["yes"] * len(categories), "image": [image] * len(categories),
                          "category": categories})
        out = tmp_path / "test-00000-of-00001.parquet"
        pq.write_table(table, out)
        return out

    assert [q.split for q in load_questions(parquet(["Random", "popular ", "adversarial"]))] == \
        ["random", "popular", "adversarial"]
    with pytest.raises(DataError,
                       match=r"category 'foo' is not one of adversarial, popular, random"):
        load_questions(parquet(["random", "foo"]))


def test_records_made_immutable_mid_run_name_the_file(checkpoint, tmp_path):
    from pope_fast.sweep import run_plain

    probe = tmp_path / "probe"
    probe.write_text("x")
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not permitted here (needs CAP_LINUX_IMMUTABLE)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    from pope_fast.readout import load_questions

    engine = Engine.load(checkpoint, Settings(image_batch=1), readouts="template_aware")
    records = tmp_path / "out" / "records.jsonl"

    def freeze(_):
        subprocess.run(["chattr", "+i", str(records)], check=True)

    try:
        with pytest.raises(OSError) as stopped:
            run_plain(engine, load_questions(files[0]), images, tmp_path / "out", progress=freeze)
        assert stopped.value.filename == str(records)
    finally:
        subprocess.run(["chattr", "-i", str(records)], check=False)


def test_missing_tokenizer_files_are_one_line(checkpoint, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                 "special_tokens_map.json"):
        (ckpt / name).unlink(missing_ok=True)
    with pytest.raises(CheckpointError) as refused_load:
        Engine.load(ckpt, Settings())
    message = str(refused_load.value)
    assert "\n" not in message and message.startswith(
        f"{ckpt.resolve()}: no usable tokenizer files") and len(message) < 400, message


@pytest.mark.parametrize("option", [["--readouts", "bogus"], ["--method", "foo"]],
                         ids=["readouts", "method"])
def test_a_bad_argument_leaves_no_folder_behind(option, tmp_path):
    """Refused before the demo's checkpoint, the lock or the folder is written: no --out left (issue
    35)."""
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["eval", "--out", str(out), *option])
    assert result.exit_code == 1 and "unknown" in result.output and not out.exists(), result.output
