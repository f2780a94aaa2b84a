"""The checks every family's engine test makes against its transformers class, written once.

An oracle is {(image index, question): (answer-position logits, greedy new tokens, prompt ids)} from the
transformers class fed what the family's processor makes of the engine's own prompt (`inputs_of(image,
prompt)` gives those inputs); the checks below compare the engine to it, each over every image and
question it is given, naming the image and question that differ.
"""
from __future__ import annotations

import torch
from tinymodels import assert_matches_nf4_oracle, generated_text, worst_difference

from pope_fast.engine import ImagePrompts


def transformers_oracle(model, inputs_of, prompt, images, questions, new_tokens: int = 4) -> dict:
    out = {}
    for i, image in enumerate(images):
        for q in questions:
            inputs = inputs_of(image, prompt(q))
            with torch.no_grad():
                logits = model(**inputs).logits[0, -1]
                generated = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
            ids = inputs["input_ids"][0].tolist()
            out[i, q] = (logits, generated[0, len(ids):].tolist(), ids)
    return out


def processor_inputs(processor):
    """inputs_of for a family whose transformers processor takes (images=, text=) of one image and prompt."""
    return lambda image, prompt: processor(images=image, text=prompt, return_tensors="pt")


def processor_oracle(model_class, checkpoint, processor, prompt, images, questions, new_tokens: int = 4) -> dict:
    """The oracle of model_class loaded from the checkpoint in fp32, fed what `processor` makes of each prompt."""
    model = model_class.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    return transformers_oracle(model, processor_inputs(processor), prompt, images, questions, new_tokens)


def image_items(engine, images, questions) -> list[ImagePrompts]:
    """Every image with its prompts, as one engine.run_images call takes them."""
    return [ImagePrompts(engine.features(image), [engine.prompt(q) for q in questions]) for image in images]


def assert_answer_matches(answer, logits, generated, where: str) -> None:
    """Candidate logits within 1e-4 (fp32) and the first token the oracle's argmax and first greedy token."""
    worst, at = worst_difference(answer.candidate_logits, logits)
    assert worst <= 1e-4, f"{where}: id {at} differs by {worst:.2e}"
    assert answer.first_token_id == int(logits.argmax()) == generated[0], where


def assert_scores_match(engine, oracle, images, questions) -> None:
    """engine.score, one image at a time, against the oracle."""
    for i, image in enumerate(images):
        for answer in engine.score(image, questions):
            logits, generated, *_ = oracle[i, answer.question]
            assert_answer_matches(answer, logits, generated, f"image {i} {answer.question!r}")


def assert_run_matches(engine, oracle, items: list[ImagePrompts], questions) -> None:
    """One engine.run_images call over every item (prompts of several images in one prefill) against the oracle."""
    for i, answers in enumerate(engine.run_images(items)):
        for q, answer in zip(questions, answers):
            logits, generated, *_ = oracle[i, q]
            assert_answer_matches(answer, logits, generated, f"image {i} {q!r}")


def assert_continuations_match(engine, oracle, images, questions) -> None:
    """The text readouts' continuation is generate's, up to the first stop id."""
    for i, image in enumerate(images):
        for answer in engine.score(image, questions):
            _, generated, *_ = oracle[i, answer.question]
            assert answer.decoded == generated_text(engine, generated), f"image {i} {answer.question!r}"


def assert_probe_matches_eager(engine, eager_model, inputs_of, images, questions) -> None:
    """The image-attention probe at the answer position, per layer and head, against the attention weights of
    transformers' eager attention summed over the image tokens (the config's image token id)."""
    for image, results in zip(images, engine.run_images(image_items(engine, images, questions))):
        for q, result in zip(questions, results):
            inputs = inputs_of(image, engine.prompt(q))
            with torch.no_grad():
                attentions = eager_model(**inputs, output_attentions=True).attentions
            image_keys = inputs["input_ids"][0] == eager_model.config.image_token_id
            theirs = torch.stack([a[0, :, -1, image_keys].sum(-1) for a in attentions])  # [layers, heads]
            ours = torch.tensor(result.probe["image_attention_heads"])
            assert ours.shape == theirs.shape and float((ours - theirs).abs().max()) <= 1e-5, (image.size, q)
            assert 0.0 < float(theirs.min()) and float(theirs.max()) < 1.0


def assert_nf4_matches(engine, bnb_model, inputs_of, images, questions) -> None:
    """An NF4 engine against transformers + bitsandbytes (tinymodels.bnb_nf4_oracle), pixels in fp16 as the
    fp16 model takes them: assert_matches_nf4_oracle per answer."""
    for image in images:
        for answer in engine.score(image, questions):
            inputs = inputs_of(image, engine.prompt(answer.question))
            inputs["pixel_values"] = inputs["pixel_values"].half()
            with torch.no_grad():
                theirs = bnb_model(**inputs).logits[0, -1].float()
            assert_matches_nf4_oracle(engine, answer, theirs)


def tower_matmul_flops(engine, images) -> tuple[int, int]:
    """(vision tokens, FLOPs) of the engine's tower encoding `images`, counted from what its Linears and
    patch-embedding Conv3d multiply (2 x weights x rows): the figure a family's vision_flops must give."""
    counted = []

    def count(module, args, output):
        rows = output.numel() // output.shape[-1] if isinstance(module, torch.nn.Linear) else output.shape[0]
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
