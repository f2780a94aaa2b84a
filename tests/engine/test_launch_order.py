"""A call's question batches are read back one behind: batch k's results are read (and built) only
after batch k + 1 is launched, so the device is never idle while the host builds them; the results
are those of reading each back at once."""
import pytest
from tinymodels import QUESTIONS, make_tiny_llava, synthetic_image

from pope_fast.engine import Engine, ImagePrompts, Settings

pytestmark = pytest.mark.slow  # the engine on a tiny checkpoint


def test_each_batch_is_read_back_after_the_next_is_launched(tmp_path, monkeypatch):
    engine = Engine.load(make_tiny_llava(tmp_path / "ckpt", builtin_tokenizer=True),
                         Settings(batch_size=2, max_new_tokens=2), readouts="template_aware")
    features = [engine.features(synthetic_image(seed)) for seed in (1, 2)]
    # 6 rows: 3 batches
    items = [ImagePrompts(f, [engine.prompt(q) for q in QUESTIONS[:3]]) for f in features]
    once = [[(r.first_token_id, r.candidate_logits) for r in rs] for rs in engine.run_images(items)]
    events = []
    runner, lm = engine.runner, engine.model.lm
    prefill, results = lm.prefill_suffix, runner.results
    monkeypatch.setattr(lm, "prefill_suffix",
                        lambda *a, **k: (events.append("launch"), prefill(*a, **k))[1])
    monkeypatch.setattr(runner, "results",
                        lambda launched: (events.append("read"), results(launched))[1])
    got = engine.run_images(items)
    assert events == ["launch", "launch", "read", "launch", "read", "read"]
    assert [[(r.first_token_id, r.candidate_logits) for r in rs] for rs in got] == once
    # two passes over one prefix (a paired run's): still one behind, pass by pass
    events.clear()
    engine.run_passes(items, [None, None])
    assert events == ["launch", "launch", "read"] + ["launch", "read"] * 4 + ["read"]
