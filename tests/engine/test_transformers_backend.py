"""The transformers backend (engine/transformers_engine.py) on one tiny checkpoint of each kind the
engine has no family for: cross-attention (mllama), prefix-LM (paligemma), image splitting
(idefics3), a Q-Former (BLIP-2), and MoE (qwen3_vl_moe, which the engine has, forced onto the
backend). The oracle is the class itself, loaded here, one prompt at a time with its own processor:
the backend's batched, left-padded records must equal its logits (within fp32's bound), its argmax
and its `generate`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tinymodels import QUESTIONS, qwen_inputs, synthetic_image

from pope_fast.engine import CheckpointError, Engine, Settings, load_engine, parse_method
from pope_fast.engine.methods import diffusion_noise, noise_generator
from pope_fast.engine.transformers_model import TransformersInputs
from pope_fast.readout.protocols.base import NOT_READ
from pope_fast.engine.transformers_engine import TransformersEngine
from pope_fast.engine.synthetic import Weights, write_checkpoint
from pope_fast.readout.protocols import get_template

# fp32: four steps at the logits' scale (pope_fast.verify.BOUND); padding changes only the rounding
BOUND = 1e-4
KINDS = ["mllama", "paligemma", "idefics3", "blip2"]
IMAGES = [synthetic_image(5, (90, 60)), synthetic_image(6, (50, 110))]
# three an image of two lengths (dog; dining table, traffic light), in batches of four: a batch
# crosses images and pads its shorter prompts
ASKED = [QUESTIONS[0], QUESTIONS[3], QUESTIONS[5]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backend")
    # weights wide enough that the candidate logits differ by more than rounding (decisions that
    # mean something)
    made = {kind: write_checkpoint(kind, root / kind,
                                   weights=Weights(init="model", dtype=torch.float32, std=0.2))
            for kind in KINDS}
    return {**made, "qwen3_vl_moe": tiny.checkpoint("qwen3_vl_moe")}


def _oracle(folder: Path):
    """The class and a function (image, prompt) -> its inputs, as a user of transformers makes
    them."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    if json.loads((folder / "config.json").read_text())["model_type"] == "qwen3_vl_moe":
        return model, lambda image, prompt: qwen_inputs(folder, image, prompt)
    processor = AutoProcessor.from_pretrained(str(folder))
    # a prompt the chat template rendered holds its BOS already (Llama 3's): tokenized without added
    # special tokens, as transformers' model cards and lmms-eval do
    specials = {"add_special_tokens": False} if processor.chat_template else {}
    return model, lambda image, prompt: processor(images=image, text=prompt, return_tensors="pt",
                                                  **specials)


