"""--record-mass: the answer position's log-sum-exp over the whole vocabulary, against torch's over
transformers' full logits on the registry's tiny LLaVA-1.5 (the engine's chunked gather and the
transformers backend), and a sweep's records without it as they were."""
import json
import math

import pytest
import torch
from tinymodels import QUESTIONS, write_pope_set

from pope_fast.engine import Engine, Settings, load_engine
from pope_fast.engine.methods import parse_method
from pope_fast.readout import load_questions
from pope_fast.sweep import run_paired

pytestmark = pytest.mark.slow  # the engine and transformers' class on a tiny checkpoint


@pytest.mark.parametrize("family", ["llava"], indirect=True)
def test_the_logsumexp_is_torchs_over_the_full_logits(family, tiny):
    checkpoint, model = tiny.checkpoint("llava"), tiny.model("llava")
    image, questions = family.images[0], QUESTIONS[:3]
    inputs_of = family.inputs_of(checkpoint)
    engine = Engine.load(checkpoint, Settings(record_mass=True, batch_size=2),
                         readouts="template_aware")
    backend = load_engine(checkpoint, Settings(record_mass=True), backend="transformers",
                          readouts="template_aware")
    for q, ours, theirs in zip(questions, engine.answer(image, questions),
                               backend.answer(image, questions)):
        with torch.no_grad():
            logits = model(**inputs_of(image, engine.prompt(q))).logits[0, -1]
            expected = float(torch.logsumexp(logits, dim=-1))
        assert (abs(ours.logsumexp - expected) <= 1e-5
                and abs(theirs.logsumexp - expected) <= 1e-5), (q, expected)
    lm = engine.model.lm
    hidden = torch.randn(3, lm.dims.hidden_size, generator=torch.Generator().manual_seed(0))
    # chunks of 5,000 rows, the last one short: the running log-sum-exp over them is the whole
    # vocabulary's (fp32 sums of 32,064 terms in another order: a relative 1e-6)
    assert lm.vocab_logits(hidden).shape[1] % 5000
    torch.testing.assert_close(lm.vocab_logsumexp(hidden, chunk=5000),
                               lm.vocab_logits(hidden).logsumexp(dim=-1), rtol=2e-6, atol=0)


@pytest.mark.parametrize("family", ["llava"], indirect=True)
def test_records_without_the_flag_are_unchanged_and_a_contrast_records_its_own(family, tiny,
                                                                               tmp_path):
    """The same paired sweep (none, vcd) with and without record_mass: without it no record and no
    meta.json holds a trace of it; with it every record holds logsumexp, and the records are
    otherwise the same bytes. VCD's is the log-sum-exp of its own combined logits: its candidates'
    probabilities under it sum to at most 1."""
    images, files = write_pope_set(tmp_path / "pope", n_images=1, questions_per_image=2,
                                   splits=("random",))
    questions = [q for f in files for q in load_questions(f)]
    methods = [parse_method("none"), parse_method("vcd")]
    runs = {}
    for mass in (False, True):
        engine = Engine.load(tiny.checkpoint("llava"), Settings(record_mass=mass, batch_size=2),
                             readouts="template_aware")
        run_paired(engine, questions, images, tmp_path / str(mass), methods)
        runs[mass] = {m.name: (tmp_path / str(mass) / m.name) for m in methods}
    for name in ("none", "vcd"):
        without = (runs[False][name] / "records.jsonl").read_text()
        with_mass = [json.loads(line)
                     for line in (runs[True][name] / "records.jsonl").read_text().splitlines()]
        assert "logsumexp" not in without
        meta = {mass: json.loads((runs[mass][name] / "meta.json").read_text())
                for mass in (False, True)}
        assert "record_mass" not in meta[False]["settings"]
        assert meta[True]["settings"]["record_mass"] is True
        assert all(math.isfinite(r["logsumexp"]) for r in with_mass)
        for r in with_mass:
            lse = r.pop("logsumexp")
            assert sum(math.exp(v - lse) for v in r["candidate_logits"].values()
                       if v is not None) <= 1 + 1e-6
        assert "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in with_mass) == without
