"""Settings.do_sample: a continuation drawn as transformers' generate(do_sample=True, temperature,
top_k, top_p) draws it (engine/layers/sampling.py), each question from a generator of its own: the
warpers against transformers' own on random scores, the draws against torch.multinomial under the
same seed, and on a tiny LLaVA against generate itself."""
import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, generated_text

from pope_fast.engine import Engine, Settings
from pope_fast.engine.layers.generation import GreedyRules
from pope_fast.engine.layers.sampling import SampledState, Warpers, row_seed

WARPERS = {"temperature": Warpers(temperature=0.7), "top-k": Warpers(top_k=5),
           "top-p": Warpers(top_p=0.8),
           "all": Warpers(temperature=1.3, top_k=9, top_p=0.6),
           "top-k-past-vocab": Warpers(top_k=40), "none": Warpers()}


def _theirs(warpers: Warpers):
    """transformers' warpers for these values, as _get_logits_processor builds
    them without beams."""
    from transformers.generation import logits_process as lp

    made = [lp.TemperatureLogitsWarper(warpers.temperature)] if warpers.temperature != 1.0 else []
    made += [lp.TopKLogitsWarper(warpers.top_k, min_tokens_to_keep=1)] if warpers.top_k else []
    made += [lp.TopPLogitsWarper(warpers.top_p, min_tokens_to_keep=1)] \
        if warpers.top_p < 1.0 else []
    return made


@pytest.mark.parametrize("warpers", WARPERS.values(), ids=WARPERS.keys())
def test_the_warpers_leave_the_scores_transformers_warpers_leave(warpers):
    """Random scores over 23 tokens with ties (rounded to one decimal) and a peak: bit for bit
    what transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper leave,
    in generate's order."""
    torch.manual_seed(3)
    for _ in range(5):
        scores = (torch.randn(4, 23) * 2).round(decimals=1)
        scores[:, 7] += 3
        expected = scores.clone()
        for warper in _theirs(warpers):
            expected = warper(torch.zeros(4, 0, dtype=torch.long), expected)
        assert torch.equal(warpers.warp(scores), expected)
        removed = int(torch.isinf(expected).sum())
        assert removed > 0 or warpers in (WARPERS["none"], WARPERS["temperature"],
                                          WARPERS["top-k-past-vocab"])


def test_each_row_draws_what_multinomial_draws_under_its_own_seed_whatever_its_batch():
    """A row's token at every step is torch.multinomial's over the softmax of its warped (and
    rule-processed) scores, drawn from a generator seeded with its seed alone, as
    torch.manual_seed(seed) then generate draws it; the same row in another batch, beside other
    rows, draws the same tokens."""
    torch.manual_seed(0)
    warpers, seeds = Warpers(temperature=0.8, top_k=12), [11, 12, 13]
    rules = GreedyRules(repetition_penalty=1.3)
    prompts = [[1, 5, 6], [4, 4, 8], [2, 9]]
    batch = SampledState(warpers, seeds, "cpu", rules.start(prompts, 23, {2}, "cpu"))
    alone = SampledState(warpers, seeds[1:2], "cpu", rules.start(prompts[1:2], 23, {2}, "cpu"))
    reference = torch.Generator().manual_seed(seeds[1])
    history = list(prompts[1])
    for _ in range(8):
        logits = torch.randn(3, 23)
        drawn, single = batch.choose(logits), alone.choose(logits[1:2])
        scores = torch.where(torch.isin(torch.arange(23), torch.tensor(history)),
                             torch.where(logits[1] < 0, logits[1] * 1.3, logits[1] / 1.3),
                             logits[1])
        expected = torch.multinomial(torch.softmax(warpers.warp(scores[None]), dim=-1), 1,
                                     generator=reference)
        assert int(drawn[1]) == int(single[0]) == int(expected)
        history.append(int(drawn[1]))
        batch.push(drawn)
        alone.push(single)


def test_a_questions_seed_follows_the_run_seed_its_image_and_its_prompt():
    base = row_seed(0, "img", (1, 2, 3))
    assert base == row_seed(0, "img", [1, 2, 3]) and 0 <= base < 2 ** 63
    assert len({base, row_seed(1, "img", (1, 2, 3)), row_seed(0, "other", (1, 2, 3)),
                row_seed(0, "img", (1, 2))}) == 4


def test_bad_sampling_settings_are_one_line_naming_the_setting():
    for kwargs, message in (({"temperature": 0.0},
                             "temperature must be a positive number, not 0.0"),
                            ({"top_k": -1},
                             r"top_k must be a non-negative integer \(0: no top-k\), not -1"),
                            ({"top_p": 1.5}, "top_p must be a number from 0 to 1, not 1.5"),
                            ({"do_sample": True, "num_beams": 2}, "do_sample with num_beams > 1")):
        with pytest.raises(ValueError, match=message):
            Settings(**kwargs)
    assert "seed" not in Settings(seed=5).to_json() and "do_sample" not in Settings().to_json()
    recorded = Settings(do_sample=True, seed=0, top_p=0.9).to_json()
    assert {k: v for k, v in recorded.items()
            if k in ("do_sample", "seed", "top_p", "top_k", "temperature")} == \
        {"do_sample": True, "seed": 0, "top_p": 0.9}


@pytest.mark.slow
def test_sampled_continuations_are_generates_under_each_questions_seed(tiny):
    """A tiny LLaVA: each question's sampled continuation is what torch.manual_seed(its row_seed)
    then transformers' generate(do_sample=True, ...) on that question alone draws, with and without
    warpers; the same batched or one at a time, with prefixes shared or not, and asked without the
    others; another run seed draws other texts."""
    family = REGISTRY["llava"]
    folder = tiny.checkpoint("llava")
    model = family.transformers_class().from_pretrained(str(folder), dtype=torch.float32).eval()
    image, questions = family.images[0], QUESTIONS[:3]
    new = 8
    for warpers in (Warpers(), Warpers(temperature=0.7, top_k=50, top_p=0.9)):
        sampled = dict(do_sample=True, temperature=warpers.temperature, top_k=warpers.top_k,
                       top_p=warpers.top_p, seed=4, max_new_tokens=new)
        texts = []
        for extra in ({}, {"batch_size": 1, "prefix_reuse": False}):
            engine = Engine.load(folder, Settings(**sampled, **extra), readouts="string_parse")
            texts.append([a.decoded for a in engine.answer(image, questions)])
        assert texts[0] == texts[1]
        # a question asked alone (a resume, another rank's share) draws what it drew
        # beside the others
        assert [a.decoded for a in engine.answer(image, questions[1:2])] == texts[0][1:2]
        prepared = engine.prepare([image])[0]
        features = engine.encode([prepared])[0]
        expected = []
        for q in questions:
            prompt = engine.prompt(q)
            torch.manual_seed(row_seed(4, prepared.key, engine.model.layout(prompt, features).ids))
            inputs = family.inputs_of(folder)(image, prompt)
            with torch.no_grad():
                out = model.generate(**inputs, do_sample=True, temperature=warpers.temperature,
                                     top_k=warpers.top_k, top_p=warpers.top_p, max_new_tokens=new)
            expected.append(generated_text(engine, out[0, inputs["input_ids"].shape[1]:].tolist()))
        assert texts[0] == expected, warpers
        other = Engine.load(folder, Settings(**{**sampled, "seed": 5}), readouts="string_parse")
        assert [a.decoded for a in other.answer(image, questions)] != texts[0]