def _answers(engine) -> list[list]:
    """Per image, per question of ASKED, the PromptResult: every image's prompts in one call, as a
    sweep's step."""
    return engine.run_methods(engine.prepare(IMAGES), [ASKED] * len(IMAGES),
                              [parse_method("none")])["none"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", [*KINDS, "qwen3_vl_moe"])
def test_records_equal_the_class_and_its_generate(kind, checkpoints):
    folder = checkpoints[kind]
    engine = load_engine(folder, Settings(batch_size=4, max_new_tokens=4), backend="transformers",
                         readouts="all")
    assert isinstance(engine, TransformersEngine) and \
        engine.meta()["model"]["backend"] == "transformers"
    answers = _answers(engine)
    model, inputs_of = _oracle(folder)
    stops = engine.model.stop_ids
    lengths = set()
    for image, row in zip(IMAGES, answers):
        for question, answer in zip(ASKED, row):
            inputs = {k: v for k, v in inputs_of(image, engine.prompt(question)).items()
                      if k != "labels"}
            lengths.add(inputs["input_ids"].shape[1])
            with torch.inference_mode():
                logits = model(**inputs).logits[0, -1]
                new = model.generate(**inputs, max_new_tokens=4,
                                     do_sample=False)[0, inputs["input_ids"].shape[1]:]
            ids = sorted(answer.candidate_logits)
            scale = max(1.0, float(logits[ids].abs().max()))
            worst = max(abs(answer.candidate_logits[i] - float(logits[i])) for i in ids)
            assert worst <= BOUND * scale, (kind, question, worst)
            assert answer.first_token_id == int(logits.argmax())
            tokens = new.tolist()
            stop = next((k for k, t in enumerate(tokens) if t in stops), len(tokens))
            assert answer.decoded == engine.model.tokenizer.decode(tokens[:stop],
                                                                   skip_special_tokens=True)
    assert len(lengths) >= 2  # the batches padded


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mllama"])
def test_the_prompt_is_the_checkpoints_own_chat_template(kind, checkpoints):
    """A model without a family is asked through its own chat template, as its processor renders a
    message."""
    from transformers import AutoProcessor

    engine = load_engine(checkpoints[kind], Settings(), readouts="dynamic_single")
    assert engine.template.name == "reference_chat"
    message = [{"role": "user",
                "content": [{"type": "image"},
                            {"type": "text", "text": ASKED[0] + " Answer yes or no only."}]}]
    own = AutoProcessor.from_pretrained(str(checkpoints[kind])).apply_chat_template(
        message, add_generation_prompt=True)
    assert engine.prompt(ASKED[0]) == own


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_auto_runs_a_model_without_a_family_on_transformers_and_engine_refuses_it(checkpoints,
                                                                                 tiny):
    assert load_engine(checkpoints["blip2"], Settings(),
                       readouts="dynamic_single").model.backend == "transformers"
    assert load_engine(tiny.checkpoint("llava"), Settings(),
                       readouts="dynamic_single").model.backend == "engine"
    with pytest.raises(CheckpointError,
                       match=r"config.json: model_type 'blip-2' is not supported.*--backend "
                             "transformers"):
        load_engine(checkpoints["blip2"], Settings(), backend="engine")


# llava-interleave's kind, as models.misfit says it
INTERLEAVE = ("model_type 'llava' with text_config 'qwen2' and vision_config "
              "'siglip_vision_model': the engine's LLaVA-1.5 implements text_config 'llama' and "
              "vision_config 'clip_vision_model'")


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_a_llava_of_qwen2_and_siglip_is_asked_its_own_chat_template_on_the_backend(tmp_path):
    """llava-interleave's kind: a llava checkpoint of a Qwen2 language model and a SigLIP tower is
    no LLaVA-1.5. The default backend runs it as a model without a family (its own chat template and
    processor, not LLaVA-1.5's Vicuna prompt; --template reference_chat taken), saying why; the
    engine refuses it in one line naming what it holds."""
    from transformers import AutoProcessor

    from pope_fast.coverage import protocol_coverage
    from pope_fast.engine.synthetic.llava import write_interleave_checkpoint

    folder = write_interleave_checkpoint(tmp_path / "interleave").resolve()
    engine = load_engine(folder, Settings(), readouts="dynamic_single")
    assert isinstance(engine, TransformersEngine) and engine.model.misfit == INTERLEAVE
    assert (engine.model.name, engine.template.name) == ("llava (transformers)", "reference_chat")
    message = [{"role": "user",
                "content": [{"type": "image"},
                            {"type": "text", "text": ASKED[0] + " Answer yes or no only."}]}]
    own = AutoProcessor.from_pretrained(str(folder)).apply_chat_template(
        message, add_generation_prompt=True)
    assert engine.prompt(ASKED[0]) == own == \
        f"USER: <image>\n{ASKED[0]} Answer yes or no only. ASSISTANT:"
    named = load_engine(folder, Settings(), backend="transformers", template="reference_chat",
                        readouts="yorn")
    assert named.prompt(ASKED[0]) == own
    # no tool's LLaVA-1.5 entry (its Vicuna prompt) is taken for it: the protocols without a model
    # class run its own
    covered = protocol_coverage(folder)
    assert covered["paper"]["template"] == covered["pope-official"]["template"] == "reference_chat"
    assert covered["lmms-eval"] == {
        "not_covered": f"protocol lmms-eval does not cover llava (transformers): {NOT_READ}"}
    refusal = f"{folder}/config.json: {INTERLEAVE}; --backend transformers runs it through " \
        "transformers' own class"
    for load in (lambda: load_engine(folder, Settings(), backend="engine"),
                 lambda: Engine.load(folder, Settings())):
        with pytest.raises(CheckpointError) as err:
            load()
        assert str(err.value) == refusal


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_a_checkpoint_without_a_chat_template_whose_processor_needs_one_is_refused_naming_it(
        checkpoints, tmp_path):
    """Idefics3's processor looks for the image's `<image>` in the text, which only its chat
    template writes: without one the question alone gives it no place for the image, and the load
    says so (not the processor's count of image tokens at the run's first image). BLIP-2's processor
    places the image itself: the question alone runs. (The Idefics3 holds a Mistral language model,
    which no family of the engine implements: the backend runs it as a model without a family, with
    its own processor.)"""
    folder = shutil.copytree(checkpoints["idefics3"], tmp_path / "idefics3")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["model_type"] = "mistral"  # LLaMA's tensor names: the same weights load
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink()
    for name in ("tokenizer_config.json", "processor_config.json"):
        config = json.loads((folder / name).read_text())
        config.pop("chat_template", None)
        (folder / name).write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_engine(folder, Settings(), readouts="dynamic_single")
    assert str(err.value) == (
        f"{folder}: Idefics3Processor finds no place for the image in template reference_plain's "
        "prompt (The total number of <image> tokens in the prompts should be the same as the "
        "number of images passed.); the checkpoint has no chat template (tokenizer_config.json's "
        "chat_template, chat_template.json or chat_template.jinja) to render the prompt with")
    assert load_engine(checkpoints["blip2"], Settings(),
                       readouts="dynamic_single").template.name == "reference_plain"


# no model, but transformers' processing modules imported: seconds, where no other test did
@pytest.mark.slow
@pytest.mark.parametrize("torchvision", [False, True])
def test_a_processor_with_a_video_half_is_not_tried_without_torchvision(torchvision, monkeypatch,
                                                                        tmp_path):
    """Qwen2-VL's, InternVL's and OneVision's reference processors (base.processor_with_video):
    without torchvision transformers' AutoProcessor is not called (it would load the tokenizer, then
    fail on the video half), and their stand-ins run; with it, what it builds is the processor, and
    a failure a stand-in's cue."""
    import transformers

    from pope_fast.engine.models import base

    calls = []

    def builds(folder):
        calls.append(folder)
        if folder.endswith("bad"):
            raise OSError("no processor_config.json")
        return "processor"

    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: torchvision)
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", builds)
    assert base.processor_with_video(tmp_path) == ("processor" if torchvision else None)
    assert base.processor_with_video(tmp_path / "bad") is None
    assert calls == ([str(tmp_path), str(tmp_path / "bad")] if torchvision else [])


