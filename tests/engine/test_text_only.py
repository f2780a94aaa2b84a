"""Questions asked without an image (HallusionBench's visual_input 0): each family that can answer
them runs them as text-only prompts (no image marker, no prefix, plain positions), against its
transformers class fed the processor's text-only ids; mixed with image prompts in one run they
answer as alone; the family and the methods that cannot answer one refuse it in one line."""
import json

import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, generated_text, synthetic_image, worst_difference

from pope_fast.engine import METHODS, Engine, ImagePrompts, Settings, TextOnlyRefused
from pope_fast.engine.models import family_class

pytestmark = pytest.mark.slow  # the engine on tiny checkpoints, against transformers

# The registry's families whose transformers class answers a question without an image
# (InstructBLIP's cannot: test_instructblip_refuses_in_one_line).
ANSWERING = [name for name in REGISTRY if family_class(name).text_only_refusal is None]
ASKED = QUESTIONS[:3] + ["Is the left bar taller than the right one in 2019?"]
IMAGE = synthetic_image(7, (60, 44))


@pytest.fixture(scope="module", params=ANSWERING)
def family(request, tiny):
    """(name, the registry's checkpoint, its fp32 transformers model), made once a session."""
    return request.param, tiny.checkpoint(request.param), tiny.model(request.param)


def _oracle_ids(engine, question: str) -> list[int]:
    """The processor's text-only ids for the question, rendered independently of Template.render:
    the chat template over a user message holding a text part alone, tokenized as a processor's
    apply_chat_template does (the template's own specials, none added); or the plain template's text
    with its '<image>\\n' left out, tokenized as processors tokenize text without images."""
    template, tokenizer = engine.template, engine.model.tokenizer
    if template.chat:
        message = {"role": "user",
                   "content": [{"type": "text", "text": question + template.suffix}]}
        thinking = {} if template.enable_thinking is None \
            else {"enable_thinking": template.enable_thinking}
        ids = tokenizer.apply_chat_template([message], add_generation_prompt=True, tokenize=True,
                                            **thinking)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    else:
        assert "<image>\n" in template.text
        plain = template.text.replace("<image>\n", "")
        ids = list(tokenizer(plain.format(question=question))["input_ids"])
    assert engine.model.image_token_id not in ids
    return ids


def test_text_only_matches_transformers(family):
    """Candidate logits within 1e-4 of the transformers class on the processor's ids, argmax and
    the greedy continuation equal to generate's, with and without prefix reuse, in batches of 1
    and of all."""
    name, checkpoint, model = family
    # the processor's ids -> generate's first-step logits and new tokens, for both engines
    oracle = {}
    for reuse, batch in ((True, 4), (False, 1)):
        engine = Engine.load(checkpoint,
                             Settings(batch_size=batch, prefix_reuse=reuse, max_new_tokens=4),
                             readouts="all")
        answers = engine.answer(None, ASKED)
        assert engine.counts.images_encoded == 0 and engine.counts.prefix_tokens == 0
        for answer in answers:
            ids = _oracle_ids(engine, answer.question)
            layout = engine.model.text_layout(engine.prompt(answer.question, image=False))
            assert list(layout.ids) == ids
            if tuple(ids) not in oracle:
                with torch.no_grad():
                    out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=4,
                                         do_sample=False,
                                         output_logits=True, return_dict_in_generate=True)
                oracle[tuple(ids)] = out.logits[0][0], out.sequences[0, len(ids):]
            logits, generated = oracle[tuple(ids)]
            worst, at = worst_difference(answer.candidate_logits, logits)
            assert worst <= 1e-4, f"{name} {answer.question!r}: id {at} differs by {worst:.2e}"
            assert answer.first_token_id == int(logits.argmax()) == int(generated[0])
            assert answer.decoded == generated_text(engine, generated.tolist())


