"""Published protocols (readout/protocols/, a room per tool; --protocol): each tool's prompt, answer
rule and aggregation as its source states it (file and line in each docstring there), and the eval
that reproduces a tool's run question by question against transformers' generate, which is what the
tools call."""
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tinymodels import (SHARED_LLAVA_TOKENIZER, SHARED_QWEN2_TOKENIZER, eval_args, make_tiny_llava,
                        write_pope_set)

from pope_fast.cli import main
from pope_fast.coverage import protocol_for
from pope_fast.engine.models import FAMILIES, family_class
from pope_fast.readout import get_template, load_tokenizer
from pope_fast.readout.readouts import READOUTS, exact_match, yorn
from pope_fast.readout.protocols import (PROTOCOLS, TEMPLATES, coverage, llava, lmms_eval, vcd,
                                         vlmevalkit)
from pope_fast.readout.protocols.base import NOT_READ
from pope_fast.readout.protocols.lmms_eval import lmms_eval_metrics
from pope_fast.readout.protocols.pope_official import pope_evaluate_metrics
from pope_fast.readout.protocols.vlmevalkit import vlmevalkit_metrics
from pope_fast.readout.templates import OWN_TEMPLATES

Q = "Is there a dog in the image?"
POST = "\nAnswer the question using a single word or phrase."  # lmms-eval tasks/pope/pope.yaml


# VLMEvalKit YOrN_Extraction (yorn.py l.254-261) over process_punctuation (misc.py l.18-33), worked
# by hand: a mark beside a space anywhere is deleted everywhere, else replaced by a space; a
# digit,digit anywhere deletes every mark; periods not beside a digit are deleted; ':', '*' and "'"
# are kept.
@pytest.mark.parametrize("text, expected", [
    ("Yes", "yes"), ("No.", "no"), ("yes!", "yes"), ("(yes)", "yes"), ("\nYes\n", "yes"),
    ("Yes, there is a dog.", "yes"), ("No, there is not.", "no"),
    ("Yes, there is no dog.", "unknown"),  # both words
    ("Yes/no", "unknown"),  # '/' beside no space: replaced by one, two words
    ("yes/ no", "unknown"),  # '/' beside a space: deleted, 'yes' and 'no' still two words
    ("yes-no", "unknown"), ("yesno", "unknown"),
    # kept marks glue to the word
    ("**Yes**", "unknown"), ("Yes:", "unknown"), ("'yes'", "unknown"),
    ("ye.s", "yes"),  # a period beside no digit is deleted, joining the word
    ("1,000 yes", "yes"), ("Nope", "unknown"), ("", "unknown"), ("YES", "yes"),
])
def test_yorn_is_vlmevalkits_extraction(text, expected):
    assert yorn(text) == expected


def test_yorn_removes_at_most_32_periods():
    """re.UNICODE (32) lands in sub()'s count: the 33rd period stays, and glues 'yes' to a word."""
    assert yorn("." * 32 + " yes") == "yes"
    assert yorn("a." * 32 + "yes.no") == "unknown"  # 'yes.no' keeps its period: one word, neither
    assert yorn("a." * 31 + "yes.no") == "unknown"  # its period removed: 'yesno', still neither
    assert yorn("a." * 33 + " yes.") == "unknown"  # the 33rd and 34th periods stay: 'yes.'


LABELS = ["yes"] * 6 + ["no"] * 4
ANSWERS = ["yes", "yes", "yes", "no", "unknown", "unknown", "yes", "no", "no", "unknown"]


def test_lmms_eval_aggregation_as_its_utils_compute_it():
    """tasks/pope/utils.py l.31-84: an unknown answer to a yes question leaves recall's denominator
    (FN counts only "no"), scores 0 in accuracy; the yes-ratio counts labels."""
    m = lmms_eval_metrics(LABELS, ANSWERS)
    tp, fp, fn = 3, 1, 1
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert (m["pope_accuracy"] == 5 / 10 and m["pope_precision"] == precision
            and m["pope_recall"] == recall)
    assert m["pope_f1_score"] == 2 * (precision * recall) / (precision + recall)
    assert m["pope_yes_ratio"] == 0.6
    none = lmms_eval_metrics(["yes", "no"], ["unknown", "unknown"])
    assert none == {"pope_accuracy": 0.0, "pope_f1_score": 0, "pope_precision": 0, "pope_recall": 0,
                    "pope_yes_ratio": 0.5}


def test_vlmevalkit_aggregation_counts_unknown_as_no_in_percent():
    """yorn.py POPE_rating l.148-187: y_pred is 1 only for 'Yes', so Unknown is a false negative on
    a yes question; accuracy compares answer and extracted (Unknown is wrong); x100."""
    m = vlmevalkit_metrics(LABELS, ANSWERS)
    tp, fp, fn = 3, 1, 3
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert m == {"Overall": 2 * (precision * recall) / (precision + recall) * 100,
                 "acc": 5 / 10 * 100, "precision": precision * 100, "recall": recall * 100}