@pytest.mark.parametrize("raised, reason", [
    # its image half is tried next (engine/image_processor.py), and says why it does not load either
    ("torchvision", "Qwen2VLVideoProcessor requires the Torchvision library but it was not found "
                    "in your environment; missing package: torchvision; nor without its video "
                    "processor: Unrecognized model in {folder}."),
    (ModuleNotFoundError("No module named 'decord'", name="decord"),
     "No module named 'decord'; missing package: decord"),
    (ValueError("\n\nUnrecognized processing class in x.\nSee the docs."),
     "Unrecognized processing class in x."),
    # no text: its type names it
    (ImportError(""), "ImportError"), (ValueError("\n \n"), "ValueError")])
def test_a_processor_that_does_not_load_is_named_with_its_reason(raised, reason, monkeypatch,
                                                                 tmp_path):
    """transformers' import errors start with a newline (the newest families' processors import
    torchvision for their video half): the reason is the message's first line of text, and the
    package that is missing."""
    import transformers
    from transformers.utils.import_utils import TORCHVISION_IMPORT_ERROR

    def fails(*args, **kwargs):  # what requires_backends raises where torchvision is not installed
        raise ImportError(TORCHVISION_IMPORT_ERROR.format("Qwen2VLVideoProcessor")) \
            if raised == "torchvision" else raised

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", fails)
    with pytest.raises(CheckpointError) as err:
        TransformersInputs(tmp_path, Settings())
    assert str(err.value) == \
        f"{tmp_path}: transformers' processor does not load ({reason.format(folder=tmp_path)})"
