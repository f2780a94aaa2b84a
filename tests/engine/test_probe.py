"""The image-attention probe against transformers' eager attention (output_attentions=True): at the
answer position, per layer and head, the attention mass on the image tokens, for every family, with
and without prefix reuse and at several batch sizes."""
import json

import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS, synthetic_image

from pope_fast.engine import Engine, ImagePrompts, Settings

pytestmark = pytest.mark.slow  # the engine on tiny checkpoints, against transformers

IMAGES = [synthetic_image(i + 51, size) for i, size in enumerate([(90, 40), (60, 60)])]
# the battery's test_probe checks the rest
FAMILIES = ["llava", "llava_next", "instructblip", "qwen2_vl", "qwen2_5_vl"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_oracle(request, tiny):
    """(family, the registry's checkpoint, {(image, question): eager image
    attention [layers, heads]}), transformers' eager model fed the family's
    reference inputs (registry.Family.inputs_of)."""
    from transformers import AutoModelForImageTextToText

    family = request.param
    checkpoint = tiny.checkpoint(family)
    model = AutoModelForImageTextToText.from_pretrained(str(checkpoint), dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    make_inputs = REGISTRY[family].inputs_of(checkpoint)
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    image_id = model.config.image_token_id
    out = {}
    for i, image in enumerate(IMAGES):
        for q in QUESTIONS[:3]:
            inputs = make_inputs(image, engine.prompt(q))
            with torch.no_grad():
                result = model(**inputs, output_attentions=True)
            attentions = result.attentions if getattr(result, "attentions", None) is not None \
                else result.language_model_outputs.attentions
            image_keys = inputs["input_ids"][0] == image_id
            assert int(image_keys.sum()) > 0
            out[i, q] = torch.stack([a[0, :, -1, image_keys].sum(-1) for a in attentions])  # [L, H]
    return family, checkpoint, out


# Six rows (two images, three questions): reuse-b5 runs a batch of five rows over both images'
# prefixes and one of a single row (what a batch size of 1 runs), whole-b2 three batches of
# two whole prompts.
@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 5), (False, 2)],
                         ids=["reuse-b5", "whole-b2"])
def test_probe_equals_eager_attention_on_the_image_span(family_oracle, prefix_reuse, batch_size):
    family, checkpoint, oracle = family_oracle
    engine = Engine.load(checkpoint, Settings(probe="image-attention", prefix_reuse=prefix_reuse,
                                              batch_size=batch_size), readouts="template_aware")
    items = [ImagePrompts(engine.features(image), [engine.prompt(q) for q in QUESTIONS[:3]])
             for image in IMAGES]
    for i, results in enumerate(engine.run_images(items)):
        for q, result in zip(QUESTIONS[:3], results):
            ours = torch.tensor(result.probe["image_attention_heads"])
            theirs = oracle[i, q]
            assert ours.shape == theirs.shape
            worst = float((ours - theirs).abs().max())
            assert worst <= 1e-5, f"{family} image {i} {q!r}: off by {worst:.2e}"
            assert result.probe["image_attention"] == pytest.approx(theirs.mean(-1).tolist(),
                                                                    abs=1e-5)
            # neither all nor none: a real check
            assert 0.0 < float(theirs.min()) and float(theirs.max()) < 1.0


def test_probe_reaches_the_records(tiny, tmp_path):
    from pope_fast.sweep import run_plain
    from tinymodels import write_pope_set

    from pope_fast.readout import load_questions

    checkpoint = tiny.checkpoint("llava")
    images, files = write_pope_set(tmp_path / "pope", n_images=2, splits=("random",))
    engine = Engine.load(checkpoint, Settings(probe="image-attention"),
                         readouts="template_aware,legacy_2tok")
    run_plain(engine, load_questions(files[0]), images, tmp_path / "run")
    records = [json.loads(line)
               for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert records and all(len(r["image_attention"]) == engine.model.lm.dims.num_layers
                           for r in records)
    # the questions attend differently
    assert len({tuple(r["image_attention"]) for r in records}) > 1
    plain = Engine.load(checkpoint, Settings(), readouts="template_aware,legacy_2tok")
    run_plain(plain, load_questions(files[0]), images, tmp_path / "plain")
    without = [json.loads(line)
               for line in (tmp_path / "plain" / "records.jsonl").read_text().splitlines()]
    assert all("image_attention" not in r for r in without)
    # the probe reads the attention, it does not change it
    assert [r["candidate_logits"] for r in records] == [r["candidate_logits"] for r in without]


def test_heads_reach_the_records_on_request(tiny, tmp_path):
    from pope_fast.sweep import run_plain
    from tinymodels import write_pope_set

    from pope_fast.readout import load_questions

    checkpoint = tiny.checkpoint("llava")
    images, files = write_pope_set(tmp_path / "pope", n_images=1, splits=("random",))
    engine = Engine.load(checkpoint, Settings(probe="image-attention:heads"),
                         readouts="template_aware")
    run_plain(engine, load_questions(files[0]), images, tmp_path / "run")
    records = [json.loads(line)
               for line in (tmp_path / "run" / "records.jsonl").read_text().split("\n") if line]
    for r in records:
        heads = torch.tensor(r["image_attention_heads"])
        assert heads.shape == (engine.model.lm.dims.num_layers, engine.model.lm.dims.num_heads)
        assert r["image_attention"] == pytest.approx(heads.mean(-1).tolist(), abs=1e-6)
