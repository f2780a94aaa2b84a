"""The checks every family's engine test makes against its transformers class, written once.

An oracle is {(image index, question): (answer-position logits, greedy new tokens, prompt ids)} from
the transformers class fed what the family's processor makes of the engine's own prompt
(`inputs_of(image, prompt)` gives those inputs); the checks below compare the engine to it, each
over every image and question it is given, naming the image and question that differ.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tinymodels import assert_matches_nf4_oracle, generated_text, worst_difference

from pope_fast.coverage import protocol_for
from pope_fast.engine import Counts, ImagePrompts


def transformers_oracle(model, inputs_of, prompt, images, questions, new_tokens: int = 4) -> dict:
    """The answer-position logits are generate's own first step's (output_logits: unprocessed, the
    forward that picks its first token), not a second forward's, which would compute every
    position's logits over the whole vocabulary (within 2e-6 of them on the tiny Qwen2-VL)."""
    out = {}
    for i, image in enumerate(images):
        for q in questions:
            inputs = inputs_of(image, prompt(q))
            with torch.no_grad():
                generated = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False,
                                           output_logits=True, return_dict_in_generate=True)
            ids = inputs["input_ids"][0].tolist()
            out[i, q] = (generated.logits[0][0], generated.sequences[0, len(ids):].tolist(), ids)
    return out


def processor_inputs(processor):
    """inputs_of for a family whose transformers processor takes (images=, text=) of one image and
    prompt."""
    return lambda image, prompt: processor(images=image, text=prompt, return_tensors="pt")


def processor_oracle(family, checkpoint, prompt, images, questions, new_tokens: int = 4) -> dict:
    """The oracle of a registry family's transformers class loaded from the checkpoint in fp32, fed
    what the family's reference processor (its image processor and prompt expansion, where
    transformers' processor cannot be built without torchvision) makes of each prompt."""
    # why: only the families with a reference processor ask
    from pope_fast.engine.models import family_class

    processor = family_class(family.name).reference_processor(checkpoint)
    model = family.transformers_class().from_pretrained(str(checkpoint),
                                                        dtype=torch.float32).eval()
    return transformers_oracle(model, processor_inputs(processor), prompt, images, questions,
                               new_tokens)


def assert_first_answers_match(family, checkpoint, engine, image, questions) -> dict:
    """The engine's answers to `questions` about one image against the family's class fed its
    reference processor's inputs (processor_oracle): candidate logits within 1e-4, the first token
    the argmax; the oracle, for more."""
    oracle = processor_oracle(family, checkpoint, engine.prompt, [image], questions, new_tokens=1)
    for answer in engine.answer(image, questions):
        logits, _, _ = oracle[0, answer.question]
        worst, at = worst_difference(answer.candidate_logits, logits)
        assert worst <= 1e-4 and answer.first_token_id == int(logits.argmax()), \
            (answer.question, at, worst)
    return oracle


def assert_flops_linear(model, pixels) -> None:
    """Matmul FLOPs are linear in the work, the vision side a real share of them."""
    once = Counts(images_encoded=1, vision_tokens=model.vision_tokens(pixels), prompts=3,
                  prefix_tokens=12, suffix_tokens=9)
    twice = Counts(images_encoded=2, vision_tokens=2 * once.vision_tokens, prompts=6,
                   prefix_tokens=24, suffix_tokens=18)
    assert model.matmul_flops(twice) == 2 * model.matmul_flops(once) > model.vision_flops(once) > 0


def rope_index_pairs(engine, model, inputs_of, images, grids, **rope):
    """(prompt ids, ours, theirs) per image: the engine's M-RoPE streams of the first question's
    prompt and transformers' get_rope_index of the same ids (asserted equal to the engine's), `rope`
    its extra arguments."""
    # why: the one question every family's positions are checked on
    from tinymodels import QUESTIONS

    pairs = []
    for image, (rows, cols) in zip(images, grids):
        ids = engine.model.prompt_ids(engine.prompt(QUESTIONS[0]), rows * cols)
        ours = engine.model.positions(ids, engine.features(image))
        inputs = inputs_of(image, engine.prompt(QUESTIONS[0]))
        assert inputs["input_ids"][0].tolist() == ids
        theirs, _ = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                               image_grid_thw=inputs["image_grid_thw"], **rope)
        pairs.append((ids, ours, theirs))
    return pairs


def assert_qwen_protocol_prompts(checkpoint, tokenizer, question: str,
                                 vlmevalkit_tokens: int) -> str:
    """lmms-eval's (a system turn, the short-answer post-prompt) and VLMEvalKit's (the bare
    question) messages through a Qwen tokenizer's chat template are what each protocol's template
    renders, at each tool's length; VLMEvalKit's rendering, for more."""
    from pope_fast.coverage import protocol_for  # why: the protocols' checks only
    from pope_fast.readout import get_template
    from pope_fast.readout.templates import SHORT_ANSWER

    image = {"type": "image"}
    lmms = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [image, {"type": "text", "text": question + SHORT_ANSWER}]}]
    vlmeval = [{"role": "user", "content": [image, {"type": "text", "text": question}]}]
    for protocol, messages, length in (("lmms-eval", lmms, 128),
                                       ("vlmevalkit", vlmeval, vlmevalkit_tokens)):
        coverage = protocol_for(checkpoint, protocol)
        theirs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert get_template(coverage.template).render(question, tokenizer) == theirs, protocol
        assert coverage.new_tokens == length, protocol
    return theirs


