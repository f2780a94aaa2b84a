"""The engine against transformers' LlavaForConditionalGeneration, the oracle, on tiny random
checkpoints: LLaVA's quirks and the engine's whole-run behaviour (sweeps, caches, resumes, the CLI)
on the first family; its battery is test_battery's llava cases."""
import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from registry import REGISTRY
from tinymodels import (QUESTIONS, SHARED_LLAVA_TOKENIZER, eval_args, make_tiny_llava,
                        synthetic_image, worst_difference,
                        write_pope_set)

from pope_fast.cli import main
from pope_fast.engine import Engine, ImagePrompts, Intervention, Settings
from pope_fast.engine.models import FAMILIES
from pope_fast.sweep import run_plain
from pope_fast.readout import READOUTS, load_questions

FAMILY = "llava"  # whose checkpoint, model and oracle tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images


@pytest.fixture(scope="module")
def oracle(tiny, checkpoint):
    """registry's oracle (transformers' answer-position logits, greedy continuation and prompt ids
    per (image, question)) and the processor's tokenizer."""
    from transformers import AutoProcessor

    return tiny.oracle("llava"), AutoProcessor.from_pretrained(str(checkpoint)).tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("feature_layer, layers_kept",
                         [(-1, 2), ([-3, -2], 1), ([-2, -1], 2), ([0, 1], 1)],
                         ids=["last", "embeddings-and-first", "last-two", "first-two"])