def test_pope_evaluate_aggregation_and_its_zero_division():
    """evaluate.py l.23-62 / eval_pope.py: anything not "no" is yes; F1 is 2*p*r/(p+r) in that
    order; the yes-ratio of predictions; no yes answer stops the script (ZeroDivisionError)."""
    labels = ["yes"] * 7 + ["no"] * 6
    answers = ["yes"] * 5 + ["no"] * 2 + ["yes"] * 2 + ["no"] * 4
    m = pope_evaluate_metrics(labels, answers)
    p, r = 5 / 7, 5 / 7
    assert (m["TP"], m["FP"], m["TN"], m["FN"]) == (5, 2, 4, 2)
    assert (m["F1 score"] == 2 * p * r / (p + r) and m["Accuracy"] == 9 / 13
            and m["Yes ratio"] == 7 / 13)
    stopped = pope_evaluate_metrics(["yes", "no"], ["no", "no"])
    assert (stopped["F1 score"] is None and "ZeroDivisionError" in stopped["error"]
            and stopped["Yes ratio"] == 0.0)


def test_the_order_of_operations_is_the_tools():
    """2*p*r/(p+r) (POPE, LLaVA) and 2*(p*r)/(p+r) (lmms-eval, VLMEvalKit) differ in the last bit
    for some counts; each protocol gives its own tool's float."""
    labels = ["yes"] * 10 + ["no"] * 10
    for tp in range(1, 10):
        for fp in range(0, 10):
            answers = ["yes"] * tp + ["no"] * (10 - tp) + ["yes"] * fp + ["no"] * (10 - fp)
            p, r = tp / (tp + fp), tp / 10
            assert pope_evaluate_metrics(labels, answers)["F1 score"] == 2 * p * r / (p + r)
            assert lmms_eval_metrics(labels, answers)["pope_f1_score"] == 2 * (p * r) / (p + r)


# The prompts as each tool builds them (the strings its source produces, see each room's sources).
PLAIN_PROMPTS = {
    "lmms_eval_llava_hf": f"USER: <image>\n{Q}{POST} ASSISTANT:",
    "lmms_eval_mistral": f"[INST] <image>\n{Q}{POST} [/INST]",
    "lmms_eval_instructblip": f"{Q}{POST}",
    "llava_official": "A chat between a curious user and an artificial intelligence assistant. "
                      "The assistant gives helpful, detailed, and polite answers to the user's "
                      "questions. USER: <image>\n" + Q + POST + " ASSISTANT:",
    "vlmevalkit_llava": "A chat between a curious human and an artificial intelligence assistant. "
                        "The assistant gives helpful, detailed, and polite answers to the human's "
                        "questions. " + "USER: " + " <image> " + Q + " ASSISTANT: ",
    "vlmevalkit_mistral": f"[INST] <image>\n{Q} [/INST]",
    "vlmevalkit_vicuna_hf": f"USER: <image>\n{Q} ASSISTANT:",
    "vlmevalkit_mplug_owl2": f"USER: <|image|>{Q} \nASSISTANT: ",
}


@pytest.mark.parametrize("name", PLAIN_PROMPTS)
def test_each_tools_prompt_byte_for_byte(name):
    assert get_template(name).render(Q) == PLAIN_PROMPTS[name]


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_QWEN2_TOKENIZER.is_dir(),
                    reason="needs ../shared's Qwen2-VL tokenizer")
def test_qwen2_vl_prompts_are_the_chat_template_over_the_tools_messages():
    """lmms-eval qwen2_vl: a system message, then [image, task text]; VLMEvalKit Qwen2VLChat: no
    system message (the template's default), [image, question + ' Please answer yes or no.']."""
    tokenizer = load_tokenizer(SHARED_QWEN2_TOKENIZER)
    image = {"type": "image"}
    lmms = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [image, {"type": "text", "text": Q + POST}]}]
    vlmeval = [{"role": "user",
                "content": [image, {"type": "text", "text": Q + " Please answer yes or no."}]}]
    for name, messages in (("lmms_eval_qwen2_vl", lmms), ("vlmevalkit_qwen2_vl", vlmeval)):
        theirs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert get_template(name).render(Q, tokenizer) == theirs, name
    assert get_template("lmms_eval_qwen2_vl").render(Q, tokenizer).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|>")


@pytest.mark.skipif(not SHARED_LLAVA_TOKENIZER.is_dir(), reason="needs ../shared's LLaVA tokenizer")
@pytest.mark.parametrize("name", ["llava_official", "vlmevalkit_llava", "lmms_eval_llava_hf"])
def test_one_tokenization_equals_llavas_chunked_one(name):
    """LLaVA's tokenizer_image_token (mm_utils.py l.185-204, which VLMEvalKit's LLaVA class calls
    too) encodes the text on each side of <image> alone, keeping the first BOS; the llava-hf
    tokenizer over the whole prompt gives the same ids, so the engine's prompt is the tool's."""
    tokenizer = load_tokenizer(SHARED_LLAVA_TOKENIZER)
    prompt = get_template(name).render(Q)
    before, after = prompt.split("<image>")
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    chunked = tokenizer(before).input_ids + [image_id] + tokenizer(after).input_ids[1:]
    assert tokenizer(prompt).input_ids == chunked