def assert_qwen_answer_tokens(engine, prompt: str) -> None:
    """A Qwen chat template's real tokenizer (Qwen2.5-VL's, Qwen3-VL's): its vision ids, the bare
    `Yes` (9454) / `No` (2753) as the first answer token after the prompt, both in the
    template-aware sets and apart, and <|im_end|> among the stops."""
    tokenizer = engine.model.tokenizer
    assert engine.model.image_token_id == 151655
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>")] \
        == [151652, 151653]
    for answer, first in (("Yes", 9454), ("No", 2753)):
        assert tokenizer.encode(prompt + answer) == tokenizer.encode(prompt) + [first]
    aware = engine.readout.token_sets["template_aware"]
    assert 9454 in aware.yes_ids and 2753 in aware.no_ids \
        and not set(aware.yes_ids) & set(aware.no_ids)
    assert engine.model.stop_ids >= {151645}


def assert_protocols(checkpoint, expected: dict[str, dict], refused: dict[str, str]) -> None:
    """Each tool's protocol for the checkpoint has the `expected` fields' values; each `refused`
    tool refuses it with a message matching its pattern."""
    for tool, fields in expected.items():
        protocol = protocol_for(checkpoint, tool)
        assert {name: getattr(protocol, name) for name in fields} == fields, tool
    for tool, message in refused.items():
        with pytest.raises(ValueError, match=message):
            protocol_for(checkpoint, tool)


def image_items(engine, images, questions) -> list[ImagePrompts]:
    """Every image with its prompts, as one engine.run_images call takes them."""
    return [ImagePrompts(engine.features(image), [engine.prompt(q) for q in questions])
            for image in images]


def assert_answer_matches(answer, logits, generated, where: str) -> None:
    """Candidate logits within 1e-4 (fp32) and the first token the oracle's argmax and first greedy
    token."""
    worst, at = worst_difference(answer.candidate_logits, logits)
    assert worst <= 1e-4, f"{where}: id {at} differs by {worst:.2e}"
    assert answer.first_token_id == int(logits.argmax()) == generated[0], where


def assert_scores_match(engine, oracle, images, questions) -> None:
    """engine.answer, one image at a time, against the oracle."""
    for i, image in enumerate(images):
        for answer in engine.answer(image, questions):
            logits, generated, *_ = oracle[i, answer.question]
            assert_answer_matches(answer, logits, generated, f"image {i} {answer.question!r}")


def assert_run_matches(engine, oracle, items: list[ImagePrompts], questions) -> None:
    """One engine.run_images call over every item (prompts of several images in one prefill) against
    the oracle."""
    for i, answers in enumerate(engine.run_images(items)):
        for q, answer in zip(questions, answers):
            logits, generated, *_ = oracle[i, q]
            assert_answer_matches(answer, logits, generated, f"image {i} {q!r}")


def assert_continuations_match(engine, oracle, images, questions) -> None:
    """The text readouts' continuation is generate's, up to the first stop id."""
    for i, image in enumerate(images):
        for answer in engine.answer(image, questions):
            _, generated, *_ = oracle[i, answer.question]
            assert answer.decoded == generated_text(engine, generated), \
                f"image {i} {answer.question!r}"


def assert_probe_matches_eager(engine, eager_model, inputs_of, images, questions) -> None:
    """The image-attention probe at the answer position, per layer and head, against the attention
    weights of transformers' eager attention summed over the image tokens (the config's image token
    id)."""
    for image, results in zip(images, engine.run_images(image_items(engine, images, questions))):
        for q, result in zip(questions, results):
            inputs = inputs_of(image, engine.prompt(q))
            with torch.no_grad():
                attentions = eager_model(**inputs, output_attentions=True).attentions
            image_keys = inputs["input_ids"][0] == eager_model.config.image_token_id
            # [layers, heads]
            theirs = torch.stack([a[0, :, -1, image_keys].sum(-1) for a in attentions])
            ours = torch.tensor(result.probe["image_attention_heads"])
            assert ours.shape == theirs.shape and float((ours - theirs).abs().max()) <= 1e-5, \
                (image.size, q)
            assert 0.0 < float(theirs.min()) and float(theirs.max()) < 1.0


def assert_nf4_matches(engine, bnb_model, inputs_of, images, questions) -> None:
    """An NF4 engine against transformers + bitsandbytes (tinymodels.bnb_nf4_oracle), pixels in fp16
    as the fp16 model takes them: assert_matches_nf4_oracle per answer."""
    for image in images:
        for answer in engine.answer(image, questions):
            inputs = inputs_of(image, engine.prompt(answer.question))
            inputs["pixel_values"] = inputs["pixel_values"].half()
            with torch.no_grad():
                theirs = bnb_model(**inputs).logits[0, -1].float()
            assert_matches_nf4_oracle(engine, answer, theirs)


def tower_matmul_flops(engine, images) -> tuple[int, int]:
    """(vision tokens, FLOPs) of the engine's tower encoding `images`, counted from what its Linears
    and patch-embedding Conv3d multiply (2 x weights x rows): the figure a family's vision_flops
    must give."""
    counted = []

    def count(module, args, output):
        rows = (output.numel() // output.shape[-1] if isinstance(module, torch.nn.Linear)
                else output.shape[0])
        counted.append(2 * module.weight.numel() * rows)

    hooks = [m.register_forward_hook(count) for m in engine.model.vision.modules()
             if isinstance(m, (torch.nn.Linear, torch.nn.Conv3d))]
    try:
        pixels = [engine.model.preprocess(image) for image in images]
        engine.model.encode_images(pixels)
    finally:
        for hook in hooks:
            hook.remove()
    return sum(engine.model.vision_tokens(p) for p in pixels), sum(counted)


def edited_checkpoint(checkpoint: Path, folder: Path, edit) -> Path:
    """The checkpoint with config.json edited by `edit(config)`, in `folder`: the other files hard
    links to the checkpoint's (its weights not copied)."""
    folder.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.name != "config.json":
            os.link(path, folder / path.name)
    config = json.loads((checkpoint / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