def test_other_feature_layers_match_transformers(tmp_path, feature_layer, layers_kept):
    """The vision tower runs only up to the deepest layer LLaVA reads; the features are the same."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    checkpoint = make_tiny_llava(tmp_path / "ckpt", feature_layer=feature_layer)
    model = LlavaForConditionalGeneration.from_pretrained(str(checkpoint),
                                                          dtype=torch.float32).eval()
    inputs = AutoProcessor.from_pretrained(str(checkpoint))(
        images=IMAGES[0], text=f"USER: <image>\n{QUESTIONS[0]}\nASSISTANT:", return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
    engine = Engine.load(checkpoint, Settings(), readouts="legacy_8tok")
    assert len(engine.model.vision.encoder.layers) == layers_kept
    diff, at = worst_difference(engine.answer(IMAGES[0], QUESTIONS[:1])[0].candidate_logits, logits)
    assert diff <= 1e-4, f"id {at} differs by {diff:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [4, 32])
def test_images_grouped_in_one_batch_match_transformers(checkpoint, oracle, batch_size):
    """Several images' prefixes prefilled together, suffix batches (and their continuations)
    spanning images."""
    reference, tokenizer = oracle
    engine = Engine.load(checkpoint, Settings(batch_size=batch_size, max_new_tokens=4),
                         readouts="template_aware,string_parse")
    features = [engine.features(image) for image in IMAGES]
    prompts = [engine.prompt(q) for q in QUESTIONS]
    outputs = engine.run_images([ImagePrompts(f, prompts) for f in features])
    ids = engine.model.prompt_ids(prompts[0], features[0].shape[0])
    prefix_length = max(k for k, t in enumerate(ids) if t == engine.model.image_token_id) + 1
    assert engine.counts.prefix_tokens == len(IMAGES) * prefix_length   # each image's prefix once
    assert engine.counts.prompts == len(IMAGES) * len(QUESTIONS)
    for i, per_image in enumerate(outputs):
        for q, result in zip(QUESTIONS, per_image):
            first, logits, text = result.first_token_id, result.candidate_logits, result.decoded
            ref_logits, generated, _ = reference[i, q]
            diff, at = worst_difference(logits, ref_logits)
            assert diff <= 1e-4, f"image {i} {q!r}: id {at} differs by {diff:.2e}"
            assert first == generated[0]
            eos = tokenizer.eos_token_id
            cut = generated.index(eos) if eos in generated else len(generated)
            assert text == tokenizer.decode(generated[:cut], skip_special_tokens=True)


@pytest.mark.slow
def test_each_text_readout_reads_its_reference_length_of_one_continuation(checkpoint):
    """By default string_parse reads 6 new tokens (the paper) and exact_match 128 (lmms-eval), both
    cut from one continuation: each text equals what generate gives at that readout's
    max_new_tokens."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    engine = Engine.load(checkpoint, Settings(batch_size=2), readouts="string_parse,exact_match")
    assert engine.readout.new_tokens == 128   # the loop runs to the longest
    model = LlavaForConditionalGeneration.from_pretrained(str(checkpoint),
                                                          dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    tokenizer = processor.tokenizer
    for answer in engine.answer(IMAGES[1], QUESTIONS[:2]):
        inputs = processor(images=IMAGES[1], text=f"USER: <image>\n{answer.question}\nASSISTANT:",
                           return_tensors="pt")
        for name, length in (("string_parse", 6), ("exact_match", 128)):
            with torch.no_grad():
                generated = model.generate(**inputs, max_new_tokens=length,
                                           do_sample=False)[0, inputs["input_ids"].shape[1]:]
            tokens = generated.tolist()
            eos = tokenizer.eos_token_id
            cut = tokens.index(eos) if eos in tokens else len(tokens)
            assert answer.texts[name] == tokenizer.decode(tokens[:cut],
                                                          skip_special_tokens=True), name
            assert answer.predictions[name] == READOUTS[name](None, None, None, answer.texts[name])
        assert answer.decoded == answer.texts["exact_match"]
        # the built-in word-level tokenizer spells none of these ids: both ''
        if SHARED_LLAVA_TOKENIZER.is_dir():
            assert answer.texts["exact_match"] != answer.texts["string_parse"]


@pytest.mark.slow
def test_decisions_follow_the_logits(checkpoint):
    engine = Engine.load(checkpoint, Settings(max_new_tokens=6), readouts="all")
    for answer in engine.answer(IMAGES[0], QUESTIONS):
        sets = engine.readout.token_sets["template_aware"]
        best_yes = max(answer.candidate_logits[i] for i in sets.yes_ids)
        best_no = max(answer.candidate_logits[i] for i in sets.no_ids)
        assert answer.predictions["template_aware"] == ("yes" if best_yes > best_no else "no")
        logits = answer.candidate_logits
        assert answer.predictions["legacy_2tok"] == ("yes" if logits[3582] > logits[1217] else "no")


class _Shift(Intervention):
    """Adds a constant to the yes candidates: a stand-in for a logit-level mitigation."""

    def __init__(self, yes_ids, amount):
        self.yes_ids, self.amount, self.layers = set(yes_ids), amount, []

    def hidden(self, layer, hidden, part):
        self.layers.append((layer, part, tuple(hidden.shape)))
        return None

    def logits(self, logits, ids):
        bump = torch.tensor([self.amount if i in self.yes_ids else 0.0 for i in ids])
        return logits + bump


@pytest.mark.slow
def test_warmup_leaves_no_trace(checkpoint, tmp_path):
    """Warmup runs the model but caches, counts and times nothing, and changes no answer."""
    warm = Engine.load(checkpoint, Settings(image_batch=2, batch_size=4, max_new_tokens=6),
                       readouts="all", cache_dir=tmp_path / "cache")
    warm.warmup()
    assert warm.cache.misses == warm.cache.hits == 0 and not list((tmp_path / "cache").glob("*"))
    assert all(v == 0 for v in warm.timings.to_json().values())
    assert warm.counts == type(warm.counts)()
    cold = Engine.load(checkpoint, Settings(image_batch=2, batch_size=4, max_new_tokens=6),
                       readouts="all")
    assert warm.answer(IMAGES[0], QUESTIONS) == cold.answer(IMAGES[0], QUESTIONS)


@pytest.mark.slow
def test_a_capped_warmup_decodes_a_few_tokens_and_the_run_its_own(checkpoint):
    """eval's warm-up (decode_tokens) stops each continuation early; the engine's plan is whole
    again after it."""
    engine = Engine.load(checkpoint, Settings(batch_size=4, max_new_tokens=12),
                         readouts="string_parse")
    runners = []
    reset = engine.reset
    engine.reset = lambda *args, **kwargs: (runners.append(engine.runner), reset(*args, **kwargs))
    engine.warmup(images=1, prompts=1, decode_tokens=2)
    engine.warmup(images=1, prompts=1)
    capped, whole = (r.counts.decode_steps for r in runners)
    assert 0 < capped <= 2 < whole
    assert engine.runner.readout is engine.readout and engine.readout.new_tokens == 12


@pytest.mark.slow
def test_intervention_hook(checkpoint):
    engine = Engine.load(checkpoint, Settings(batch_size=8), readouts="template_aware")
    plain = engine.answer(IMAGES[1], QUESTIONS)
    shift = _Shift(engine.readout.token_sets["template_aware"].yes_ids, 100.0)
    shifted = engine.answer(IMAGES[1], QUESTIONS, intervention=shift)
    assert all(a.predictions["template_aware"] == "yes" for a in shifted)
    for a, b in zip(plain, shifted):
        for i in engine.readout.token_sets["template_aware"].yes_ids:
            assert b.candidate_logits[i] == pytest.approx(a.candidate_logits[i] + 100.0, abs=1e-4)
    # prefix hooks run once per image for layers 0..L-2; suffix hooks once per batch for every layer
    assert [(l, p) for l, p, _ in shift.layers] == [(0, "prefix"), (0, "suffix"), (1, "suffix")]
    assert shift.layers[1][2][0] == len(QUESTIONS)


@pytest.mark.slow
def test_pad_aspect_pads_with_the_mean_colour(checkpoint):
    from PIL import Image

    wide = IMAGES[2]
    engine = Engine.load(checkpoint, Settings(image_aspect="pad"), readouts="template_aware")
    side = max(wide.size)
    mean = (122, 116, 104)  # original LLaVA: tuple(int(x * 255) for x in CLIP's image_mean)
    square = Image.new("RGB", (side, side), mean)
    square.paste(wide, ((side - wide.width) // 2, (side - wide.height) // 2))
    plain = Engine.load(checkpoint, Settings(), readouts="template_aware")
    padded = engine.answer(wide, QUESTIONS[:2])
    manual = plain.answer(square, QUESTIONS[:2])
    unpadded = plain.answer(wide, QUESTIONS[:2])
    assert [a.candidate_logits for a in padded] == [a.candidate_logits for a in manual]
    assert [a.candidate_logits for a in padded] != [a.candidate_logits for a in unpadded]


@pytest.mark.slow
def test_fast_pixels_travel_as_uint8_and_encode_as_the_processors_floats(checkpoint):
    """The fast path hands encode_images uint8 codes (a quarter of the bytes to copy), normalized on
    the device into the processor's float32s: the same features, bit for bit."""
    model = Engine.load(checkpoint, Settings(), readouts="legacy_8tok").model
    coded = model.preprocess(IMAGES[0])
    floats = model._processor_pixels(IMAGES[0])
    assert coded.codes.dtype == np.uint8 and coded.codes.nbytes * 4 == floats.nbytes
    assert np.array_equal(np.asarray(coded), floats)
    assert torch.equal(model.encode_images([coded])[0], model.encode_images([floats])[0])


def _records(out):
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["split"], r["question_id"]))


@pytest.mark.slow
def test_sweep_dedups_across_splits_and_writes_everything(checkpoint, tmp_path):
    images, files = write_pope_set(tmp_path / "pope")
    questions = [q for f in files for q in load_questions(f)]
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware,legacy_2tok")
    result = run_plain(engine, questions, images, tmp_path / "out")
    unique = {(q.image, q.text) for q in questions}
    assert result.evaluated_prompts == len(unique) < len(questions)
    records = _records(tmp_path / "out")
    assert len(records) == len(questions)
    by_prompt = {}
    for r, q in zip(records, sorted(questions, key=lambda q: (q.split, q.question_id))):
        by_prompt.setdefault((q.image, q.text), []).append(r["candidate_logits"])
    assert all(all(c == group[0] for c in group) for group in by_prompt.values())
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    # and pooled
    assert {r["split"] for r in summary["runs"]} == {"random", "adversarial", "Overall"}
    assert (tmp_path / "out/summary.md").read_text().startswith("### ")
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    assert meta["token_sets"]["template_aware"] \
        == engine.readout.token_sets["template_aware"].to_json()
    assert "transformers" in meta["tokenizer"]["library_versions"]


@pytest.mark.slow
def test_interrupted_sweep_resumes_to_the_same_records(checkpoint, tmp_path):
    images, files = write_pope_set(tmp_path / "pope")
    questions = [q for f in files for q in load_questions(f)]
    engine = Engine.load(checkpoint, Settings(image_batch=1),
                         readouts="template_aware,string_parse")
    run_plain(engine, questions, images, tmp_path / "whole")

    class Stop(Exception):
        pass

    calls = []

    def stop_after_first_image(n):
        calls.append(n)
        # the first call says 0 recorded before: the sweep starts; the next, one image's
        if sum(calls):
            raise Stop

    with pytest.raises(Stop):
        run_plain(engine, questions, images, tmp_path / "cut", progress=stop_after_first_image)
    partial = _records(tmp_path / "cut")
    assert 0 < len(partial) < len(questions)
    seen = []
    result = run_plain(engine, questions, images, tmp_path / "cut", progress=seen.append)
    assert result.recorded_before == len(partial) and seen[0] == len(partial) \
        and sum(seen) == len(questions)
    assert _records(tmp_path / "cut") == _records(tmp_path / "whole")


@pytest.mark.slow
def test_same_file_name_different_images_never_share_features(checkpoint, tmp_path):
    for k, folder in enumerate(("a", "b")):
        (tmp_path / folder).mkdir()
        synthetic_image(10 + k, (90, 70)).save(tmp_path / folder / "COCO_val2014_000000000001.jpg")
    q = tmp_path / "q.json"
    q.write_text(json.dumps({"question_id": 1, "image": "COCO_val2014_000000000001.jpg",
                             "text": QUESTIONS[0], "label": "yes"}) + "\n")
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware",
                         cache_dir=tmp_path / "cache")
    questions = load_questions(q, "random")
    run_plain(engine, questions, tmp_path / "a", tmp_path / "out_a")
    run_plain(engine, questions, tmp_path / "b", tmp_path / "out_b")
    assert engine.cache.misses == 2
    assert _records(tmp_path / "out_a")[0]["candidate_logits"] \
        != _records(tmp_path / "out_b")[0]["candidate_logits"]


