"""ONLY and MemVR (engine/methods/only.py, memvr.py) against transcriptions of their official code's arithmetic on
transformers' classes (tests/methodchecks.py: only_oracle, memvr_oracle), on the registry's tiny LLaVA-1.5 and
Qwen2.5-VL, each beside the baseline in one paired run."""
import math

import pytest
import torch
from methodchecks import memvr_oracle, only_oracle
from tinymodels import QUESTIONS

from pope_fast.engine import Engine, Settings, load_engine
from pope_fast.engine.methods import parse_method

pytestmark = pytest.mark.slow  # the engine and transformers' classes on tiny checkpoints

ONLY_SPEC, MEMVR_SPEC = "only:gamma={gamma}", "memvr:starting=-1,ending=1,threshold={threshold},ratio=0.3"


def _close(ours, theirs, where):
    assert ours.first_token_id == int(theirs.argmax()), where
    for token, value in ours.candidate_logits.items():
        expected = float(theirs[token])
        assert value == expected if math.isinf(expected) else abs(value - expected) <= 1e-4, \
            (where, token, value, expected)


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"], indirect=True)
def test_only_and_memvr_match_their_official_arithmetic_on_transformers(family, tiny):
    checkpoint = tiny.checkpoint(family.name)
    model = family.transformers_class().from_pretrained(str(checkpoint), dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    inputs_of = family.inputs_of(checkpoint)
    images, questions = family.images[:2], QUESTIONS[:3]
    engine = Engine.load(checkpoint, Settings(batch_size=2), readouts="template_aware")
    prompts = [engine.prompt(q) for q in questions]
    # ONLY's branch by the total variation and MemVR's trigger by the entropy, each threshold between two questions'
    # values, so that both sides of each are checked
    tvds = sorted(only_oracle(model, inputs_of(images[0], p), 0, 3.0, 1.0, 0.1, 0.2)[2] for p in prompts)
    gamma = (tvds[0] + tvds[-1]) / 2
    assert tvds[0] < gamma < tvds[-1]
    methods = [parse_method("none"), parse_method(ONLY_SPEC.format(gamma=gamma))]
    memvr_at = {}
    for threshold in (0.0, 1.0):  # every prompt retraced, none retraced
        methods.append(parse_method(MEMVR_SPEC.format(threshold=threshold)))
    out = {}
    for m in methods[2:]:  # the two MemVR settings share a name: one run each
        out[m.settings["threshold"]] = engine.run_methods(engine.prepare(images), [questions] * 2, [methods[0], m])
    only = engine.run_methods(engine.prepare(images), [questions] * 2, methods[:2])
    for i, image in enumerate(images):
        for j, prompt in enumerate(prompts):
            inputs = inputs_of(image, prompt)
            _close(only["only"][i][j], only_oracle(model, inputs, 0, 3.0, 1.0, 0.1, gamma)[0], ("only", i, j))
            for threshold, run in out.items():
                theirs, memvr_at[threshold, i, j] = memvr_oracle(model, inputs, 0.3, threshold, -1, 1)
                _close(run["memvr"][i][j], theirs, ("memvr", threshold, i, j))
            plain = only["none"][i][j]
            assert plain.candidate_logits != only["only"][i][j].candidate_logits
            assert plain.candidate_logits != out[0.0]["memvr"][i][j].candidate_logits
            untouched = out[1.0]["memvr"][i][j].candidate_logits  # no entropy exceeds 1: the plain model, run whole
            assert all(abs(v - plain.candidate_logits[t]) <= 1e-5 for t, v in untouched.items())
    assert {memvr_at[t, i, j] for t, i, j in memvr_at} == {1, None}
    backend = load_engine(checkpoint, Settings(), backend="transformers", readouts="template_aware")
    for name in ("only", "memvr:starting=-1,ending=1"):
        with pytest.raises(ValueError, match=r"^method (only|memvr): the transformers backend cannot edit"):
            backend.check_method(parse_method(name))
