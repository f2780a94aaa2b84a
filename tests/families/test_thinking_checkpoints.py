"""A thinking checkpoint under both named modes (`--thinking off`, `--thinking decode`), against
transformers: the registry's tiny Qwen3-VL with a stand-in thinking template (its generation prompt
opens `<think>\\n`, as Qwen3-VL-*-Thinking's does), and `</think>`'s lm_head row made 1.05 times
another token's, so that the random model's greedy reasoning closes within a few tokens for some
prompts and runs on for others."""
import functools
import json
import os
import shutil

import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, qwen_inputs, qwen_processors, worst_difference, write_pope_set

from pope_fast.engine import Engine, Settings, parse_method
from pope_fast.readout import get_template, load_questions
from pope_fast.readout.thinking import NOT_CLOSED
from pope_fast.sweep import run_paired, run_plain

pytestmark = pytest.mark.slow  # the tiny Qwen3-VL and its transformers class
FAMILY = "qwen3_vl"  # whose checkpoint and model tests/families/conftest.py gives
IMAGES = REGISTRY[FAMILY].images[:2]
CAP = 6
# the thinking checkpoint's (tokenizer, image processor), made once
PROCESSORS = functools.lru_cache(qwen_processors)


@pytest.fixture(scope="module")
def thinking(checkpoint, model, tmp_path_factory):
    """(the thinking checkpoint, its transformers class): hard links to the tiny's files but its
    chat template and its weights, whose `</think>` row is 1.05 times that of the third token the
    unedited model picks for the first prompt."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    folder = tmp_path_factory.mktemp("thinking") / "ckpt"
    folder.mkdir()
    for path in checkpoint.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            os.link(path, folder / path.name)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    # the real tokenizer has them; the built-in stand-in not
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template += "{% if add_generation_prompt %}<think>\n{% endif %}"
    for name in ("tokenizer_config.json", "tokenizer.json", "chat_template.json",
                 "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(str(folder))
    close = tokenizer.convert_tokens_to_ids("</think>")
    prompt = get_template("qwen2_vl_chat").render(QUESTIONS[0], tokenizer)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    inputs = qwen_inputs(checkpoint, IMAGES[0], prompt)
    with torch.no_grad():
        third = model.generate(**inputs, max_new_tokens=3, do_sample=False)[0, -1]
    for path in checkpoint.glob("*.safetensors"):
        tensors = load_file(str(path))
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"][close] = 1.05 * tensors["lm_head.weight"][third]
        save_file(tensors, str(folder / path.name), metadata={"format": "pt"})
    return folder, Qwen3VLForConditionalGeneration.from_pretrained(str(folder),
                                                                   dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def loaded(thinking):
    """The thinking checkpoint loaded once (its default mode: decode, 4,096 tokens at most); each
    test's engine runs its model under its own settings."""
    engine = Engine.load(thinking[0], Settings())
    assert engine.meta()["thinking"] == {"mode": "decode", "max_tokens": 4096}
    return engine


def _engine(loaded, thinking: str, readouts: str, **settings) -> Engine:
    return Engine(loaded.model, Settings(thinking=thinking, **settings), readouts=readouts)


def _theirs(folder, model, image, prompt: str, cap: int, stop: list[int], after: list[int]):
    """(the reasoning generate decodes, within cap, up to a stop id; the logits after it, its close
    and `after`)."""
    inputs = qwen_inputs(folder, image, prompt, PROCESSORS(folder))
    length = inputs["input_ids"].shape[1]
    new = []
    if cap:
        with torch.no_grad():
            new = model.generate(**inputs, max_new_tokens=cap, do_sample=False,
                                 eos_token_id=stop)[0, length:].tolist()
    new = new[:next((k + 1 for k, t in enumerate(new) if t in stop), len(new))]
    ids = torch.cat([inputs["input_ids"], torch.tensor([new + after], dtype=torch.long)], dim=1)
    extra = torch.zeros(1, ids.shape[1] - length, dtype=inputs["mm_token_type_ids"].dtype)
    with torch.no_grad():
        types = torch.cat([inputs["mm_token_type_ids"], extra], dim=1)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                       mm_token_type_ids=types).logits[0, -1]
    return new, logits


def test_thinking_off_reads_the_answer_after_an_empty_block(thinking, loaded):
    """--thinking off: the empty block closed where the template opened one; the class's logits
    there."""
    folder, model = thinking
    engine = _engine(loaded, "off", "template_aware,first_token")
    prompt = engine.prompt(QUESTIONS[0])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert engine.meta()["thinking"] == {"mode": "off"}
    [ours] = engine.answer(IMAGES[0], [QUESTIONS[0]])
    _, theirs = _theirs(folder, model, IMAGES[0], prompt, 0, [], [])
    assert worst_difference(ours.candidate_logits, theirs)[0] < 1e-4
    assert ours.reasoning is None and ours.predictions["template_aware"] in ("yes", "no")


