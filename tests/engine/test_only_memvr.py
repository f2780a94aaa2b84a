"""ONLY and MemVR (engine/methods/only.py, memvr.py) against transcriptions of their official code's
arithmetic on transformers' classes (tests/methodchecks.py: only_oracle, memvr_oracle), on the
registry's tiny LLaVA-1.5 and Qwen2.5-VL, each beside the baseline in one paired run (three
questions, two to a batch: rows of unequal length)."""
import math

import pytest
import torch
from methodchecks import memvr_oracle, only_combined, only_oracle
from tinymodels import QUESTIONS

from pope_fast.engine import Engine, Settings, load_engine
from pope_fast.engine.methods import parse_method

pytestmark = pytest.mark.slow  # the engine and transformers' classes on tiny checkpoints

MEMVR = "memvr:starting=-1,ending=1,ratio=0.3,threshold="


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
    image, questions = family.images[0], QUESTIONS[:3]
    engine = Engine.load(checkpoint, Settings(batch_size=2), readouts="template_aware")
    prompts = [engine.prompt(q) for q in questions]
    inputs = [family.inputs_of(checkpoint)(image, p) for p in prompts]
    passes = [only_oracle(model, x, 0) for x in inputs]
    tvds = sorted(p[2] for p in passes)
    # between two questions' total variations: both of ONLY's branches checked
    gamma = (tvds[0] + tvds[-1]) / 2
    assert tvds[0] < gamma < tvds[-1]
    methods = [parse_method(s) for s in ("none", f"only:gamma={gamma}", MEMVR + "0")]
    out = engine.run_methods(engine.prepare([image]), [questions], methods)
    never = engine.run_methods(engine.prepare([image]), [questions],
                               [parse_method(MEMVR + "1")])["memvr"][0]
    for j, (x, (main, l_cd, tvd, v)) in enumerate(zip(inputs, passes)):
        _close(out["only"][0][j], only_combined(main, l_cd, tvd, 3.0, 1.0, 0.1, gamma), ("only", j))
        theirs, retraced = memvr_oracle(model, x, v, 0.3, 0.0, -1, 1)
        assert retraced == 1  # layer 0's exit triggers it, layer 1's MLP retraces
        _close(out["memvr"][0][j], theirs, ("memvr", j))
        plain = out["none"][0][j].candidate_logits
        assert (plain != out["only"][0][j].candidate_logits
                and plain != out["memvr"][0][j].candidate_logits)
        # no top-10 entropy exceeds 1: never retraced, the plain model run whole
        assert all(abs(value - plain[t]) <= 1e-5 for t, value in never[j].candidate_logits.items())
    # the refusal is the backend's, whatever the family (a Qwen processor loads slowly)
    if family.name != "llava":
        return
    backend = load_engine(checkpoint, Settings(), backend="transformers", readouts="template_aware")
    for name in ("only", "memvr:starting=-1,ending=1"):
        with pytest.raises(ValueError,
                           match=r"^method (only|memvr): the transformers backend cannot edit"):
            backend.check_method(parse_method(name))
