"""Settings.generation_config greedy: a continuation under what transformers' generate applies
from the checkpoint's generation_config.json when it decodes greedily
(engine/layers/generation.py), against generate itself on tiny checkpoints and against each of
transformers' logits processors on random scores."""
import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, generate_each, generated_text, with_generation_config

from pope_fast.engine import Engine, Settings
from pope_fast.engine.layers.generation import GreedyRules

NEW = 10


def _processors(config: dict, prompt_length: int, eos: list[int]):
    """transformers' own processors for `config`, as _get_logits_processor builds them for
    a decoder-only model."""
    from transformers.generation import logits_process as lp

    made = []
    if config.get("repetition_penalty", 1.0) != 1.0:
        made.append(lp.RepetitionPenaltyLogitsProcessor(config["repetition_penalty"]))
    if config.get("no_repeat_ngram_size"):
        made.append(lp.NoRepeatNGramLogitsProcessor(config["no_repeat_ngram_size"]))
    if config.get("min_length"):
        made.append(lp.MinLengthLogitsProcessor(config["min_length"], eos))
    if config.get("min_new_tokens"):
        made.append(lp.MinNewTokensLengthLogitsProcessor(prompt_length, config["min_new_tokens"],
                                                         eos))
    if config.get("suppress_tokens"):
        made.append(lp.SuppressTokensLogitsProcessor(config["suppress_tokens"]))
    if config.get("begin_suppress_tokens"):
        made.append(lp.SuppressTokensAtBeginLogitsProcessor(config["begin_suppress_tokens"],
                                                            prompt_length))
    return made


CONFIGS = {
    "repetition-penalty": {"repetition_penalty": 1.3},
    "penalty-below-one": {"repetition_penalty": 0.8},
    "no-repeat-bigram": {"no_repeat_ngram_size": 2},
    "no-repeat-unigram": {"no_repeat_ngram_size": 1},
    "min-lengths": {"min_length": 9, "min_new_tokens": 3},
    "suppressed": {"suppress_tokens": [5, 17], "begin_suppress_tokens": [3, 11]},
    "all": {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "min_new_tokens": 2,
            "suppress_tokens": [4]},
}


@pytest.mark.parametrize("read_prompt", [True, False], ids=["input-ids", "inputs-embeds"])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_each_step_chooses_what_transformers_processors_leave_highest(config, read_prompt):
    """Random scores over a 23-token vocabulary with ties and negative values, favouring the
    prompts' ids and the eos ids, prompts of two lengths that repeat ids: at every one of 12 steps,
    the token GreedyState chooses is the argmax of the scores transformers' processors give, row by
    row (each row as generate decodes it alone), given the prompt as input_ids or as inputs_embeds
    (the processors then read the output only)."""
    torch.manual_seed(0)
    vocab, eos = 23, [2, 7]
    prompts = [[1, 5, 6, 5, 9, 3, 5, 6], [4, 4, 8, 12, 8]]
    rules = GreedyRules.of(config, "generation_config.json")
    assert rules.active
    state = rules.start(prompts, vocab, set(eos), "cpu", read_prompt)
    if read_prompt:
        histories = [torch.tensor([p]) for p in prompts]
        processors = [_processors(config, len(p), eos) for p in prompts]
    # generate given inputs_embeds: its input_ids start empty, min_length less
    # the embeddings' length
    else:
        histories = [torch.zeros(1, 0, dtype=torch.long) for _ in prompts]
        processors = [_processors({**config,
                                   "min_length": max(config.get("min_length", 0) - len(p), 0)},
                                  0, eos) for p in prompts]
    changed = 0
    for _ in range(12):
        logits = (torch.randn(2, vocab) * 2).round(decimals=1)
        # the prompts' tokens, the eos ids and one unread token often on top, near each other:
        # the rules bite
        logits[:, [2, 5, 6, 7, 8, 12]] += 4
        logits[:, 10] += 5
        ours = state.choose(logits)
        for row in range(2):
            scores = logits[row:row + 1].clone()
            for processor in processors[row]:
                scores = processor(histories[row], scores)
            assert int(ours[row]) == int(scores.argmax()), (config, row, histories[row].tolist())
            changed += int(scores.argmax()) != int(logits[row].argmax())
            histories[row] = torch.cat([histories[row], ours[row].view(1, 1)], dim=1)
        state.push(ours)
    assert changed, "no step's choice differs from the plain argmax: the rules went untested"