@pytest.mark.slow
def test_disk_cache_is_reused_with_identical_records(checkpoint, tmp_path):
    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    questions = load_questions(files[0])
    first = Engine.load(checkpoint, Settings(max_new_tokens=6), readouts="all",
                        cache_dir=tmp_path / "cache")
    run_plain(first, questions, images, tmp_path / "one")
    assert first.cache.misses == 2 and len(list((tmp_path / "cache").glob("*.safetensors"))) == 2
    second = Engine.load(checkpoint, Settings(max_new_tokens=6), readouts="all",
                         cache_dir=tmp_path / "cache")
    run_plain(second, questions, images, tmp_path / "two")
    assert second.cache.misses == 0 and second.cache.disk_hits == 2
    assert second.timings.image_encode == 0.0
    assert _records(tmp_path / "one") == _records(tmp_path / "two")
    # another dtype is another model: its features are not served from this cache
    bf16 = Engine.load(checkpoint, Settings(dtype="bf16", max_new_tokens=6), readouts="all",
                       cache_dir=tmp_path / "cache")
    bf16.features(images / "img_0.png")
    assert bf16.cache.misses == 1


@pytest.mark.slow
def test_eval_cli_end_to_end(checkpoint, tmp_path):
    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    args = eval_args(checkpoint, images, files, tmp_path / "out", "--readouts",
                     "template_aware,legacy_8tok,pope_official", "--max-new-tokens", "6")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "unique prompts evaluated" in result.output and "template_aware" in result.output
    score = CliRunner().invoke(main, ["score", str(tmp_path / "out"), "--format", "json"])
    runs = json.loads(score.output)["runs"]
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert summary["runs"][0]["readouts"]["template_aware"] == runs[0]["readouts"]["template_aware"]
    again = CliRunner().invoke(main, args)   # everything recorded: resumes and evaluates nothing
    assert again.exit_code == 0 and "0 unique prompts evaluated" in again.output