@pytest.mark.slow
def test_every_family_states_each_protocol():
    """A Coverage whose template marks the image as the family does, or the reason the tool has
    none."""
    for model_type in FAMILIES:
        cls = family_class(model_type)
        for label, config in cls.protocol_variants().items():
            for name in PROTOCOLS:
                try:
                    covered = coverage(name, cls, config)
                except ValueError as why:
                    assert (str(why).startswith(f"protocol {name} does not cover {cls.name}: ")
                            and len(str(why)) > 60)
                    continue
                assert get_template(covered.template).image_marker == cls.image_marker, \
                    (label, name)
                readout = READOUTS[PROTOCOLS[name].readout]
                assert (covered.new_tokens is None) == (readout.generation is None), (label, name)
    next_ = family_class("llava_next")
    assert coverage("lmms-eval", next_, {"text_config": {"model_type": "llama"}}).template \
        == "lmms_eval_llava_hf"
    assert coverage("lmms-eval", next_, {"text_config": {"model_type": "mistral"}}).template \
        == "lmms_eval_mistral"
    assert coverage("vlmevalkit", next_, {"text_config": {"model_type": "llama"}}).template \
        == "vlmevalkit_vicuna_hf"


@pytest.mark.parametrize("room", [lmms_eval, vlmevalkit, llava, vcd],
                         ids=lambda room: room.PROTOCOL.name)
def test_each_tools_table_is_keyed_by_real_model_types_and_says_what_it_does_not_name(room):
    """A room's coverage is keyed by model_type: a misspelt key would leave its family to the room's
    default. Its keys are families or models the transformers backend runs (model_types
    transformers' image-text-to-text classes map), and a model_type it does not name gets the room's
    default: a reason, never a silent coverage."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as MAPPED)
    from types import SimpleNamespace

    assert set(room.COVERAGE) - set(FAMILIES) <= set(MAPPED)
    # a model_type no room names
    unnamed = SimpleNamespace(family="no_such_model", name="No Such Model")
    with pytest.raises(ValueError, match=f"^protocol {room.PROTOCOL.name} "
                                         "does not cover No Such Model: ") as refused:
        coverage(room.PROTOCOL.name, unnamed, {})
    expected = room.ONLY_LLAVA if room.PROTOCOL.name == "llava" else NOT_READ
    assert str(refused.value).endswith(expected)


def test_lmms_eval_and_vlmevalkit_state_every_family():
    """The two tools that run many families have each family's entry read from their sources (a
    default there is for a family not yet read, which no registered family is)."""
    for room in (lmms_eval, vlmevalkit):
        assert set(room.COVERAGE) >= set(FAMILIES), room.PROTOCOL.name


def test_template_names_are_unique_across_the_rooms():
    """The registry collects every room's templates by name: a second room's template of the same
    name would replace the first's."""
    assert len(TEMPLATES) == len(OWN_TEMPLATES) + sum(len(p.templates) for p in PROTOCOLS.values())


def test_the_lookup_reads_what_a_family_declares():
    """The protocols that prescribe no prompt run the family's default one; a protocol that covers
    no family (score only, or unknown) says so in the message eval prints."""
    from types import SimpleNamespace

    family = SimpleNamespace(family="llava", name="Some family", seed_model="Seed-7B",
                             default_template="llava_yesno")
    assert coverage("paper", family, {}).to_json() == {
        "model_class": "the audit's prompt for Seed-7B", "template": "llava_yesno",
        "max_new_tokens": None, "image_aspect": "processor", "deviations": []}
    assert coverage("pope-official", family, {}).new_tokens == 128
    assert coverage("llava", family, {}).template == "llava_official"
    for name, other in (("repope", family),
                        ("lmms-eval", SimpleNamespace(family="new", name="Some family"))):
        with pytest.raises(ValueError,
                           match=f"^protocol {name} does not cover Some family: no entry"):
            coverage(name, other, {})


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    checkpoint = make_tiny_llava(root / "ckpt", init_std=0.3)
    images, files = write_pope_set(root / "pope", n_images=2, sizes=((90, 40), (40, 90)),
                                   questions_per_image=3)
    return root, checkpoint, images, files


def _eval(llava, out: Path, *extra) -> dict:
    root, checkpoint, images, files = llava
    result = CliRunner().invoke(main, eval_args(checkpoint, images, files, out, *extra))
    assert result.exit_code == 0, result.output
    return json.loads((out / "meta.json").read_text())


