"""Qwen3-VL-MoE's quirks (Qwen3-VL with a mixture of experts on layers 0 and 2 of 3, a dense MLP on
layer 1 as mlp_only_layers makes it): its battery against Qwen3VLMoeForConditionalGeneration is
test_battery's qwen3_vl_moe cases; here the layer plan, the published checkpoints' expert layout,
batch-invariant routing, the premise the NF4 check rests on, and what a config with no such routing
gets."""
import json
import shutil

import pytest
import torch
from registry import REGISTRY
from safetensors.torch import load_file, save_file
from tinymodels import QUESTIONS, bnb_nf4_oracle, make_tiny_qwen3_vl_moe

from pope_fast.engine import Engine, Settings
from pope_fast.engine.layers.moe import ROUTER_ROWS

FAMILY = "qwen3_vl_moe"  # whose checkpoint, model and oracle tests/families/conftest.py gives
pytestmark = pytest.mark.slow  # tiny Qwen3-VL-MoE checkpoints, loaded and run


def test_sparse_layers_and_flops_follow_the_config(engine, tiny):
    """The layers transformers builds a sparse block on are ours; a token's FLOPs count its k
    experts' width."""
    dims = engine.model.lm.dims
    layers = tiny.model("qwen3_vl_moe").model.language_model.layers
    theirs = [type(layer.mlp).__name__ for layer in layers]
    assert theirs == ["Qwen3VLMoeTextSparseMoeBlock", "Qwen3VLMoeTextMLP",
                      "Qwen3VLMoeTextSparseMoeBlock"]
    assert [dims.sparse(i) for i in range(3)] == [True, False, True]
    assert (dims.experts, dims.experts_per_token, dims.expert_size) == (6, 2, 48)
    assert [dims.mlp_width(i) for i in range(3)] == [2 * 48, 128, 2 * 48]
    assert [layer.experts is not None for layer in engine.model.lm.layers] == [True, False, True]


def test_experts_stored_as_published_load_the_same(checkpoint, tmp_path):
    """The published checkpoints store the fused experts with their last two axes swapped ([E, H,
    2I], [E, I, H]; transformers' conversion_mapping transposes them on load): the same weights in
    that layout give the same tensors and the same answers, bit for bit."""
    published = tmp_path / "published"
    shutil.copytree(checkpoint, published)
    [weights_file] = published.glob("*.safetensors")
    tensors = load_file(weights_file)
    swapped = [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(swapped) == 4
    tensors.update({k: tensors[k].transpose(1, 2).contiguous() for k in swapped})
    save_file(tensors, weights_file, metadata={"format": "pt"})
    image = REGISTRY[FAMILY].images[0]
    runs = []
    for folder in (checkpoint, published):
        engine = Engine.load(folder, Settings(), readouts="template_aware")
        runs.append((engine, engine.answer(image, QUESTIONS[:2])))
    (ours, first), (theirs, second) = runs
    for a, b in zip(ours.model.lm.layers, theirs.model.lm.layers):
        if a.experts is not None:
            assert torch.equal(a.experts.gate_up, b.experts.gate_up) \
                and torch.equal(a.experts.down, b.experts.down)
    assert [x.candidate_logits for x in first] == [x.candidate_logits for x in second]


def test_a_tokens_routing_does_not_depend_on_its_batch(engine):
    """Experts and their weights of a token alone, among a few and among more than one router block:
    the same bits."""
    experts = engine.model.lm.layers[0].experts
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randn((3 * ROUTER_ROWS + 5, experts.router.shape[1]), generator=gen)
    weights, chosen = experts.route(tokens)
    for i in (0, 7, ROUTER_ROWS + 1, len(tokens) - 1):
        for batch in (tokens[i:i + 1], tokens[max(0, i - 3):i + 1]):
            w, e = experts.route(batch)
            assert torch.equal(e[-1], chosen[i]) and torch.equal(w[-1], weights[i])


def test_the_nf4_checks_routing_is_far_from_a_tie(tiny):
    """test_battery's NF4 check holds the engine's candidate logits within a few fp16 steps of
    transformers'; under a mixture of experts that needs every token's k-th expert clearly ahead of
    its k+1-th in the router's logits (a swap moves the output by a whole expert's share, far more
    than a rounding step). On its checkpoint and images it is, by this margin."""
    family = REGISTRY[FAMILY]
    gaps = []

    # out[0]: the router's fp16 logits; the softmax keeps their order
    def record(module, args, out):
        logits = out[0].float().sort(dim=-1, descending=True).values
        second, third = logits[:, 1], logits[:, 2]  # k = 2
        # fp16's there
        spacing = 2.0 ** (torch.floor(torch.log2(torch.maximum(second.abs(), third.abs()))) - 10)
        gaps.append(float(((second - third) / spacing).min()))

    checkpoint = tiny.root / "nf4_premise"
    if not checkpoint.exists():
        make_tiny_qwen3_vl_moe(checkpoint, **family.nf4.make)
    # the model the NF4 check compares with
    model = bnb_nf4_oracle(family.transformers_class(), checkpoint)
    hooks = [layer.mlp.gate.register_forward_hook(record)
             for layer in model.model.language_model.layers if hasattr(layer.mlp, "gate")]
    engine = Engine.load(checkpoint, Settings(), readouts="template_aware")
    inputs_of = family.inputs_of(checkpoint)
    with torch.no_grad():
        for index in family.nf4.images:
            inputs = inputs_of(family.images[index], engine.prompt(QUESTIONS[0]))
            model(**{**inputs, "pixel_values": inputs["pixel_values"].half()})
    for hook in hooks:
        hook.remove()
    # in fp16 steps of the logits: the engine and transformers differ by about one step where their
    # sums run in another order (measured: one step of the first layer's input at the token that
    # swapped with the model's own router), so at least two steps apart no token can swap
    assert gaps and min(gaps) >= 2, min(gaps)


def test_a_config_with_no_such_routing_is_refused(checkpoint, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["num_experts_per_tok"] = 7
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError,
                       match=r"config.json: 7 experts per token of 6, decoder_sparse_step 1: "
                             r"no such routing"):
        Engine.load(folder, Settings(), readouts="template_aware")