@pytest.mark.slow
def test_two_datasets_in_one_run_and_an_old_folder_resumes(checkpoint, tmp_path):
    """COCO and GQA files reuse split names and question ids: one run keeps both (a question folder
    given once). A folder begun before records named their dataset resumes to nothing, unchanged."""
    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    both = tmp_path / "both"
    both.mkdir()
    for dataset in ("coco", "gqa"):
        for f in files:
            shutil.copy(f, both / f.name.replace("tiny", dataset))
    args = ["eval", "--model", str(checkpoint), "--images", str(images), "--questions", str(both),
            "--out", str(tmp_path / "out"), "--device", "cpu", "--readouts", "template_aware"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    records = _records(tmp_path / "out")
    questions = [q for f in files for q in load_questions(f)]
    assert len(records) == 2 * len(questions) and {r["dataset"] for r in records} == {"coco", "gqa"}
    unique = len({(q.image, q.text) for q in questions})   # asked by both datasets, evaluated once
    assert f"{unique} unique prompts evaluated for {2 * len(questions)} questions" in result.output
    runs = json.loads((tmp_path / "out/summary.json").read_text())["runs"]
    assert sorted((r["dataset"], r["split"]) for r in runs) == [
        ("coco", "Overall"), ("coco", "adversarial"), ("coco", "random"), ("gqa", "Overall"),
        ("gqa", "adversarial"), ("gqa", "random")]

    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    old = [q for f in files for q in load_questions(f, dataset="")]
    run_plain(engine, old, images, tmp_path / "old")
    before = (tmp_path / "old/records.jsonl").read_text()
    assert '"dataset"' not in before
    again = run_plain(engine, [q for f in files for q in load_questions(f, dataset="coco")], images,
                      tmp_path / "old")
    assert again.evaluated_prompts == 0 and (tmp_path / "old/records.jsonl").read_text() == before


@pytest.mark.slow
def test_missing_and_broken_images_stop_before_compute_or_become_error_records(checkpoint,
                                                                               tmp_path):
    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    (images / "img_1.png").unlink()
    (images / "img_2.png").write_bytes(b"not a png")
    questions = load_questions(files[0])
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    from pope_fast.engine import ImageError

    with pytest.raises(ImageError,
                       match=r"img_1\.png: image file not found.*"
                             r"img_2\.png: not a decodable image"):
        run_plain(engine, questions, images, tmp_path / "out")
    assert engine.cache.misses == 0          # nothing was computed
    result = run_plain(engine, questions, images, tmp_path / "out", skip_bad=True)
    records = _records(tmp_path / "out")
    assert len(records) == len(questions) and result.error_records == 8
    assert {r["image"] for r in records if "error" in r} == {"img_1.png", "img_2.png"}


def _corrupt_png_data(path):
    """Flip bytes inside the first IDAT chunk's compressed data and fix its CRC: every chunk still
    checks out, the decoder fails."""
    import struct
    import zlib

    data = bytearray(path.read_bytes())
    at = data.index(b"IDAT")
    length = struct.unpack(">I", data[at - 4:at])[0]
    for i in range(at + 4 + length // 2, at + 4 + length // 2 + 8):
        data[i] ^= 0xFF
    data[at + 4 + length:at + 8 + length] = struct.pack(">I",
                                                        zlib.crc32(bytes(data[at:at + 4 + length])))
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_an_image_that_fails_only_in_the_decoder(checkpoint, tmp_path):
    from pope_fast.engine import ImageError
    from pope_fast.engine.inputs.images import check_images

    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    _corrupt_png_data(images / "img_1.png")
    assert check_images(images, ["img_1.png"]) == {}   # passes the up-front check
    questions = load_questions(files[0])
    engine = Engine.load(checkpoint, Settings(image_batch=1), readouts="template_aware")
    with pytest.raises(ImageError, match=r"img_1\.png: not a decodable image"):
        run_plain(engine, questions, images, tmp_path / "out")
    # written before the stop, kept
    assert {r["image"] for r in _records(tmp_path / "out")} == {"img_0.png"}
    result = run_plain(engine, questions, images, tmp_path / "out", skip_bad=True)
    records = _records(tmp_path / "out")
    assert len(records) == len(questions) and result.error_records == 4
    assert {r["image"] for r in records if "error" in r} == {"img_1.png"}


def _copy(checkpoint, tmp_path):
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint, target)
    return target


def _edit_tensors(folder, edit):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.slow  # the registry's tiny checkpoint, written through the transformers class
@pytest.mark.parametrize("breakage, message", [
    ("no-folder", r"no such checkpoint folder"),
    ("no-config", r"config\.json: missing"),
    ("model-type",
     rf"model_type 'mllama' is not supported \(MllamaForConditionalGeneration\): "
     rf"the engine does not implement cross-attention layers .* "
     rf"\(supported: {', '.join(FAMILIES)}\); --backend transformers runs it"),
    ("unknown-model-type",
     rf"model_type 'not_a_vlm' is not supported \(supported: {', '.join(FAMILIES)}\), and "
     "transformers has no image-text-to-text class for it"),
    ("missing-tensor", r"missing tensors: lm\.layers\.1\.mlp\.up_proj\.weight"),
    ("unexpected-tensor", r"unexpected tensors: language_model\.model\.layers\.9\.extra\.weight"),
    ("bad-shape", r"tensor multi_modal_projector\.linear_2\.weight has shape \(64, 32\)"),
    ("no-image-token", r"the tokenizer has no <image> token"),
    ("template", r"template mplug_owl2 marks the image with '<\|image\|>'"),
])
def test_bad_checkpoints_are_named(checkpoint, tmp_path, breakage, message):
    folder = _copy(checkpoint, tmp_path)
    template, extra = None, []
    if breakage == "no-folder":
        folder = tmp_path / "nowhere"
    elif breakage == "no-config":
        (folder / "config.json").unlink()
    # mllama: forced onto the engine, which lacks it
    elif breakage in ("model-type", "unknown-model-type"):
        cfg = json.loads((folder / "config.json").read_text())
        known = breakage == "model-type"
        model_type = "mllama" if known else "not_a_vlm"
        (folder / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
        extra = ["--backend", "engine"] if known else []
    elif breakage == "missing-tensor":
        _edit_tensors(folder, lambda t: t.pop("language_model.model.layers.1.mlp.up_proj.weight"))
    elif breakage == "unexpected-tensor":
        extra_weight = "language_model.model.layers.9.extra.weight"
        _edit_tensors(folder, lambda t: t.update({extra_weight: torch.ones(2)}))
    elif breakage == "bad-shape":
        projector = "multi_modal_projector.linear_2.weight"
        _edit_tensors(folder, lambda t: t.update({projector: torch.ones(64, 32)}))
    elif breakage == "no-image-token":
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "image_token_index": 5}))
    elif breakage == "template":
        template = "mplug_owl2"
    result = CliRunner().invoke(main, ["eval", "--model", str(folder), "--questions",
                                       str(_question_file(tmp_path)), "--images", str(tmp_path),
                                       "--out", str(tmp_path / "out"), "--device", "cpu"]
                                + (["--template", template] if template else []) + extra)
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    import re

    assert re.search(message, result.output), result.output


