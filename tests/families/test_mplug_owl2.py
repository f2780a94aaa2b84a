"""mPLUG-Owl2 against its upstream implementation: the fixture in ../shared/fixtures/mplug_owl2_tiny
holds a tiny random checkpoint in the real layout and what X-PLUG's code (transformers 4.31)
computes on it: the engine's ids, pixels, candidate logits, argmax and greedy continuations must be
upstream's."""
import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from click.testing import CliRunner
from tinymodels import generated_text, worst_difference

from pope_fast.cli import main
from pope_fast.engine import Engine, ImagePrompts, Settings
from pope_fast.engine.layers.ops import Rotary, make_linear
from pope_fast.engine.layers.attention import causal_attention
from pope_fast.engine.layers.decoder import DecoderLayer
from pope_fast.engine.models.mplug_owl2 import IMAGE_TOKEN_INDEX, MplugOwl2Model
from pope_fast.engine.models.mplug_owl2_nets import lm_expected_shapes


@pytest.fixture(scope="module")
def fixture(shared):
    root = shared / "fixtures/mplug_owl2_tiny"
    expected = json.loads((root / "expected.json").read_text())
    return root, expected["cases"], load_file(str(root / "expected_logits.safetensors"))["logits"]


@pytest.fixture(scope="module")
def owl(fixture):
    return MplugOwl2Model(fixture[0] / "checkpoint", Settings())


@pytest.fixture(scope="module")
def features(owl, fixture):
    root, cases, _ = fixture
    names = sorted({c["image"] for c in cases})
    pixels = [owl.preprocess(Image.open(root / "images" / n)) for n in names]
    return dict(zip(names, owl.encode_images(pixels)))


def _linear(w, b=None):
    return make_linear(w, b, dtype=torch.float32, device=torch.device("cpu"), quantize=False,
                       keep_packed=False, kernels="torch")


def _stored_lm(root) -> dict[str, torch.Tensor]:
    """The checkpoint's language-model tensors under DecoderLM's names."""
    stored = load_file(str(root / "checkpoint/model.safetensors"))
    lm = {k[len("model."):]: v for k, v in stored.items() if k.startswith("model.")
          and not k.startswith(("model.vision_model.", "model.visual_abstractor."))
          and "rotary_emb" not in k}
    return {**lm, "lm_head.weight": stored["lm_head.weight"]}


@pytest.mark.slow
def test_input_ids_equal_upstreams(owl, fixture):
    _, cases, _ = fixture
    for case in cases:
        ids = owl.prompt_ids(case["prompt"], 65)
        at = case["input_ids"].index(IMAGE_TOKEN_INDEX)
        assert ids == case["input_ids"][:at] + [IMAGE_TOKEN_INDEX] * 65 + case["input_ids"][at + 1:]
    # "USER: " ends in ▁
    assert owl.prompt_ids(cases[0]["prompt"], 1)[3:6] == [29901, 29871, IMAGE_TOKEN_INDEX]


def test_prompt_ids_follow_tokenizer_image_token(owl):
    """The upstream conversation template's prompt; and a prompt opening with the image, where
    upstream keeps the BOS of the text after it (its first chunk is empty, so nothing is dropped).
    """
    ids = owl.prompt_ids("USER: <|image|>Is there a dog in the image? ASSISTANT:", 2)
    assert ids == [1, 3148, 1001, 29901, 29871, IMAGE_TOKEN_INDEX, IMAGE_TOKEN_INDEX,
                   1317, 727, 263, 11203, 297, 278, 1967, 29973, 319, 1799, 9047, 13566, 29901]
    assert owl.prompt_ids("<|image|>\nIs there a dog?", 1) == [IMAGE_TOKEN_INDEX, 1, 29871, 13,
                                                               3624, 727, 263, 11203, 29973]
    with pytest.raises(ValueError, match="exactly one"):
        owl.prompt_ids("USER: <|image|><|image|>", 1)


def test_tokenizer_encodes_as_sentencepiece(owl, shared):
    """The 46 llama.cpp golden cases (ids of the real LLaMA-2 tokenizer, sentencepiece semantics):
    all equal; transformers 5's own LlamaTokenizer misses those that open with a space."""
    from transformers import AutoTokenizer

    golden = shared / "tokenizers/golden/ggml-vocab-llama-spm.gguf"
    inp = golden.with_suffix(".gguf.inp").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")
    out = golden.with_suffix(".gguf.out").read_text()
    expected = [[int(i) for i in line.split()] for line in out.splitlines()]
    pairs = list(zip(texts, expected))
    assert len(pairs) == 46
    assert [owl.tokenizer.encode(t, add_special_tokens=False) for t, _ in pairs] \
        == [ids for _, ids in pairs]
    plain = AutoTokenizer.from_pretrained(str(owl.folder))
    assert sum(plain.encode(t, add_special_tokens=False) != ids for t, ids in pairs) > 0