def test_fields_the_engine_does_not_compute_are_refused_by_name():
    for field, value in (("sequence_bias", [[[5], 2.0]]), ("bad_words_ids", [[5]]),
                         ("forced_eos_token_id", 2),
                         ("exponential_decay_length_penalty", [3, 1.1]), ("guidance_scale", 1.5)):
        with pytest.raises(ValueError,
                           match=f"^gc.json: {field} .* changes generate's greedy choice"):
            GreedyRules.of({field: value}, "gc.json")
    assert not GreedyRules.of({"guidance_scale": 1.0, "temperature": 0.1, "top_k": 1,
                               "do_sample": True}, "g").active
    with pytest.raises(ValueError,
                       match="gc.json: repetition_penalty must be a positive number, not 0"):
        GreedyRules.of({"repetition_penalty": 0}, "gc.json")
    with pytest.raises(ValueError, match="gc.json: suppress_tokens must be a list of token ids"):
        GreedyRules.of({"suppress_tokens": "5"}, "gc.json")
    with pytest.raises(ValueError,
                       match="generation_config must be one of none, greedy, greedy_output, not "
                             "'yes'"):
        Settings(generation_config="yes")
    with pytest.raises(ValueError, match="repetition_penalty must be a positive number, not -1"):
        Settings(repetition_penalty=-1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llava", "qwen2_vl"])
def test_continuations_under_the_checkpoints_generation_config_are_generates(name, tiny, tmp_path):
    """A checkpoint whose generation_config.json sets a repetition penalty of 1.5 and bans
    repeated trigrams: with generation_config greedy each continuation is generate's (which reads
    that file), alone and batched, with and without a shared prefix; without it, or with the
    tool's own repetition_penalty 1.0 over a config that sets only the penalty, it is the plain
    argmax's, which differs."""
    family = REGISTRY[name]
    checkpoint = tiny.checkpoint(name)
    folder = with_generation_config(checkpoint, tmp_path / "rules",
                                     {"repetition_penalty": 1.5, "no_repeat_ngram_size": 3})
    penalty_only = with_generation_config(checkpoint, tmp_path / "penalty",
                                          {"repetition_penalty": 1.5})
    model, plain = (family.transformers_class().from_pretrained(str(f), dtype=torch.float32).eval()
                    for f in (folder, checkpoint))
    inputs_of = family.inputs_of(folder)
    probe = Engine.load(folder, Settings())
    image, questions = family.images[0], QUESTIONS[:2]
    prompts = [probe.prompt(q) for q in questions]
    theirs = generate_each(model, inputs_of, image, prompts, max_new_tokens=NEW)
    argmax = generate_each(plain, inputs_of, image, prompts, max_new_tokens=NEW)
    assert theirs != argmax
    for settings, folder_, expected in (
            (Settings(generation_config="greedy"), folder, theirs),
            (Settings(generation_config="greedy", prefix_reuse=False, batch_size=1), folder,
             theirs),
            (Settings(), folder, argmax),
            (Settings(generation_config="greedy", repetition_penalty=1.0), penalty_only, argmax)):
        engine = Engine.load(folder_, Settings(**{**settings.__dict__, "max_new_tokens": NEW}),
                             readouts="string_parse")
        answers = engine.answer(image, questions)
        assert [a.decoded for a in answers] == [generated_text(engine, t)
                                                for t in expected], settings


@pytest.mark.slow
def test_greedy_output_is_generate_given_inputs_embeds(tiny, tmp_path):
    """LLaVA's and LLaVA-NeXT's own generate hand transformers' generate the prompt as
    inputs_embeds alone, so a repetition penalty reads the output only: with penalty 0.3 (which
    favours what was read), generation_config greedy is generate over input_ids (the prompt's
    tokens favoured) and greedy_output is generate over the same prompt's embeddings (the output's
    own tokens favoured), which differ."""
    family = REGISTRY["llava"]
    folder = with_generation_config(tiny.checkpoint("llava"), tmp_path / "favour",
                                    {"repetition_penalty": 0.3})
    model = family.transformers_class().from_pretrained(str(folder), dtype=torch.float32).eval()
    probe = Engine.load(folder, Settings())
    image, questions = family.images[0], QUESTIONS[:2]
    ids = generate_each(model, family.inputs_of(folder), image,
                        [probe.prompt(q) for q in questions], max_new_tokens=NEW)
    embeds = []
    for q in questions:
        inputs = family.inputs_of(folder)(image, probe.prompt(q))
        with torch.no_grad():
            embedded = model.get_input_embeddings()(inputs["input_ids"])
            embeds.append(model.generate(inputs_embeds=embedded,
                                         pixel_values=inputs["pixel_values"],
                                         attention_mask=inputs["attention_mask"],
                                         max_new_tokens=NEW, do_sample=False)[0].tolist())
    assert ids != embeds
    for how, expected in (("greedy", ids), ("greedy_output", embeds)):
        engine = Engine.load(folder, Settings(generation_config=how, max_new_tokens=NEW),
                             readouts="string_parse")
        assert [a.decoded for a in engine.answer(image, questions)] == [generated_text(engine, t)
                                                                        for t in expected]


@pytest.mark.slow
def test_a_checkpoint_that_sets_what_the_engine_does_not_compute_is_refused_at_load(tiny, tmp_path):
    folder = with_generation_config(tiny.checkpoint("llava"), tmp_path / "bias",
                                    {"sequence_bias": [[[5], 2.0]]})
    with pytest.raises(ValueError,
                       match=r"generation_config.json: sequence_bias .* changes generate's greedy"):
        Engine.load(folder, Settings(generation_config="greedy"), readouts="string_parse")
    Engine.load(folder, Settings(), readouts="string_parse")  # not applied: nothing to refuse
    # no continuation
    Engine.load(folder, Settings(generation_config="greedy"), readouts="template_aware")


def test_the_rules_bite_only_while_they_can_change_a_choice():
    """The minimum lengths hold while the row (or its prompt and output) is short,
    begin_suppress_tokens at the first new token only; a penalty, an n-gram ban or suppressed tokens
    at every step. Where none bites, the engine takes the fused argmax."""
    tokens = torch.tensor([9, 9])
    lengths = GreedyRules(min_length=8, min_new_tokens=2).start([[1] * 5, [1] * 3], 20, {2}, "cpu")
    bites = []
    for _ in range(6):
        bites.append(lengths.bites())
        lengths.push(tokens)
    # the 3-token prompt reaches 8 after 5 new tokens
    assert bites == [True, True, True, True, True, False]
    begin = GreedyRules(begin_suppress_tokens=(3,)).start([[1]], 20, {2}, "cpu")
    assert begin.bites() and (begin.push(tokens[:1]) or not begin.bites())
    for rules in (GreedyRules(repetition_penalty=1.1), GreedyRules(no_repeat_ngram_size=2),
                  GreedyRules(suppress_tokens=(4,))):
        state = rules.start([[1]], 20, {2}, "cpu")
        state.push(tokens[:1])
        assert state.bites()
    assert not GreedyRules().active and GreedyRules(min_new_tokens=1).active


# --- issue 49: every field read from generation_config.json is checked where it enters
# ------------------------------

@pytest.mark.parametrize("eos", [[2, "x"], [[2]], "2", [], True, -1, 2.0],
                         ids=["list-with-text", "nested", "text", "empty", "bool", "negative",
                              "float"])
def test_an_eos_token_id_that_is_no_token_id_is_one_line_naming_the_field(eos, tmp_path):
    import json

    from pope_fast.engine.utils.loader import CheckpointError, generation_config

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos,
                                                                 "bos_token_id": 1}))
    with pytest.raises(CheckpointError) as refused:
        generation_config(tmp_path)
    assert str(refused.value) == (f"{tmp_path / 'generation_config.json'}: eos_token_id must be a "
                                  f"token id or a non-empty list of them, not {eos!r}")