@pytest.mark.slow
def test_eval_under_lmms_eval_is_its_llava_hf_run_question_by_question(llava):
    """lmms-eval's llava_hf class: the processor over its prompt, generate(max_new_tokens=128,
    greedy), the new tokens decoded without specials (chat/llava_hf.py l.61-101), exact match on
    them."""
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    root, checkpoint, images, files = llava
    meta = _eval(llava, root / "lmms", "--protocol", "lmms-eval")
    assert meta["protocol"] == "lmms-eval" and meta["template"] == "lmms_eval_llava_hf"
    assert (meta["generation"]["exact_match"]["max_new_tokens"] == 128
            and meta["settings"]["image_aspect"] == "processor")
    model = LlavaForConditionalGeneration.from_pretrained(str(checkpoint),
                                                          dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    records = [json.loads(line) for line in (root / "lmms/records.jsonl").read_text().splitlines()]
    assert len(records) == 12
    for rec in records[:4]:
        inputs = processor(images=Image.open(images / rec["image"]).convert("RGB"),
                           text=f"USER: <image>\n{rec['text'].strip()}{POST} ASSISTANT:",
                           return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=128, do_sample=False)
        text = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                          skip_special_tokens=True)
        # `texts` holds a readout's text only where it is shorter than `decoded` (absent where none
        # is)
        assert rec.get("texts", {}).get("exact_match", rec["decoded"]) == text, rec["question_id"]
        assert rec["predictions"]["exact_match"] == exact_match(text)
    # score --protocol: lmms-eval's rows per split and pooled, from the records' exact-match answers
    result = CliRunner().invoke(main, ["score", str(root / "lmms"), "--protocol", "lmms-eval",
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["runs"]
    assert ([r["split"] for r in run["rows"]] == ["random", "adversarial", "Overall"]
            and run["checks"] == [])
    pooled = run["rows"][-1]
    labels = [r["label"] for r in records]
    assert pooled == {"split": "Overall", "n": 12, **lmms_eval_metrics(
        labels, [r["predictions"]["exact_match"] for r in records])}


@pytest.mark.slow
def test_score_says_what_keeps_a_run_from_a_protocols_number(llava):
    root = llava[0]
    meta = _eval(llava, root / "plain", "--max-new-tokens", "2")
    assert set(meta["protocol_coverage"]) == set(PROTOCOLS)
    result = CliRunner().invoke(main, ["score", str(root / "plain"), "--protocol", "vlmevalkit",
                                       "--format", "json"])
    (run,) = json.loads(result.output)["runs"]
    notes = run["checks"]
    assert any(n.startswith("prompt: this run's template is llava_plain, "
                            "vlmevalkit's is vlmevalkit_llava") for n in notes)
    assert any(n.startswith("image: this run's image_aspect is processor, vlmevalkit's pad")
               for n in notes)
    assert any(n.startswith("generation: ") and "2048" in n for n in notes)
    table = CliRunner().invoke(
        main, ["score", str(root / "plain"), "--protocol", "vlmevalkit"]).output
    assert "| split | n | Overall | acc | precision | recall |" in table and "! prompt: " in table
    assert CliRunner().invoke(main, ["score", str(root / "plain"), "--protocol", "llava",
                                     "--format", "models"]).exit_code != 0


def test_eval_refuses_what_a_protocol_does_not_cover_before_loading(llava, tmp_path):
    root, checkpoint, images, files = llava
    runner = CliRunner()
    base = ["eval", "--model", str(checkpoint), "--images", str(images), "--questions",
            str(files[0]), "--device", "cpu"]
    for extra, message in ((["--protocol", "lmms-eval", "--template", "llava_plain"],
                            "--template: --protocol lmms-eval"),
                           (["--protocol", "llava", "--max-new-tokens", "3"],
                            "--max-new-tokens: --protocol llava"),
                           (["--protocol", "llava", "--readouts", "exact_match"],
                            "answers by pope_official")):
        result = runner.invoke(main, [*base, "--out", str(tmp_path / "a"), *extra])
        assert result.exit_code != 0 and message in result.output, result.output
        assert not (tmp_path / "a" / "meta.json").exists()
    qwen_like = tmp_path / "qwen"  # a Qwen2-VL config whose tokenizer has no chat template
    qwen_like.mkdir()
    (qwen_like / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    (qwen_like / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="chat template, and the checkpoint has none"):
        protocol_for(qwen_like, "lmms-eval")
    (qwen_like / "config.json").write_text(json.dumps({"model_type": "mplug_owl2"}))
    with pytest.raises(ValueError, match="lmms-eval 0.7.3 has no mPLUG-Owl2 model class"):
        protocol_for(qwen_like, "lmms-eval")


def test_protocols_command_lists_every_protocol_and_family():
    result = CliRunner().invoke(main, ["protocols"])
    assert result.exit_code == 0, result.output
    for name in PROTOCOLS:
        assert f"\n{name}: " in "\n" + result.output
    assert repr(PLAIN_PROMPTS["vlmevalkit_llava"].replace(Q, "Is there a dog in the image?")) \
        in result.output
    assert "not covered: lmms-eval 0.7.3 has no mPLUG-Owl2 model class" in result.output


@pytest.mark.slow
def test_score_rescores_the_recorded_texts_under_each_protocol(llava, tmp_path):
    """The records' texts decide under each protocol's rule, aggregated as its tool does: the same
    answers give lmms-eval's, VLMEvalKit's and POPE's numbers, per split and pooled where the tool
    pools."""
    import shutil

    root = llava[0]
    if not (root / "lmms").is_dir():
        _eval(llava, root / "lmms", "--protocol", "lmms-eval")
    shutil.copytree(root / "lmms", tmp_path / "run")
    said = ["Yes", "No.", "yes, there is no dog", "Maybe.", "no", "Yes!"]
    lines = []
    for i, line in enumerate((tmp_path / "run/records.jsonl").read_text().splitlines()):
        rec = json.loads(line)
        rec.update(decoded=said[i % len(said)], texts={}, capped=[])
        lines.append(json.dumps(rec))
    (tmp_path / "run/records.jsonl").write_text("\n".join(lines) + "\n")
    records = [json.loads(line) for line in lines]
    labels = [r["label"] for r in records]
    texts = [r["decoded"] for r in records]

    def rows(protocol):
        result = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--protocol", protocol,
                                           "--format", "json"])
        assert result.exit_code == 0, result.output
        return {row["split"]: row for row in json.loads(result.output)["runs"][0]["rows"]}

    lmms = rows("lmms-eval")
    assert lmms["Overall"] == {"split": "Overall", "n": 12,
                               **lmms_eval_metrics(labels, [exact_match(t) for t in texts])}
    first = [i for i, r in enumerate(records) if r["split"] == "random"]
    assert lmms["random"] == {"split": "random", "n": 6,
                              **lmms_eval_metrics([labels[i] for i in first],
                                                  [exact_match(texts[i]) for i in first])}
    assert rows("vlmevalkit")["Overall"] == {"split": "Overall", "n": 12,
                                             **vlmevalkit_metrics(labels, [yorn(t) for t in texts])}
    from pope_fast.readout.readouts import pope_official
    llava_rows = rows("llava")
    assert "Overall" not in llava_rows
    assert llava_rows["random"] == {"split": "random", "n": 6, **pope_evaluate_metrics(
        [labels[i] for i in first], [pope_official(texts[i]) for i in first])}
    # the rules differ here
    assert lmms["Overall"]["pope_accuracy"] != rows("vlmevalkit")["Overall"]["acc"] / 100
    # --format csv: VLMEvalKit's score file's rows, Overall first, its column names, full precision
    import csv
    import io
    out = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--protocol", "vlmevalkit",
                                    "--format", "csv"])
    table = list(csv.DictReader(io.StringIO(out.output)))
    assert [r["split"] for r in table] == [
        "Overall", *(split for split in lmms if split != "Overall")]
    assert {k: float(table[0][k]) for k in ("Overall", "acc", "precision", "recall")} == \
        {k: v for k, v in rows("vlmevalkit")["Overall"].items() if k not in ("split", "n")}