def test_pixels_equal_upstreams(owl, fixture):
    root, cases, _ = fixture
    for case in cases[::4]:  # one case per image
        pixels = owl.preprocess(Image.open(root / "images" / case["image"]))
        assert [1, *pixels.shape] == case["pixel_shape"]
        assert float(np.asarray(pixels).astype("float64").sum()) == case["pixel_sum"]
    assert owl._fast_pixels is not None  # the exact fast path passed its load-time check
    assert pixels.codes.dtype == np.uint8  # sent to the device as uint8, normalized there


@pytest.mark.slow
@pytest.mark.parametrize("prefix_reuse, batch_size", [(True, 1), (True, 7), (False, 1), (False, 7)],
                         ids=["reuse-b1", "reuse-b7", "whole-b1", "whole-b7"])
def test_engine_equals_upstream(fixture, prefix_reuse, batch_size):
    """Candidate logits of every readout's ids within 1e-4 (fp32), the argmax as first token, and
    the greedy continuation, for all 12 questions of the 3 images in one call (batches span images).
    """
    root, cases, expected = fixture
    settings = Settings(prefix_reuse=prefix_reuse, batch_size=batch_size, max_new_tokens=8)
    engine = Engine.load(root / "checkpoint", settings, readouts="all")
    assert engine.template.name == "mplug_owl2"
    names = list(dict.fromkeys(c["image"] for c in cases))
    items = [ImagePrompts(engine.features(root / "images" / n),
                          [c["prompt"] for c in cases if c["image"] == n])
             for n in names]
    results = [r for per_image in engine.run_images(items) for r in per_image]
    by_prompt = [c for n in names for c in cases if c["image"] == n]
    # one prefix per image: its text, then 65 slots
    before = by_prompt[0]["input_ids"].index(IMAGE_TOKEN_INDEX)
    assert engine.counts.prefix_tokens == (len(names) * (before + 65) if prefix_reuse else 0)
    for case, result in zip(by_prompt, results):
        theirs = expected[cases.index(case)]
        worst, at = worst_difference(result.candidate_logits, theirs)
        assert worst <= 1e-4, f"question {case['question_id']}: id {at} off by {worst:.2e}"
        assert result.first_token_id == case["argmax"]
        assert result.decoded == generated_text(engine, case["greedy_ids"])
    assert set(engine.readout.candidate_ids) >= {3582, 8241, 4874, 3869, 1217, 3782, 694, 1939}


@pytest.mark.slow
def test_eval_cli_on_the_fixture(fixture, tmp_path):
    """pope-fast eval: the family from config.json, its template, every readout, and a rerun
    resumes."""
    root, cases, _ = fixture
    args = ["eval", "--model", str(root / "checkpoint"), "--questions",
            str(root / "questions.jsonl"), "--images", str(root / "images"),
            "--out", str(tmp_path / "out"), "--device", "cpu",
            "--readouts", "all", "--dtype", "fp32", "--max-new-tokens", "8"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["model"]["family"] == "mplug_owl2" and meta["template"] == "mplug_owl2"
    # the slow tokenizer
    assert meta["token_strings"]["3869"] == "▁Yes" and meta["token_strings"]["1939"] == "▁No"
    assert set(meta["token_strings"]) == {str(i) for i in meta["candidate_ids"]}
    lines = (tmp_path / "out/records.jsonl").read_text().splitlines()
    records = {r["question_id"]: r for r in map(json.loads, lines)}
    assert len(records) == len(cases)
    for case in cases:
        record = records[case["question_id"]]
        assert record["first_token_id"] == case["argmax"]
        for i, v in case["legacy_logits"].items():
            assert abs(record["candidate_logits"][i] - v) <= 1e-4
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "0 unique prompts evaluated" in again.output


def test_multiway_routes_each_position(owl):
    """No mask is all text; an all-image mask is the plain layer built from multiway.1; a mixed mask
    takes each row from its own modality's layer."""
    multi = owl.lm.layers[0]
    weights = {k[len("layers.0."):]: v for k, v in _stored_lm(owl.folder.parent).items()
               if k.startswith("layers.0.")}
    as_text, as_image = ({k.replace(f".multiway.{w}", ""): v for k, v in weights.items()
                          if ".multiway." not in k or f".multiway.{w}." in k} for w in (0, 1))
    text_layer = DecoderLayer(owl.dims, as_text, _linear)
    image_layer = DecoderLayer(owl.dims, as_image, _linear)
    torch.manual_seed(0)
    x = torch.randn(2, 9, owl.dims.hidden_size)
    rotary = Rotary(owl.dims.head_dim, owl.dims.rope_theta, torch.device("cpu"))
    cos, sin = rotary.cos_sin(torch.arange(9), torch.float32)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 2:6] = True
    mask[1, 7:] = True

    def run(layer, **kw):
        q, k, v = layer.qkv(x, cos, sin, **kw)
        return layer.finish(x, causal_attention(q, k, v), **kw), k, v

    text, image, mixed = run(text_layer), run(image_layer), run(multi, image=mask)
    assert torch.equal(run(multi)[0], text[0])
    for ours, t, i in zip(mixed[1:], text[1:], image[1:]):  # K, V per row: the row's own projection
        torch.testing.assert_close(ours, torch.where(mask[:, None, :, None], i, t), rtol=0,
                                   atol=1e-6)
    # the two copies differ, so routing shows
    assert not torch.allclose(text[1], image[1], atol=1e-3)
    all_image = run(multi, image=torch.ones(2, 9, dtype=torch.bool))
    torch.testing.assert_close(all_image[0], image[0], rtol=0, atol=1e-5)


