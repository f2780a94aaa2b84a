"""Settings.num_beams: a beam search as transformers' generate runs one (engine/layers/beam.py),
against generate itself on tiny checkpoints: the best beam's tokens, alone and batched, with
finished and running beams, with and without a shared prefix, and LAVIS's InstructBLIP search
(inputs_embeds alone, its max_length over the prompt)."""
import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, generate_each, generated_text, with_generation_config

from pope_fast.engine import Engine, Settings

# transformers' generate with beams, and the engine's, on tiny checkpoints
pytestmark = pytest.mark.slow

NEW = 16
SEARCH = dict(num_beams=5, repetition_penalty=1.5, length_penalty=1.0)


def test_beam_search_is_generates(tiny, tmp_path):
    """LLaVA with two eos ids that its beams reach (so beams finish at different steps and the
    candidates kept are 15): each question's best beam is generate(num_beams=5,
    repetition_penalty=1.5)'s, whether the four questions run in one batch or one at a time, with
    and without the shared prefix; greedy decoding gives other texts."""
    family = REGISTRY["llava"]
    folder = with_generation_config(tiny.checkpoint("llava"), tmp_path / "eos",
                                    {"eos_token_id": [24309, 9634]})
    model = family.transformers_class().from_pretrained(str(folder), dtype=torch.float32).eval()
    probe = Engine.load(folder, Settings())
    image, questions = family.images[0], QUESTIONS[:4]
    prompts = [probe.prompt(q) for q in questions]
    theirs = generate_each(model, family.inputs_of(folder), image, prompts, max_new_tokens=NEW,
                           **SEARCH)
    greedy = generate_each(model, family.inputs_of(folder), image, prompts, max_new_tokens=NEW)
    # finished and capped rows
    assert any(len(t) < NEW for t in theirs) and any(len(t) == NEW for t in theirs)
    assert theirs != greedy
    for settings in (Settings(), Settings(prefix_reuse=False), Settings(batch_size=1)):
        engine = Engine.load(folder, Settings(**{**settings.__dict__, **SEARCH,
                                                 "generation_config": "greedy",
                                                 "max_new_tokens": NEW}), readouts="string_parse")
        answers = engine.answer(image, questions)
        assert [a.decoded for a in answers] == [generated_text(engine, t) for t in theirs], settings
        assert [bool(a.capped) for a in answers] == [len(t) == NEW and not set(t) & {24309, 9634}
                                                     for t in theirs]


def test_lavis_instructblip_search_is_generate_over_inputs_embeds(tiny, tmp_path):
    """LAVIS's InstructBLIP generate: the prompt as inputs_embeds alone (the 32 projected queries,
    then the text's embeddings), 5 beams, max_length over the prompt, its repetition penalty 1.5
    over the output only: the engine's best beam under generation_config greedy_output and
    max_length is the language model's generate given those embeddings; with a penalty of 0.3, which
    favours what was read, that differs from generate given the prompt's ids, so the output-only
    reading is what is tested."""
    family = REGISTRY["instructblip"]
    folder = with_generation_config(tiny.checkpoint("instructblip"), tmp_path / "eos",
                                    {"eos_token_id": [2]})
    model = family.transformers_class().from_pretrained(str(folder), dtype=torch.float32).eval()
    probe = Engine.load(folder, Settings())
    image, questions = family.images[0], QUESTIONS[:3]
    for penalty in (1.5, 0.3):
        search = {**SEARCH, "repetition_penalty": penalty}
        embeds, ids, lengths = [], [], set()
        for q in questions:
            inputs = family.inputs_of(folder)(image, probe.prompt(q))
            length = inputs["input_ids"].shape[1]
            lengths.add(length)
            with torch.no_grad():
                queries = model.get_image_features(
                    inputs["pixel_values"], qformer_input_ids=inputs["qformer_input_ids"],
                    qformer_attention_mask=inputs["qformer_attention_mask"],
                    return_dict=True).pooler_output
                text = model.get_input_embeddings()(inputs["input_ids"])
                image_ids = inputs["input_ids"] == model.config.image_token_id
                mask = image_ids[..., None].expand_as(text)
                prompt = text.masked_scatter(mask, queries.to(text.dtype))
                embeds.append(model.language_model.generate(inputs_embeds=prompt,
                                                            max_length=length + 10,
                                                            attention_mask=inputs["attention_mask"],
                                                            do_sample=False, **search)[0].tolist())
                ids.append(model.generate(**inputs, max_new_tokens=10, do_sample=False,
                                          **search)[0, length:].tolist())
        assert penalty == 1.5 or embeds != ids
        # the questions' prompts are as long: one max_length allows each 10 new tokens
        (length,) = lengths
        engine = Engine.load(folder,
                             Settings(generation_config="greedy_output", max_length=length + 10,
                                              max_new_tokens=64, **search), readouts="string_parse")
        answers = engine.answer(image, questions)
        assert [a.decoded for a in answers] == [generated_text(engine, t) for t in embeds], penalty


def test_beam_settings_are_checked():
    assert ("num_beams" not in Settings().to_json()
            and Settings(num_beams=5).to_json()["num_beams"] == 5)
    with pytest.raises(ValueError, match="num_beams must be at least 1, not 0"):
        Settings(num_beams=0)
    with pytest.raises(ValueError, match="max_length must be at least 1, not 0"):
        Settings(max_length=0)
    with pytest.raises(ValueError, match="length_penalty must be a number between -100 and 100"):
        Settings(length_penalty=float("nan"))