def test_eos_token_ids_that_are_token_ids_are_the_stop_ids(tmp_path):
    import json

    from pope_fast.engine.utils.loader import generation_config, stop_ids

    class Tokenizer:
        eos_token_id = 9

    for eos, stops in ((2, {2}), ([2, 7], {2, 7}), (None, {9})):
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
        assert stop_ids(generation_config(tmp_path), Tokenizer()) == stops


@pytest.mark.parametrize("field, value, fault", [
    ("no_repeat_ngram_size", 1.5,
     "must be an integer, not 1.5 (transformers' generate refuses another number)"),
    ("no_repeat_ngram_size", 2.0,
     "must be an integer, not 2.0 (transformers' generate refuses another number)"),
    ("min_length", 3.5,
     "must be an integer, not 3.5 (transformers' generate refuses another number)"),
    ("min_new_tokens", 1.25,
     "must be an integer, not 1.25 (transformers' generate refuses another number)"),
    ("repetition_penalty", 2,
     "must be a float, not 2 (transformers' generate refuses an integer: write 2.0)"),
    ("no_repeat_ngram_size", "2", "must be a non-negative number, not '2'"),
],
ids=["ngram-fraction", "ngram-float", "min-length", "min-new-tokens", "penalty-int", "ngram-text"])
def test_a_rule_of_a_type_transformers_refuses_is_refused_naming_it(field, value, fault):
    with pytest.raises(ValueError) as refused:
        GreedyRules.of({field: value}, "gc.json")
    assert str(refused.value) == f"gc.json: {field} {fault}"


def test_a_rule_transformers_does_not_apply_is_not_refused_for_its_type():
    """0.0 makes no processor (generate applies a length or n-gram rule above 0), an integer penalty
    of 1 neither."""
    assert not GreedyRules.of({"no_repeat_ngram_size": 0.0, "min_length": 0.0,
                               "repetition_penalty": 1}, "g").active
    assert GreedyRules.of({"no_repeat_ngram_size": 3, "repetition_penalty": 1.5}, "g") == \
        GreedyRules(repetition_penalty=1.5, no_repeat_ngram_size=3)