@pytest.mark.slow
def test_compare_and_report_under_a_protocol(llava, tmp_path):
    """compare --protocol compares the protocol's answer rule alone, and shows each run's tool
    table; report --protocol leads with those tables (protocol.json beside the page)."""
    root = llava[0]
    for name, extra in (("lmms", ("--protocol", "lmms-eval")),
                        ("plain", ("--max-new-tokens", "2"))):
        if not (root / name / "meta.json").is_file():
            _eval(llava, root / name, *extra)
    result = CliRunner().invoke(main, ["compare", str(root / "lmms"), str(root / "plain"),
                                       "--allow-mismatch", "--protocol", "vlmevalkit",
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    (pair,) = json.loads(result.output)["pairs"]
    assert pair["readouts"] == ["yorn"] and json.loads(result.output)["protocol"] == "vlmevalkit"
    shown = CliRunner().invoke(main, ["compare", str(root / "lmms"), str(root / "plain"),
                                      "--allow-mismatch", "--protocol", "vlmevalkit"]).output
    assert shown.count("vlmevalkit: VLMEvalKit's POPE") == 2 and "| yorn |" in shown
    pytest.importorskip("matplotlib")
    result = CliRunner().invoke(main, ["report", str(root / "lmms"), "--out", str(tmp_path / "rep"),
                                       "--protocol", "lmms-eval", "--formats", "png"])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "rep/report.html").read_text()
    assert "Under lmms-eval: lmms-eval&#x27;s POPE task" in page and "pope_f1_score" in page
    (run,) = json.loads((tmp_path / "rep/protocol.json").read_text())["runs"]
    assert run["protocol"] == "lmms-eval" and run["rows"][-1]["split"] == "Overall"


@pytest.mark.slow
def test_a_template_whose_text_changed_is_another_run(llava, tmp_path, monkeypatch):
    """llava_official's system text was fixed under the same name: a folder begun with the old text
    is not resumed with the new one (meta.json's prompt_example is part of what must match)."""
    import dataclasses

    _eval(llava, tmp_path / "run", "--template", "llava_official", "--max-new-tokens", "2",
          "--limit", "2")
    old = TEMPLATES["llava_official"]
    monkeypatch.setitem(TEMPLATES, "llava_official",
                        dataclasses.replace(old, system=old.system + " "))
    root, checkpoint, images, files = llava
    args = ["eval", "--model", str(checkpoint), "--images", str(images), "--out",
            str(tmp_path / "run"), "--device", "cpu", "--template", "llava_official",
            "--max-new-tokens", "2", "--limit", "2"]
    result = CliRunner().invoke(main, args + [a for f in files for a in ("--questions", str(f))])
    assert result.exit_code != 0 and "prompt_example" in result.output, result.output


def _samples_log(path, texts, labels):
    """An lmms-eval POPE samples log as v0.7 writes it: each metric's entry from tasks/pope/utils.py
    l.17-28."""
    lines = []
    for i, (text, label) in enumerate(zip(texts, labels)):
        pred = text.lower().strip()
        entry = {"question_id": str(500 + i), "score": 1.0 if pred == label else 0.0,
                 "prediction": pred, "ground_truth": label}
        lines.append(json.dumps({"doc_id": i, "target": label, "arguments": [], "resps": [[text]],
                                 # before and since v0.7
                                 "filtered_resps": [text] if i % 2 else text,
                                 **{m: entry for m in ("pope_accuracy", "pope_precision",
                                                       "pope_recall", "pope_f1_score",
                                                       "pope_yes_ratio")}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_lmms_eval_samples_log_rescored_under_every_rule(tmp_path):
    """lmms-eval's own numbers, from its own logged predictions, are what --protocol lmms-eval gives
    on its log; the other rules read the same texts their own way."""
    texts = ["Yes", "No", "yes.", "No, there is no dog.", " no ", "Not sure", "YES", "no"] * 3
    labels = ["yes", "no", "yes", "no", "yes", "no", "no", "yes"] * 3
    log = _samples_log(tmp_path / "20260101_101010_samples_pope_pop.jsonl", texts, labels)
    [run] = json.loads(CliRunner().invoke(main, ["score", str(log), "--protocol", "lmms-eval",
                                                 "--format", "json"]).output)["runs"]
    logged = [json.loads(line)["pope_accuracy"] for line in log.read_text().splitlines()]
    theirs = lmms_eval_metrics([e["ground_truth"] for e in logged],
                               [e["prediction"] if e["prediction"] in ("yes", "no") else "unknown"
                                for e in logged])
    assert run["rows"][0] == {"split": "popular", "n": 24, **theirs}
    scored = json.loads(CliRunner().invoke(
        main, ["score", str(log), "--format", "json"]).output)["runs"][0]
    assert (scored["readouts"]["yorn"]["unknown"] == 3
            and scored["readouts"]["exact_match"]["unknown"] == 9)
    assert "template_aware" in scored["unavailable"]  # the log holds no logits
    bad = tmp_path / "samples.jsonl"
    bad.write_text(log.read_text())
    out = CliRunner().invoke(main, ["score", str(bad)])
    assert out.exit_code != 0 and "names no POPE task" in out.output
    torn = tmp_path / "20260101_samples_pope_adv.jsonl"
    torn.write_text(log.read_text().replace('"filtered_resps": ["No"]', '"filtered_resps": 3', 1))
    out = CliRunner().invoke(main, ["score", str(torn)])
    assert f"{torn}:2: filtered_resps 3 holds no one answer text" in out.output


def test_a_vlmevalkit_prediction_table_rescored_under_every_rule(tmp_path):
    """VLMEvalKit's POPE table (PRED_FORMAT=tsv: every field quoted, a question in two splits
    comma-joined): --protocol vlmevalkit gives POPE_rating's rows on its exploded rows (yorn.py
    l.160-187), Overall first."""
    import csv

    texts = ["Yes", "No.", "There is no dog", "yes, a dog", "I can't tell", "No"] * 2
    answers = ["Yes", "No", "No", "Yes", "Yes", "No"] * 2
    categories = ["adversarial", "popular", "adversarial,popular",
                  "random", "popular", "random"] * 2
    path = tmp_path / "llava_v1.5_7b_POPE.tsv"
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file, delimiter="\t", quoting=csv.QUOTE_ALL)
        writer.writerow(["index", "question", "answer", "category", "prediction"])
        writer.writerows([[i, f"Is there a dog{i}?", a, c, t]
                          for i, (t, a, c) in enumerate(zip(texts, answers, categories))])
    out = CliRunner().invoke(main, ["score", str(path), "--protocol", "vlmevalkit",
                                    "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["split"]: r for r in json.loads(out.output)["runs"][0]["rows"]}
    exploded = [(c, a.lower(), yorn(t)) for t, a, cs in zip(texts, answers, categories)
                for c in cs.split(",")]
    assert rows["Overall"] == {"split": "Overall", "n": 14,
                               **vlmevalkit_metrics([a for _, a, _ in exploded],
                                                    [d for _, _, d in exploded])}
    popular = [(a, d) for c, a, d in exploded if c == "popular"]
    assert (rows["popular"]["n"] == 6
            and rows["popular"]["acc"] == vlmevalkit_metrics(*zip(*popular))["acc"])
    xlsx = tmp_path / "llava_v1.5_7b_POPE.xlsx"
    xlsx.write_bytes(b"PK\x03\x04")
    result = CliRunner().invoke(main, ["score", str(xlsx)])
    assert (result.exit_code != 0 and "PRED_FORMAT=tsv" in result.output
            and "Traceback" not in result.output)


def test_vlmevalkit_mplug_owl2_generates_at_least_one_token_and_score_checks_it():
    """VLMEvalKit's mPLUG-Owl2 generate (vlm/mplug_owl2.py l.40-42: min_new_tokens 1) is the run's
    setting under --protocol vlmevalkit, recorded only where set; score names a run made without
    it."""
    from pope_fast.engine import Settings
    from pope_fast.readout.protocols.scoring import checks

    covered = coverage("vlmevalkit", family_class("mplug_owl2"), {})
    assert covered.min_new_tokens == 1 and covered.deviations == ()
    assert covered.to_json()["min_new_tokens"] == 1
    assert "min_new_tokens" not in coverage("vlmevalkit", family_class("llava"), {}).to_json()
    assert ("min_new_tokens" not in Settings().to_json()
            and Settings(min_new_tokens=1).to_json()["min_new_tokens"] == 1)
    with pytest.raises(ValueError, match="min_new_tokens must be 0 or 1, not 2"):
        Settings(min_new_tokens=2)
    meta = {"template": covered.template, "protocol_coverage": {"vlmevalkit": covered.to_json()},
            "generation": {"vlmevalkit_text": {"max_new_tokens": 512}}}
    found = checks(PROTOCOLS["vlmevalkit"], {**meta, "settings": Settings().to_json()}, 0)
    assert "generation: this run's min_new_tokens is 0, vlmevalkit's 1" in found
    assert not any("min_new_tokens" in line for line in checks(
        PROTOCOLS["vlmevalkit"], {**meta, "settings": Settings(min_new_tokens=1).to_json()}, 0))


@pytest.mark.parametrize("tool", ["lmms-eval", "vlmevalkit", "llava"])
def test_tools_that_call_generate_apply_the_checkpoints_generation_config_and_score_checks_it(tool):
    """Every class of lmms-eval, VLMEvalKit and LLaVA's script calls transformers' generate, which
    applies the checkpoint's generation_config.json: each coverage says greedy, VLMEvalKit's
    Qwen2VLChat with its own repetition_penalty 1.0 (vlm/qwen2_vl/model.py l.190); eval --protocol's
    settings take both, and score names a run made without them. Not VLMEvalKit's Qwen3VLChat (vLLM;
    dense and MoE) nor InternVLChat (InternVL's chat calls its inner language model's generate,
    whose generation config is that model's default)."""
    from pope_fast.engine import Settings
    from pope_fast.evaluate import protocol_settings
    from pope_fast.readout.protocols.scoring import checks

    covered = {}
    for model_type in FAMILIES:
        try:
            covered[model_type] = coverage(tool, family_class(model_type), {})
        except ValueError:
            continue
    assert covered
    penalty = ({"qwen2_vl": 1.0, "qwen2_5_vl": 1.0, "instructblip": 1.5} if tool == "vlmevalkit"
               else {})
    own = ({"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "internvl"}
           if tool == "vlmevalkit" else set())
    # LLaVA's, LLaVA-NeXT's and LAVIS's own generate: inputs_embeds alone
    embeds = {"vlmevalkit": {"llava", "instructblip"}, "llava": {"llava"}}.get(
        tool, {"llava_onevision"})
    assert {m: c.generation_config for m, c in covered.items()} == \
        {m: "none" if m in own else "greedy_output" if m in embeds else "greedy" for m in covered}
    assert {m: c.repetition_penalty for m, c in covered.items()
            if c.repetition_penalty is not None} == penalty
    for model_type, c in covered.items():
        # a dtype given: the tool's "auto" unresolved here
        settings = protocol_settings(Settings(dtype="fp32"), c)
        assert (settings.generation_config, settings.repetition_penalty) == (
            c.generation_config, c.repetition_penalty)
        meta = {"template": c.template, "protocol_coverage": {tool: c.to_json()},
                "generation": {PROTOCOLS[tool].readout: {"max_new_tokens": c.new_tokens}}}
        found = checks(PROTOCOLS[tool], {**meta, "settings": Settings().to_json()}, 0)
        if model_type not in own:
            assert (f"generation: this run's generation_config is none, "
                    f"{tool}'s {c.generation_config}") in found
        if model_type in penalty:
            assert (f"generation: this run's repetition_penalty is the checkpoint's, "
                    f"{tool}'s {penalty[model_type]}") in found
        assert not any(k in line for k in ("generation_config", "repetition_penalty")
                       for line in checks(PROTOCOLS[tool],
                                          {**meta, "settings": settings.to_json()}, 0))


def test_score_compares_the_generation_config_rules_a_run_applied_with_the_tools():
    """Where meta.json records the checkpoint's generation config rules (Qwen2.5-VL's
    repetition_penalty 1.05), a check compares the rules applied: lmms-eval's generate applies the
    penalty, VLMEvalKit's passes 1.0 over it, a plain run applies none; a checkpoint that sets no
    rule differs in nothing, whatever the steps."""
    from pope_fast.engine import Settings
    from pope_fast.readout.protocols.scoring import checks

    qwen = family_class("qwen2_5_vl")
    tools = {tool: coverage(tool, qwen, {}) for tool in ("lmms-eval", "vlmevalkit")}
    runs = {"plain": Settings(), "lmms-eval": Settings(generation_config="greedy"),
            "vlmevalkit": Settings(generation_config="greedy", repetition_penalty=1.0)}

    def found(run, tool, recorded):
        c = tools[tool]
        meta = {"template": c.template, "protocol_coverage": {tool: c.to_json()},
                "generation_config": recorded,
                "generation": {PROTOCOLS[tool].readout: {"max_new_tokens": c.new_tokens}},
                "settings": runs[run].to_json()}
        return [line for line in checks(PROTOCOLS[tool], meta, 0)
                if "generation" in line or "penalty" in line]

    why = " (the checkpoint's generation_config.json under the tool's arguments)"
    penalty = {"repetition_penalty": 1.05}
    assert found("lmms-eval", "lmms-eval", penalty) \
        == found("vlmevalkit", "vlmevalkit", penalty) == []
    assert found("plain", "lmms-eval", penalty) == [
        "generation: this run's continuations apply no rule, "
        "lmms-eval's generate repetition_penalty 1.05" + why]
    assert found("lmms-eval", "vlmevalkit", penalty) == [
        "generation: this run's continuations apply repetition_penalty 1.05, "
        "vlmevalkit's generate no rule" + why]
    # the tool's 1.0 over 1.05: no rule either way
    assert found("plain", "vlmevalkit", penalty) == []
    assert found("plain", "lmms-eval", {"repetition_penalty": 1.05, "no_repeat_ngram_size": 3}) == [
        "generation: this run's continuations apply no rule, "
        "lmms-eval's generate no_repeat_ngram_size 3, repetition_penalty 1.05" + why]
    assert all(found(run, tool, {}) == [] for run in runs for tool in tools)
    # LLaVA's own generate: the prompt as inputs_embeds
    llava = coverage("llava", family_class("llava"), {})
    meta = {"template": llava.template, "protocol_coverage": {"llava": llava.to_json()},
            "generation_config": penalty, "generation": {"pope_official": {"max_new_tokens": 128}},
            "settings": runs["lmms-eval"].to_json()}
    assert "generation: this run's continuations apply repetition_penalty 1.05, " \
        "llava's generate read the output only, repetition_penalty 1.05" + why \
        in checks(PROTOCOLS["llava"], meta, 0)


def test_vlmevalkit_gemma3_attends_its_image_causally_and_score_checks_it():
    """VLMEvalKit loads Gemma 3 with flash_attention_2 (vlm/gemma.py l.102-104), whose kernel
    applies only the causal mask: --protocol vlmevalkit runs the engine with image_mask causal
    (recorded only where set), lmms-eval (sdpa) keeps the model's own mask, and score names a run
    made with the model's mask."""
    from pope_fast.engine import Settings
    from pope_fast.evaluate import protocol_settings
    from pope_fast.readout.protocols.scoring import checks

    covered = coverage("vlmevalkit", family_class("gemma3"), {})
    assert covered.image_mask == "causal" and covered.to_json()["image_mask"] == "causal"
    assert not any("flash" in d for d in covered.deviations)
    assert coverage("lmms-eval", family_class("gemma3"), {}).image_mask == "model"
    assert protocol_settings(Settings(), covered).image_mask == "causal"
    assert ("image_mask" not in Settings().to_json()
            and Settings(image_mask="causal").to_json()["image_mask"] == "causal")
    with pytest.raises(ValueError,
                       match="image_mask must be one of model, causal, not 'bidirectional'"):
        Settings(image_mask="bidirectional")
    meta = {"template": covered.template, "protocol_coverage": {"vlmevalkit": covered.to_json()},
            "generation": {"vlmevalkit_text": {"max_new_tokens": 4096}}}
    found = checks(PROTOCOLS["vlmevalkit"],
                   {**meta, "settings": Settings(image_reencode="load_image").to_json()}, 0)
    assert "attention: this run's image_mask is model, vlmevalkit's causal" in found
    # the image step in plain words (it read "image: this run's image_reencode is none, lmms-eval's
    # rgb")
    plain = checks(PROTOCOLS["vlmevalkit"], {**meta, "settings": Settings().to_json()}, 0)
    assert "image: this run hands its processor each image file as read; " \
           "vlmevalkit opens each image as transformers' load_image does " \
           "(turned upright by its EXIF orientation, then converted to RGB), " \
           "so the pixels the model sees can differ " \
           "(image_reencode none, vlmevalkit's load_image)" in plain
    ours = protocol_settings(Settings(), covered).to_json()
    assert not any("image_mask" in line
                   for line in checks(PROTOCOLS["vlmevalkit"], {**meta, "settings": ours}, 0))


def test_lmms_eval_runs_the_chat_class_where_it_registers_one():
    """lmms-eval resolves --model qwen2_5_vl and qwen3_vl to their chat classes
    (models/registry_v2.py l.82-97, models/__init__.py AVAILABLE_CHAT_TEMPLATE_MODELS at v0.7.2),
    which hand qwen_vl_utils the image as read: no JPEG round trip there (only the POPE task's
    convert('RGB')); qwen2_vl has only its simple class, which re-encodes each image as JPEG q85."""
    for family in ("qwen2_5_vl", "qwen3_vl"):
        covered = coverage("lmms-eval", family_class(family), {})
        assert "the chat class" in covered.model_class and covered.image_reencode == "rgb"
        assert covered.to_json()["image_reencode"] == "rgb"
    assert coverage("lmms-eval", family_class("qwen2_vl"), {}).image_reencode == "jpeg85"


def test_vlmevalkit_qwen_classes_resize_as_qwen_vl_utils_in_their_config_bounds():
    """VLMEvalKit's config gives Qwen2VLChat min_pixels 1280*28*28 and max_pixels 16384*28*28
    (config.py l.1936-1941, l.2004-2010) and Qwen3VLChat none, so qwen_vl_utils' defaults at
    image_patch_size 16 apply (vlm/qwen3_vl/model.py l.165-181, l.371-376); the checkpoint's
    processor follows. Qwen3-VL's one deviation left is its sampling, which no deterministic run
    matches."""
    for family in ("qwen2_vl", "qwen2_5_vl"):
        covered = coverage("vlmevalkit", family_class(family), {})
        assert (covered.image_resize, covered.processor_pixels, covered.deviations) == \
            ("qwen_vl_utils:28:1003520:12845056", None, ())
    qwen3 = coverage("vlmevalkit", family_class("qwen3_vl"), {})
    assert qwen3.image_resize == "qwen_vl_utils:32" and qwen3.processor_pixels is None
    assert len(qwen3.deviations) == 1 and "samples with vLLM" in qwen3.deviations[0]


def test_a_tools_steps_are_engine_settings_of_the_same_default():
    """TOOL_STEPS (readout, which imports no engine) name engine Settings fields: the same names,
    the same defaults, recorded where set (eval --protocol copies each from the Coverage into the
    Settings)."""
    from dataclasses import fields

    from pope_fast.engine.utils.settings import RECORDED_WHERE_SET, Settings
    from pope_fast.readout.protocols.base import STEP_DEFAULTS
    from pope_fast.readout.tool_steps import TOOL_STEPS

    assert set(TOOL_STEPS) == set(RECORDED_WHERE_SET)
    assert {f.name: f.default for f in fields(Settings) if f.name in TOOL_STEPS} == STEP_DEFAULTS