def test_lm_expected_shapes_name_the_multiway_copies(owl):
    shapes = lm_expected_shapes(owl.dims)
    assert "layers.1.self_attn.k_proj.multiway.1.weight" in shapes
    assert "layers.0.input_layernorm.multiway.0.weight" in shapes
    assert "layers.0.self_attn.k_proj.weight" not in shapes \
        and "layers.0.self_attn.q_proj.weight" in shapes
    stored = _stored_lm(owl.folder.parent)
    assert set(shapes) == set(stored) \
        and all(tuple(stored[k].shape) == shape for k, shape in shapes.items())


@pytest.mark.slow
def test_nf4_quantizes_every_vision_linear_and_packed_equals_dequantized(fixture):
    """load_in_4bit quantizes every nn.Linear but lm_head: here the ViT's four per layer and the
    abstractor's seven per layer plus visual_fc (the patch convolution and the norms stay dense).
    Kept packed, the features equal those of the weights dequantized once at load."""
    from pope_fast.kernels import dequantize_nf4, quantize_nf4

    root, cases, _ = fixture
    stored = load_file(str(root / "checkpoint/model.safetensors"))
    nf4 = MplugOwl2Model(root / "checkpoint", Settings(quant="nf4", dtype="fp16"))
    packed = MplugOwl2Model(root / "checkpoint",
                            Settings(quant="nf4", dtype="fp16", nf4_weights="packed"))
    linears = {f"model.vision_model.encoder.layers.{i}.{n}": m
               for i, layer in enumerate(nf4.vision.layers) for n, m in layer.items()}
    linears.update({f"model.visual_abstractor.encoder.layers.{i}.crossattention.{n}": m
                    for i, layer in enumerate(nf4.abstractor.layers) for n, m in layer.items()})
    linears["model.visual_abstractor.visual_fc"] = nf4.abstractor.visual_fc
    assert len(linears) == len(list(nf4.vision.linears) + list(nf4.abstractor.linears)) \
        == 4 * 2 + 7 * 2 + 1
    for name, linear in linears.items():
        weight = stored[f"{name}.weight"].half()
        assert torch.equal(linear.weight,
                           dequantize_nf4(quantize_nf4(weight), torch.float16, backend="torch"))
        assert not torch.equal(linear.weight, weight)
        assert torch.equal(linear.bias, stored[f"{name}.bias"].half())
    assert all(m.packed is not None for m in packed.vision.linears)
    assert torch.equal(nf4.vision.dense["embeddings.patch_embed.weight"],
                       stored["model.vision_model.embeddings.patch_embed.weight"].half())
    pixels = [nf4.preprocess(Image.open(root / "images" / cases[0]["image"]))]
    ours = nf4.encode_images(pixels)[0]
    assert torch.equal(ours, packed.encode_images(pixels)[0])
    assert ours.shape == (65, nf4.dims.hidden_size) and ours.dtype == torch.float16 \
        and torch.isfinite(ours).all()