def test_mixed_with_image_prompts_answers_as_alone(family):
    """Text-only and image prompts in one run (one batch without prefix reuse): each answer as when
    run alone; the vision cache holds the image only."""
    name, checkpoint, _ = family
    for reuse in (True, False):
        engine = Engine.load(checkpoint,
                             Settings(batch_size=8, prefix_reuse=reuse, max_new_tokens=3),
                             readouts="all")
        text = engine.answer(None, ASKED)
        image = engine.answer(IMAGE, ASKED[:2])
        features = engine.features(IMAGE)
        mixed = engine.run_images([
            ImagePrompts(None, [engine.prompt(q, image=False) for q in ASKED[:2]]),
            ImagePrompts(features, [engine.prompt(q) for q in ASKED[:2]]),
            ImagePrompts(None, [engine.prompt(q, image=False) for q in ASKED[2:]])])
        assert engine.counts.images_encoded == 1
        for alone, together in zip(text[:2] + image + text[2:],
                                   [r for item in mixed for r in item]):
            assert (together.first_token_id == alone.first_token_id
                    and together.decoded == alone.decoded), name
            worst = max(abs(v - alone.candidate_logits[i])
                        for i, v in together.candidate_logits.items())
            assert worst <= 1e-5, f"{name} reuse={reuse}: {worst:.2e}"
        # a text-only prompt differs from the same question asked of the image
        assert text[0].candidate_logits != image[0].candidate_logits


def test_text_only_prompt_renders_without_the_image():
    from pope_fast.readout import get_template

    assert get_template("llava_plain").render("Q?", image=False) == "USER: Q?\nASSISTANT:"
    assert get_template("mplug_owl2").render("Q?", image=False) == \
        "USER: Q? Answer yes or no only.\nASSISTANT:"
    # VLMEvalKit's LLaVA adds ' <image> ' per image:
    # 'USER: ' + question + ' ASSISTANT: ' without one
    assert get_template("vlmevalkit_llava").render("Q?", image=False).endswith(
        "USER: Q? ASSISTANT: ")
    assert get_template("instructblip").render("Q?", image=False) == \
        get_template("instructblip").render("Q?")


@pytest.fixture(scope="module")
def llava(tiny):
    return Engine.load(tiny.checkpoint("llava"),
                       Settings(probe="image-attention", max_new_tokens=3), readouts="all")


def test_probe_is_empty_for_a_text_only_prompt(llava):
    [text] = llava.answer(None, ASKED[:1])
    [image] = llava.answer(IMAGE, ASKED[:1])
    assert (text.probe is None
            and len(image.probe["image_attention"]) == llava.model.lm.dims.num_layers)


def test_methods_that_need_the_image_refuse(llava):
    """VCD and PAI refuse a text-only question in one line; ICD (a system instruction) runs it, as
    the contrast of the text-only prompt under both instructions."""
    for name, reason in (("vcd", "no image to noise"), ("pai", "baseline under PAI's name")):
        with pytest.raises(TextOnlyRefused,
                           match=f"^method {name} cannot answer a text-only question "
                                                  rf"\(no image\): .*{reason}$"):
            llava.run_methods([None], [ASKED[:1]], [METHODS["none"](), METHODS[name]()])
    out = llava.run_methods([None], [ASKED[:2]], [METHODS["none"](), METHODS["icd"]()])
    baseline = llava.answer(None, ASKED[:2])[0]  # the same batch of two
    assert out["none"][0][0].candidate_logits == baseline.candidate_logits
    assert out["icd"][0][0].candidate_logits != baseline.candidate_logits


def test_a_paired_run_records_the_refusal_per_method(llava, tmp_path):
    """Under run_paired, a method that cannot answer the text-only question stops the run before
    anything is written, as an unusable image does; with skip_bad, the baseline answers it and VCD's
    folder holds its error record; the image question is answered in both."""
    from pope_fast.engine.inputs.images import ImageError
    from pope_fast.readout import Question
    from pope_fast.sweep import run_paired

    IMAGE.save(tmp_path / "a.png")
    questions = [Question("1", "a.png", ASKED[0], "yes", "s"),
                 Question("2", "", ASKED[3], "no", "s")]
    methods = [METHODS["none"](), METHODS["vcd"]()]
    with pytest.raises(ImageError,
                       match=r"^1 question\(s\) are asked without an image: method vcd cannot "
                             r"answer a text-only question \(no image\): .*; pass --skip-bad"):
        run_paired(llava, questions, tmp_path, tmp_path / "refused", methods)
    assert not any((tmp_path / "refused").rglob("records.jsonl"))
    run_paired(llava, questions, tmp_path, tmp_path / "out", methods, skip_bad=True)
    records = {m: {r["question_id"]: r
                   for r in map(json.loads, (tmp_path / "out" / m / "records.jsonl")
                                                     .read_text().splitlines())}
               for m in ("none", "vcd")}
    assert "error" not in records["none"]["2"] and records["none"]["2"]["image"] == ""
    assert records["vcd"]["2"]["error"].startswith("method vcd cannot answer a text-only question "
                                                   "(no image)")
    assert "error" not in records["vcd"]["1"] and "error" not in records["none"]["1"]