def _question_file(tmp_path):
    path = tmp_path / "questions_random.json"
    path.write_text(json.dumps({"question_id": 1, "image": "x.png", "text": QUESTIONS[0],
                                "label": "yes"}) + "\n")
    return path


@pytest.mark.slow  # the registry's tiny checkpoint, written through the transformers class
def test_bad_question_file_is_named(checkpoint, tmp_path):
    path = tmp_path / "q_random.json"
    path.write_text('{"question_id": 1, "image": "x.png", "text": "q", "label": "yes"}\n'
                    '{"question_id": 1, "image"\n')
    result = CliRunner().invoke(main, ["eval", "--model", str(checkpoint), "--questions", str(path),
                                       "--images", str(tmp_path), "--out", str(tmp_path / "out"),
                                       "--device", "cpu"])
    assert result.exit_code != 0 and "q_random.json:2: malformed JSON" in result.output


@pytest.mark.slow
def test_eval_cli_on_an_unseen_checkpoint_agrees_with_transformers(tmp_path):
    """The issue's acceptance check: a fresh checkpoint through `pope-fast eval`, every record
    against transformers: candidate logits within 1e-4 and the same decision under every readout."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from pope_fast.readout.readouts import FIRST_TOKEN, LOGIT, SEQUENCE, TokenSets

    checkpoint = make_tiny_llava(tmp_path / "unseen", seed=11, layers=3, kv_heads=4, image_size=56)
    images, files = write_pope_set(tmp_path / "pope", n_images=3)
    result = CliRunner().invoke(main, eval_args(checkpoint, images, files, tmp_path / "out",
                                                "--batch-size", "5", "--max-new-tokens", "4"))
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    sets = {n: TokenSets.from_json(s) for n, s in meta["token_sets"].items()}
    model = LlavaForConditionalGeneration.from_pretrained(str(checkpoint),
                                                          dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    from PIL import Image

    texts = {(q.split, q.question_id): q.text for f in files for q in load_questions(f)}
    records = _records(tmp_path / "out")
    assert len(records) == len(texts) == 24 and set(records[0]["predictions"]) == set(READOUTS)
    for r in records:
        text = texts[r["split"], r["question_id"]]
        inputs = processor(images=Image.open(images / r["image"]),
                           text=f"USER: <image>\n{text}\nASSISTANT:",
                           return_tensors="pt")
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
            sequence = model.generate(**inputs, max_new_tokens=4, do_sample=False)[0]
        ours = {int(i): v for i, v in r["candidate_logits"].items()}
        assert max(abs(v - float(logits[i])) for i, v in ours.items()) <= 1e-4
        tokens = sequence[inputs["input_ids"].shape[1]:].tolist()
        eos = processor.tokenizer.eos_token_id
        cut = tokens.index(eos) if eos in tokens else len(tokens)
        decoded = processor.tokenizer.decode(tokens[:cut], skip_special_tokens=True)
        # string_parse_with_prompt: generate's whole output decoded, as the paper's InstructBLIP
        # adapter did
        whole = processor.tokenizer.decode(sequence[:inputs["input_ids"].shape[1] + cut],
                                           skip_special_tokens=True)
        assert r["decoded_sequence"] == whole
        theirs = {i: float(logits[i]) for i in ours}
        for name, readout in READOUTS.items():
            text = whole if readout.kind == SEQUENCE else decoded
            expected = readout(sets.get(name), theirs, int(logits.argmax()), text) \
                if readout.kind in (LOGIT, FIRST_TOKEN) else readout(None, None, None, text)
            assert r["predictions"][name] == expected, (name, r["question_id"], r["split"])


@pytest.mark.slow
def test_a_restored_image_is_retried_on_resume(checkpoint, tmp_path):
    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    questions = load_questions(files[0])
    kept = (images / "img_1.png").read_bytes()
    (images / "img_1.png").unlink()
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    first = run_plain(engine, questions, images, tmp_path / "out", skip_bad=True)
    assert first.error_records == 4
    (images / "img_1.png").write_bytes(kept)
    second = run_plain(engine, questions, images, tmp_path / "out")
    # the retried image's step runs whole, as a clean run of both images runs it: img_0's prompts
    # again (recorded already, not rewritten) beside img_1's, so the new records are a clean run's
    # bit for bit
    step = {(q.image, q.text) for q in questions}
    assert second.evaluated_prompts == len(step) and second.recorded_before == 4 \
        and second.error_records == 0
    assert all(run["errors"] == 0 for run in second.runs) \
        and sum(run["n"] for run in second.runs) == 8
    run_plain(engine, questions, images, tmp_path / "clean")
    assert (tmp_path / "out/records.jsonl").read_bytes() \
        == (tmp_path / "clean/records.jsonl").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("change, message", [
    ("settings",
     r"meta\.json: this folder holds records of a different run "
     r"\(settings\.image_aspect: 'processor' recorded, 'pad' now\)"),
    ("questions",
     r"question 1 of split random was recorded with image 'img_0\.png', but the question file has "
     r"'img_1\.png'"),
])
def test_resume_refuses_another_run(checkpoint, tmp_path, change, message):
    images, files = write_pope_set(tmp_path / "pope", n_images=2)
    questions = load_questions(files[0])
    run_plain(Engine.load(checkpoint, Settings(), readouts="template_aware"), questions[:4], images,
              tmp_path / "out")
    settings, again = Settings(), questions
    if change == "settings":
        settings = Settings(image_aspect="pad", batch_size=3)   # batch sizes alone would not matter
    else:
        again = [type(q)(q.question_id, "img_1.png", q.text, q.label, q.split) for q in questions]
    with pytest.raises(ValueError, match=message):
        run_plain(Engine.load(checkpoint, settings, readouts="template_aware"), again, images,
                  tmp_path / "out")
    run_plain(Engine.load(checkpoint, Settings(batch_size=3, image_batch=1),
                          readouts="template_aware"),
             questions, images, tmp_path / "out")   # another batching resumes fine


@pytest.mark.slow
def test_min_new_tokens_takes_the_best_token_that_is_no_stop_id(checkpoint, tmp_path):
    """Settings.min_new_tokens 1 (VLMEvalKit's mPLUG-Owl2 generate) against
    generate(min_new_tokens=1): a checkpoint whose eos is the first greedy token answers empty by
    default, and with the setting continues from the best other token exactly as generate does; the
    answer position's argmax stays the eos."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    folder = shutil.copytree(checkpoint, tmp_path / "ckpt")
    model = LlavaForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(folder))
    inputs = processor(images=IMAGES[1], text=f"USER: <image>\n{QUESTIONS[0]}\nASSISTANT:",
                       return_tensors="pt")
    with torch.no_grad():
        eos = int(model(**inputs).logits[0, -1].argmax())
        generated = model.generate(**inputs, max_new_tokens=5, do_sample=False, min_new_tokens=1,
                                   eos_token_id=eos)[0, inputs["input_ids"].shape[1]:].tolist()
    assert generated[0] != eos
    config = json.loads((folder / "generation_config.json").read_text()) \
        if (folder / "generation_config.json").is_file() else {}
    (folder / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    cut = generated.index(eos) if eos in generated else len(generated)
    decoded = processor.tokenizer.decode(generated[:cut], skip_special_tokens=True)
    for at_least, text in ((0, ""), (1, decoded)):
        settings = Settings(batch_size=2, max_new_tokens=5, min_new_tokens=at_least)
        engine = Engine.load(folder, settings, readouts="string_parse")
        answer = engine.answer(IMAGES[1], QUESTIONS[:2])[0]
        assert answer.first_token_id == eos
        assert answer.decoded == text