@pytest.mark.slow
def test_sharded_bin_copy_loads_to_the_same_model(owl, fixture, features, tmp_path):
    """Real checkpoints of this model ship as sharded pytorch_model-*.bin with an index."""
    root, cases, _ = fixture
    tensors = load_file(str(root / "checkpoint/model.safetensors"))
    # stored by upstream, skipped here
    assert any(k.endswith("rotary_emb.inv_freq") for k in tensors)
    folder = tmp_path / "bin"
    folder.mkdir()
    for f in (root / "checkpoint").iterdir():
        if f.suffix != ".safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    names, weight_map = sorted(tensors), {}
    for i in range(2):
        fname = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({n: tensors[n] for n in names[i::2]}, folder / fname)
        weight_map.update({n: fname for n in names[i::2]})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    copy = MplugOwl2Model(folder, Settings())
    ours, theirs = copy.lm.state_dict(), owl.lm.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    pixels = [copy.preprocess(Image.open(root / "images" / cases[0]["image"]))]
    assert torch.equal(copy.encode_images(pixels)[0], features[cases[0]["image"]])


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llava"}, r"model_type 'llava' is not 'mplug_owl2'"),
    ({"visual_config": {"visual_model": {"hidden_act": "swish"}}},
     r"hidden_act 'swish' is not supported"),
    ({"visual_config": {"visual_model": {"image_size": 224}}},
     r"grid_size 32 does not cover the ViT's 256 patches"),
    ({"visual_config": {"visual_abstractor": {"encoder_hidden_size": 48}}},
     r"encoder_hidden_size 48 differs"),
])
def test_bad_config_is_named(fixture, tmp_path, change, message):
    from pope_fast.engine import CheckpointError
    from pope_fast.engine.models.mplug_owl2 import parse_config

    config = json.loads((fixture[0] / "checkpoint/config.json").read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            for part, fields in value.items():
                config[key][part].update(fields)
        else:
            config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"{tmp_path}/config.json.*{message}"):
        parse_config(tmp_path)


def test_default_visual_config_is_the_7b_model(fixture, tmp_path):
    from pope_fast.engine.models.mplug_owl2 import parse_config

    config = json.loads((fixture[0] / "checkpoint/config.json").read_text())
    del config["visual_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, _, vision, abstractor = parse_config(tmp_path)
    assert (vision.hidden_size, vision.num_hidden_layers, vision.tokens) == (1024, 24, 1025)
    assert (abstractor.num_hidden_layers, abstractor.intermediate_size,
            abstractor.num_learnable_queries) == (6, 2816, 64)


@pytest.mark.slow
def test_nf4_decisions_equal_the_engine_on_the_dequantized_weights(fixture, tmp_path):
    """load_in_4bit as the paper ran it quantizes every Linear but lm_head (both multiway copies,
    the ViT, the abstractor); the NF4 engine (fp16) decides as the fp32 engine does on a copy of the
    checkpoint whose Linear weights are those NF4 values, dequantized bit for bit as bitsandbytes
    does."""
    from safetensors.torch import save_file

    from pope_fast.kernels import dequantize_nf4, quantize_nf4
    from pope_fast.readout import LOGIT_READOUTS

    root, cases, _ = fixture
    stored = load_file(str(root / "checkpoint/model.safetensors"))
    linear = [k for k, v in stored.items() if v.dim() == 2 and k.endswith(".weight")
              and not k.endswith(("embed_tokens.weight", "lm_head.weight"))]
    assert sum(".multiway." in k for k in linear) == 2 * 2 * 2  # k/v_proj, both copies, two layers
    copy = tmp_path / "dequantized"
    copy.mkdir()
    for f in (root / "checkpoint").iterdir():
        if f.suffix != ".safetensors":
            (copy / f.name).write_bytes(f.read_bytes())
    save_file({k: dequantize_nf4(quantize_nf4(v.half()), torch.float16, backend="torch").float()
               if k in linear else v for k, v in stored.items()}, str(copy / "model.safetensors"))
    prompts = {n: [c["prompt"] for c in cases if c["image"] == n]
               for n in dict.fromkeys(c["image"] for c in cases)}
    decisions = []
    for folder, settings in ((root / "checkpoint", Settings(quant="nf4", dtype="fp16")),
                             (copy, Settings())):
        engine = Engine.load(folder, settings, readouts=",".join(LOGIT_READOUTS))
        items = [ImagePrompts(engine.features(root / "images" / n), ps)
                 for n, ps in prompts.items()]
        decisions.append([(r.first_token_id, engine.readout.decide(r))
                          for rs in engine.run_images(items) for r in rs])
    assert len(decisions[0]) == len(cases) and decisions[0] == decisions[1]