@pytest.mark.slow  # the registry's tiny LLaVA's processor files, made with its weights
@pytest.mark.parametrize("family", ["llava", None], ids=["family-processor", "auto-processor"])
def test_a_cut_tokenizer_file_is_named_as_the_engine_names_it(family, tiny, tmp_path):
    """transformers' JSON error names no file; the backend names the one cut, as the engine's loader
    does."""
    import shutil

    from pope_fast.engine.models import family_class
    from pope_fast.engine.transformers_model import TransformersInputs

    # the processor's files; no weights are read
    for path in tiny.checkpoint("llava").glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    text = (tmp_path / "tokenizer.json").read_text()
    (tmp_path / "tokenizer.json").write_text(text[:len(text) // 3])
    with pytest.raises(json.JSONDecodeError) as cut:
        json.loads(text[:len(text) // 3])
    with pytest.raises(CheckpointError) as err:
        TransformersInputs(tmp_path, Settings(), family_class(family) if family else None)
    assert str(err.value) == \
        f"{tmp_path / 'tokenizer.json'}:{cut.value.lineno}: malformed JSON: {cut.value.msg}"


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
@pytest.mark.parametrize("settings, named", [(dict(max_length=64), "max_length"),
                                             (dict(generation_config="greedy_output"),
                                              "generation_config"),
                                             (dict(image_mask="causal"), "image_mask"),
                                             (dict(do_sample=True), "do_sample")])
def test_what_the_backend_cannot_compute_is_refused_in_one_line(settings, named, checkpoints):
    with pytest.raises(ValueError,
                       match=rf"^{named} .*the transformers backend cannot run it \(") as err:
        load_engine(checkpoints["blip2"], Settings(**settings), readouts="dynamic_single")
    assert "\n" not in str(err.value)


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_attention_edits_are_refused_and_vcd_noises_the_processors_pixels(checkpoints, tmp_path):
    """PAI edits attention: refused by name. VCD's noised pass is the class on the processor's
    pixel_values noised as the engine noises a family's (the image's key and the method's seed),
    combined as VCD combines."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = checkpoints["blip2"]
    engine = load_engine(folder, Settings(batch_size=4), readouts="dynamic_single")
    with pytest.raises(ValueError,
                       match="method pai: the transformers backend cannot edit attention"):
        engine.check_method(parse_method("pai"))
    with pytest.raises(ValueError, match=r"^method m3id: the transformers backend cannot run its "
                                         r"text-only pass \("):
        engine.check_method(parse_method("m3id"))
    with pytest.raises(ValueError, match=r"^method vista: the transformers backend cannot run its "
                                         r"text-only pass \("):
        # its steering vector's, then a steered pass
        engine.check_method(parse_method("vista:logits_layers=0-1"))
    with pytest.raises(ValueError, match="^method sid: the transformers backend cannot edit "
                                         "attention or MLP outputs"):
        # its drop acts inside the engine's attention
        engine.check_method(parse_method("sid:layer=1"))
    with pytest.raises(ValueError, match="^method clearsight: the transformers backend cannot edit "
                                         "attention or MLP"):
        engine.check_method(parse_method("clearsight:layers=0-0"))
    with pytest.raises(ValueError, match="^method avisc: the transformers backend cannot edit "
                                         "attention or MLP outputs"):
        # its attention record and token zeroing act inside the engine
        engine.check_method(parse_method("avisc"))
    from safetensors.torch import save_file

    save_file({"text": torch.ones(engine.model.lm.dims.num_layers, 8)},
              str(tmp_path / "vti.safetensors"))
    with pytest.raises(ValueError, match="method vti: the transformers backend cannot edit "
                                         "attention or MLP outputs"):
        engine.check_method(parse_method(f"vti:directions={tmp_path / 'vti.safetensors'}"))
    vcd = parse_method("vcd")
    prepared = engine.prepare(IMAGES[:1])
    got = engine.run_methods(prepared, [ASKED[:2]], [vcd])["vcd"][0]
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(folder))
    step, seed = vcd.settings["noise_step"], vcd.settings["seed"]
    for question, result in zip(ASKED[:2], got):
        inputs = processor(images=IMAGES[0], text=engine.prompt(question), return_tensors="pt")
        noised = dict(inputs, pixel_values=torch.from_numpy(diffusion_noise(
            inputs["pixel_values"].numpy(), step, noise_generator(prepared[0].key, seed))))
        with torch.inference_mode():
            plain, other = (model(**x).logits[0, -1] for x in (inputs, noised))
        combined = vcd.combine({"main": plain[None], "noised": other[None]})[0]
        ids = sorted(result.candidate_logits)
        assert np.allclose([result.candidate_logits[i] for i in ids], combined[ids].numpy(),
                           atol=1e-4, rtol=1e-4)
        assert not torch.allclose(plain[ids], other[ids], atol=1e-3)  # the noise reached the class


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_text_only_questions_run_where_the_class_takes_them(checkpoints):
    """Idefics3's class answers a prompt alone, as its processor makes it; BLIP-2's forward requires
    pixel_values and PaliGemma's processor an image, which the backend says in one line before
    anything runs."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = checkpoints["idefics3"]
    engine = load_engine(folder, Settings(), backend="transformers", readouts="dynamic_single")
    assert engine.text_only_refusal() is None
    [answer] = engine.answer(None, ASKED[:1])
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompt = engine.prompt(ASKED[0], image=False)
    assert "<image>" not in prompt
    inputs = AutoProcessor.from_pretrained(str(folder))(text=prompt, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**inputs).logits[0, -1]
    ids = sorted(answer.candidate_logits)
    assert np.allclose([answer.candidate_logits[i] for i in ids], logits[ids].numpy(), atol=1e-4)
    refusals = {kind: load_engine(checkpoints[kind], Settings(),
                                  readouts="dynamic_single").text_only_refusal()
                for kind in ("blip2", "paligemma")}
    assert refusals["blip2"].endswith("Blip2ForConditionalGeneration.forward requires pixel_values")
    assert "its processor takes no prompt without an image" in refusals["paligemma"]


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_lmms_eval_runs_llama_vision_as_its_class_does(checkpoints):
    """--protocol lmms-eval on Llama-3.2-Vision (models/simple/llama_vision.py l.174-189): the
    processor's chat template over [image, question + post_prompt], tokenized without added special
    tokens (one BOS, the template's); 128 new tokens, greedy under the checkpoint's generation
    config, its own dtype."""
    from transformers import AutoProcessor

    from pope_fast.coverage import protocol_for

    folder = checkpoints["mllama"]
    covered = protocol_for(folder, "lmms-eval")
    assert (covered.template, covered.new_tokens, covered.generation_config, covered.dtype,
            covered.image_reencode) == ("lmms_eval_llama_vision", 128, "greedy", "fp32", "rgb")
    engine = load_engine(folder, Settings(generation_config="greedy"),
                         template=get_template(covered.template), readouts="exact_match")
    processor = AutoProcessor.from_pretrained(str(folder))
    contexts = ASKED[0] + "\nAnswer the question using a single word or phrase."
    prompt = processor.apply_chat_template([{"role": "user",
                                             "content": [{"type": "image"},
                                                         {"type": "text", "text": contexts}]}],
                                           add_generation_prompt=True)
    assert engine.prompt(ASKED[0]) == prompt
    theirs = processor(IMAGES[:1], prompt, add_special_tokens=False,
                       return_tensors="pt")["input_ids"]
    assert torch.equal(engine.model.inputs(IMAGES[:1], [prompt])["input_ids"], theirs)
    assert int((theirs == processor.tokenizer.bos_token_id).sum()) == 1


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_vlmevalkit_runs_smolvlm_as_its_class_does(checkpoints):
    """--protocol vlmevalkit on an Idefics3 checkpoint (vlm/smolvlm.py SmolVLM, build_prompt_default
    l.103-119): its own prompt string, tokenized as its processor call tokenizes it (l.91-93), fp32,
    load_image, 2048 tokens."""
    from transformers import AutoProcessor

    from pope_fast.coverage import protocol_coverage, protocol_for

    folder = checkpoints["idefics3"]
    covered = protocol_for(folder, "vlmevalkit")
    assert (covered.template, covered.new_tokens, covered.dtype, covered.image_reencode,
            covered.generation_config) == ("vlmevalkit_smolvlm", 2048, "fp32", "load_image",
                                           "greedy")
    engine = load_engine(folder, Settings(dtype="fp32", image_reencode="load_image",
                                          generation_config="greedy"),
                         backend="transformers", template=get_template(covered.template),
                         readouts="yorn")
    prompt = "<|im_start|>User:<image>" + ASKED[1] + "<end_of_utterance>\nAssistant:"
    assert engine.prompt(ASKED[1]) == prompt
    assert engine.prompt(ASKED[1], image=False) == prompt.replace("<image>", "")
    theirs = AutoProcessor.from_pretrained(str(folder))(text=prompt, images=IMAGES[:1],
                                                        return_tensors="pt")
    assert torch.equal(engine.model.inputs(IMAGES[:1], [prompt])["input_ids"], theirs["input_ids"])
    # what each tool does not run, in meta.json's words
    assert "no Idefics3 (SmolVLM) class" in protocol_coverage(folder)["lmms-eval"]["not_covered"]
    assert "which no deterministic run reproduces" in \
        protocol_coverage(checkpoints["mllama"])["vlmevalkit"]["not_covered"]
    assert protocol_coverage(checkpoints["blip2"])["paper"]["template"] == "reference_plain"


@pytest.mark.slow
def test_eval_and_score_under_a_protocol_on_the_backend(checkpoints, tmp_path):
    """`eval --protocol lmms-eval` on Llama-3.2-Vision runs llama_vision's protocol through the
    backend, and `score --protocol` says so; VLMEvalKit's, whose class samples, is named as not
    covering it."""
    from click.testing import CliRunner

    from pope_fast.cli import main
    from pope_fast.engine.synthetic import builtin_questions, write_images, write_question_file

    questions = builtin_questions(6, "demo")
    write_question_file(tmp_path / "demo_pope.json", questions)
    write_images(tmp_path / "images", [q.image for q in questions])
    run = CliRunner().invoke(main, ["eval", "--model", str(checkpoints["mllama"]), "--questions",
                                    str(tmp_path / "demo_pope.json"), "--images",
                                    str(tmp_path / "images"), "--out", str(tmp_path / "run"),
                                    "--protocol", "lmms-eval", "--device", "cpu"])
    assert run.exit_code == 0, run.output
    meta = json.loads((tmp_path / "run/meta.json").read_text())
    assert meta["template"] == "lmms_eval_llama_vision" and \
        meta["generation"]["exact_match"]["max_new_tokens"] == 128
    scored = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--protocol", "lmms-eval"])
    assert scored.exit_code == 0 and \
        "the run is lmms-eval's: its prompt, length and image preprocessing" in scored.output
    other = CliRunner().invoke(main, ["score", str(tmp_path / "run"), "--protocol", "vlmevalkit"])
    assert "vlmevalkit does not cover this model" in other.output


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_icd_asks_the_class_with_its_instruction_as_a_system_message(checkpoints):
    """ICD's disturbed pass is the class on the prompt its chat template renders with the
    instruction as a system message, combined with the plain pass as ICD combines."""
    folder = checkpoints["idefics3"]
    engine = load_engine(folder, Settings(batch_size=4), backend="transformers",
                         readouts="dynamic_single")
    icd = parse_method("icd")
    got = engine.run_methods(engine.prepare(IMAGES[:1]), [ASKED[:2]], [icd])["icd"][0]
    model, inputs_of = _oracle(folder)
    for question, result in zip(ASKED[:2], got):
        disturbed = engine.prompt(question, system=icd.settings["instruction"])
        assert icd.settings["instruction"] in disturbed and disturbed != engine.prompt(question)
        with torch.inference_mode():
            plain, other = (model(**inputs_of(IMAGES[0], p)).logits[0, -1]
                            for p in (engine.prompt(question), disturbed))
        combined = icd.combine({"main": plain[None], "disturbed": other[None]})[0]
        ids = sorted(result.candidate_logits)
        assert np.allclose([result.candidate_logits[i] for i in ids], combined[ids].numpy(),
                           atol=1e-4, rtol=1e-4)
        assert not torch.allclose(plain[ids], other[ids], atol=1e-3)


@pytest.mark.slow  # tiny checkpoints written through transformers' classes, loaded on the backend
def test_the_probe_weighs_the_classes_own_attention_on_the_image_tokens(checkpoints):
    """probe image-attention:heads on the backend: per layer and head, the answer position's
    attention on the prompt's image tokens, as the class's eager attention weights give it for each
    prompt alone (a batch's pads take none); Llama-3.2-Vision, whose cross-attention reads the image
    apart, is refused in one line."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = checkpoints["paligemma"]
    engine = load_engine(folder, Settings(batch_size=4, probe="image-attention:heads"),
                         readouts="dynamic_single")
    got = _answers(engine)
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    processor = AutoProcessor.from_pretrained(str(folder))
    config = json.loads((folder / "config.json").read_text())
    image_token = config.get("image_token_id", config.get("image_token_index"))
    for image, row in zip(IMAGES, got):
        for question, result in zip(ASKED, row):
            inputs = processor(images=image, text=engine.prompt(question), return_tensors="pt")
            inputs.pop("labels", None)
            with torch.inference_mode():
                attentions = model(**inputs, output_attentions=True).attentions
            on_image = inputs["input_ids"][0] == image_token
            theirs = [[float(a[0, h, -1][on_image].sum()) for h in range(a.shape[1])]
                      for a in attentions]
            assert np.allclose(result.probe["image_attention_heads"], theirs, atol=1e-5)
            assert np.allclose(result.probe["image_attention"], np.mean(theirs, axis=1), atol=1e-5)
    refused = load_engine(checkpoints["mllama"], Settings(probe="image-attention"),
                          readouts="dynamic_single")
    with pytest.raises(ValueError, match="^the image-attention probe weighs image tokens of the "
                                         "prompt, and this "):
        refused.answer(IMAGES[0], ASKED[:1])


@pytest.mark.slow
def test_nf4_is_transformers_bitsandbytes_nf4(tmp_path):
    """quant nf4 on the backend: the class as transformers' bitsandbytes integration quantizes it
    (NF4, double quant, fp16 compute), the same decisions and logits as that model loaded by
    hand."""
    from transformers import AutoModelForImageTextToText, AutoProcessor, BitsAndBytesConfig

    from pope_fast.engine.synthetic import paligemma

    # every layer at least one NF4 block (64) wide: bitsandbytes' CPU path takes no narrower one
    wide = dict(paligemma.SIZES["tiny"], vision=dict(paligemma.SIZES["tiny"]["vision"],
                                                     hidden_size=64, intermediate_size=128))
    folder = write_checkpoint("paligemma", tmp_path / "nf4", wide,
                              weights=Weights(init="model", dtype=torch.float16, std=0.2))
    engine = load_engine(folder, Settings(quant="nf4", batch_size=1), readouts="dynamic_single")
    assert engine.settings.torch_dtype == torch.float16
    got = _answers(engine)
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.float16)
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float16,
                                                        quantization_config=config,
                                                        device_map="cpu").eval()
    assert any(type(m).__name__ == "Linear4bit" for m in engine.model.model.modules())
    processor = AutoProcessor.from_pretrained(str(folder))
    for image, row in zip(IMAGES, got):
        for question, result in zip(ASKED, row):
            inputs = processor(images=image, text=engine.prompt(question), return_tensors="pt")
            inputs.pop("labels")
            inputs["pixel_values"] = inputs["pixel_values"].half()
            with torch.inference_mode():
                logits = model(**inputs).logits[0, -1].float()
            ids = sorted(result.candidate_logits)
            assert np.allclose([result.candidate_logits[i] for i in ids], logits[ids].numpy(),
                               atol=1e-6)
            assert result.first_token_id == int(logits.argmax())


@pytest.mark.parametrize("model_type, missing", [("idefics2", "the Perceiver resampler"),
                                                 ("smolvlm", "the pixel-shuffle connector"),
                                                 ("fuyu", "a tower-free image path")])
def test_what_the_engine_lacks_reads_as_a_sentence(model_type, missing):
    """It said "the engine does not implement its the Perceiver resampler"."""
    from pope_fast.engine.models import unsupported

    assert f"the engine does not implement {missing}" in unsupported(model_type)
    assert " its the " not in unsupported(model_type) and " its a " not in unsupported(model_type)