def test_instructblip_refuses_in_one_line(tiny):
    engine = Engine.load(tiny.checkpoint("instructblip"), Settings())
    with pytest.raises(TextOnlyRefused) as err:
        engine.answer(None, ASKED[:1])
    assert str(err.value) == ("InstructBLIP cannot answer a text-only question (no image): its "
                              "language model reads the image through the Q-Former's query tokens, "
                              "and InstructBlipForConditionalGeneration requires pixel_values")
    assert engine.counts.images_encoded == 0 and engine.text_only_refusal() == str(err.value)


def test_mplug_owl2_text_only_is_its_text_path(shared):
    """mPLUG-Owl2 has no transformers class: upstream's prepare_inputs_labels_for_multimodal gives a
    prompt without images modality indicators of 0 at every position, so each MultiwayNetwork takes
    its text module (multiway.0) throughout: a LLaMA with those weights. Against transformers'
    LlamaForCausalLM built so from the upstream fixture (ids as upstream's tokenizer_image_token
    makes them for a prompt with no <|image|>)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pope_fast.engine.models.mplug_owl2 import tokenizer_image_token

    folder = shared / "fixtures/mplug_owl2_tiny/checkpoint"
    config = json.loads((folder / "config.json").read_text())
    llama = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k not in (
        "visual_config", "architectures", "model_type", "torch_dtype",
        "transformers_version")})).eval()
    text = {k.replace(".multiway.0.", "."): v
            for k, v in load_file(str(folder / "model.safetensors")).items()
            if ".multiway.1." not in k and "rotary_emb" not in k
            and not k.startswith(("model.vision_model.", "model.visual_abstractor."))}
    missing, unexpected = llama.load_state_dict(text, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    engine = Engine.load(folder, Settings(max_new_tokens=4), readouts="all")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    for answer in engine.answer(None, ASKED):
        prompt = engine.prompt(answer.question, image=False)
        ids = tokenizer_image_token(tokenizer, prompt)
        assert (list(engine.model.text_layout(prompt).ids) == ids
                and ids == list(tokenizer(prompt)["input_ids"]))
        with torch.no_grad():
            logits = llama(input_ids=torch.tensor([ids])).logits[0, -1]
            generated = llama.generate(input_ids=torch.tensor([ids]), max_new_tokens=4,
                                       do_sample=False)[0, len(ids):]
        worst, at = worst_difference(answer.candidate_logits, logits)
        assert worst <= 1e-4, f"{answer.question!r}: id {at} differs by {worst:.2e}"
        assert answer.first_token_id == int(logits.argmax()) == int(generated[0])
        assert answer.decoded == generated_text(engine, generated.tolist())


def test_eval_of_questions_without_images_needs_no_image_folder(llava, tmp_path):
    """HallusionBench rows without a figure alone: `eval` answers them with no --images folder."""
    from click.testing import CliRunner

    from pope_fast.cli import main

    rows = [{"category": "VS", "subcategory": "chart", "visual_input": "0", "set_id": "1",
             "figure_id": "0",
             "sample_note": "", "question_id": str(i), "question": q, "gt_answer_details": "",
             "gt_answer": "1", "filename": None} for i, q in enumerate(ASKED[:2])]
    (tmp_path / "HallusionBench.json").write_text(json.dumps(rows))
    result = CliRunner().invoke(main, ["eval", "--model", str(llava.model.folder), "--questions",
                                       str(tmp_path / "HallusionBench.json"), "--out",
                                       str(tmp_path / "run"),
                                       "--device", "cpu", "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line)
               for line in (tmp_path / "run/records.jsonl").read_text().splitlines()]
    assert [r["image"] for r in records] == ["", ""]
    assert all("error" not in r and r["candidate_logits"] and "decoded" in r for r in records)