def test_thinking_decode_reads_the_answer_after_the_reasoning(thinking, loaded):
    """--thinking decode: each prompt's reasoning is generate's, greedy up to </think>, and the
    logits are the class's after it and the template's '\n\n'. Under a cap one token short of the
    longest reasoning, a reasoning that does not close within it answers unknown under every
    readout, with the reason, and the others as before."""
    folder, model = thinking
    engine = _engine(loaded, f"decode:max_tokens={CAP}", "template_aware,string_parse")
    thinking = engine.thinking
    assert engine.meta()["thinking"] == {"mode": "decode", "max_tokens": CAP}
    assert engine.model.tokenizer.decode(list(thinking.after_ids)) == "\n\n"
    stop = [thinking.close_id, *engine.model.stop_ids]
    answers = [engine.answer(image, QUESTIONS[:2]) for image in IMAGES]
    for image, pair in zip(IMAGES, answers):
        for answer in pair:
            reasoning, theirs = _theirs(folder, model, image, engine.prompt(answer.question), CAP,
                                        stop, list(thinking.after_ids))
            assert answer.reasoning_tokens == len(reasoning)
            assert answer.reasoning \
                == engine.model.tokenizer.decode(reasoning, skip_special_tokens=True)
            if reasoning[-1] == thinking.close_id:
                assert answer.unanswered is None \
                    and worst_difference(answer.candidate_logits, theirs)[0] < 1e-4
            else:
                assert (len(reasoning), answer.unanswered, answer.candidate_logits) \
                    == (CAP, NOT_CLOSED, {})
    short = max(a.reasoning_tokens for pair in answers for a in pair if a.unanswered is None) - 1
    assert short >= 1
    engine = _engine(loaded, f"decode:max_tokens={short}", "template_aware")
    for image, pair in zip(IMAGES, answers):
        for capped, answer in zip(engine.answer(image, QUESTIONS[:2]), pair):
            if answer.reasoning_tokens <= short:
                assert capped.reasoning == answer.reasoning \
                    and capped.predictions["template_aware"] == answer.predictions["template_aware"]
                assert max(abs(v - answer.candidate_logits[i])
                           for i, v in capped.candidate_logits.items()) < 1e-5
            else:
                assert (capped.reasoning_tokens, capped.unanswered, capped.candidate_logits) \
                    == (short, NOT_CLOSED, {})
                assert capped.predictions == {"template_aware": "unknown"}


def test_a_thinking_run_resumes_to_the_same_bytes(loaded, tmp_path):
    """A decode run's records (reasoning, its count, the unanswered reason) after records lost: the
    same bytes."""
    images, files = write_pope_set(tmp_path / "pope", n_images=2, questions_per_image=2,
                                   splits=("random",))
    questions = [q for f in files for q in load_questions(f)]
    settings = dict(image_batch=1, batch_size=4)
    clean, out = tmp_path / "clean", tmp_path / "out"
    run_plain(_engine(loaded, f"decode:max_tokens={CAP}", "template_aware", **settings), questions,
              images, clean)
    records = [json.loads(line) for line in (clean / "records.jsonl").read_text().splitlines()]
    assert all("reasoning_tokens" in r for r in records)
    shutil.copytree(clean, out)
    lines = (out / "records.jsonl").read_text().splitlines(keepends=True)
    (out / "records.jsonl").write_text("".join(lines[:1] + lines[2:]))
    run_plain(_engine(loaded, f"decode:max_tokens={CAP}", "template_aware", **settings), questions,
              images, out)
    assert (out / "records.jsonl").read_bytes() == (clean / "records.jsonl").read_bytes()
    assert json.loads((out / "meta.json").read_text())["thinking"] \
        == {"mode": "decode", "max_tokens": CAP}


def test_a_method_under_decode_is_refused_before_the_run_touches_its_folder(loaded, tmp_path):
    """A method's passes would each reason apart: refused in one line naming it, and the run folder
    never made."""
    images, files = write_pope_set(tmp_path / "pope", n_images=1, questions_per_image=1,
                                   splits=("random",))
    engine = _engine(loaded, f"decode:max_tokens={CAP}", "template_aware")
    with pytest.raises(ValueError,
                       match=r"^method vcd: thinking decode reads .* \(or --thinking off\)$"):
        run_paired(engine, [q for f in files for q in load_questions(f)], images, tmp_path / "out",
                   [parse_method("vcd")])
    assert not (tmp_path / "out").exists()


def test_verify_compares_a_thinking_checkpoint_with_thinking_off(thinking, monkeypatch):
    """verify hands the class the engine's prompt: a thinking checkpoint's with thinking off on both
    sides (under decode the engine would read its answer after a reasoning the class never sees)."""
    from pope_fast import verify

    def loaded(model_dir, settings, **_):
        raise LookupError(settings.thinking)

    monkeypatch.setattr(verify, "load_engine", loaded)
    with pytest.raises(LookupError, match="^off$"):
        verify.verify(thinking[0], n_questions=2, device="cpu")
