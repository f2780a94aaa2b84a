"""Qwen3.5's quirks (layers Gated DeltaNet, gated full attention, Gated DeltaNet; the stand-in
tokenizer at the published special ids): its battery against Qwen3_5ForConditionalGeneration is
test_battery's qwen3_5 cases; here the delta rule against transformers' torch versions (chunks,
right padding, one step), the carry of right-padded rows, the prompt with its empty think block, and
what the hybrid decoder refuses."""
import shutil
from functools import partial

import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS
from transformers import AutoTokenizer
from transformers.models.qwen3_5.modeling_qwen3_5 import (torch_chunk_gated_delta_rule,
                                                          torch_recurrent_gated_delta_rule)

from pope_fast.engine import Engine, Settings
from pope_fast.engine.layers.deltanet import (CHUNK, DeltaNetLayer, HybridDims, delta_chunks,
                                              delta_step)
from pope_fast.engine.layers.hybrid import refuse
from pope_fast.engine.layers.interventions import AttentionEdit
from pope_fast.engine.layers.ops import make_linear
from pope_fast.engine.synthetic.qwen3_5 import CHAT_TEMPLATE, SPECIAL_IDS
from pope_fast.readout.protocols import get_template

FAMILY = "qwen3_5"  # whose checkpoint, model and oracle tests/families/conftest.py gives


def _inputs(rows: int, length: int, seed: int):
    """q, k [B, S, 2, 8], v [B, S, 4, 6] (two value heads per key head), g <= 0, beta in (0, 1), a
    state."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(rows, length, 2, 8, generator=gen) for _ in range(2))
    v = torch.randn(rows, length, 4, 6, generator=gen)
    g = -torch.rand(rows, length, 4, generator=gen)
    beta = torch.rand(rows, length, 4, generator=gen)
    return q, k, v, g, beta, torch.randn(rows, 4, 8, 6, generator=gen)


@pytest.mark.parametrize("length", [1, 37, CHUNK, 2 * CHUNK + 11], ids=lambda n: f"S{n}")
def test_delta_chunks_is_transformers_chunked_rule(length):
    """Output and final state of the chunked rule against transformers' torch fallback, from a given
    state, over one, part of one, exactly one and several chunks."""
    q, k, v, g, beta, state = _inputs(2, length, seed=length)
    ours, ours_state = delta_chunks(q, k, v, g, beta, state)
    theirs, theirs_state = torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta,
                                                        initial_state=state,
                                                        output_final_state=True,
                                                        use_qk_l2norm_in_kernel=True)
    assert ours.shape == theirs.shape == v.shape
    assert (ours - theirs).abs().max() <= 1e-5 and (ours_state - theirs_state).abs().max() <= 1e-5


def test_delta_step_is_transformers_recurrent_rule():
    q, k, v, g, beta, state = _inputs(3, 1, seed=5)
    ours, ours_state = delta_step(q, k, v, g, beta, state)
    theirs, theirs_state = torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta,
                                                            initial_state=state,
                                                            output_final_state=True,
                                                            use_qk_l2norm_in_kernel=True)
    assert (ours - theirs).abs().max() <= 1e-5 and (ours_state - theirs_state).abs().max() <= 1e-5


def test_a_padded_position_leaves_the_state_as_it_is():
    """Right padding with beta = g = 0 (DeltaNetLayer.mix's mask): the state after a padded row is
    the state after its own tokens, whatever the padding holds, across a chunk boundary."""
    q, k, v, g, beta, state = _inputs(1, CHUNK + 20, seed=9)
    own = CHUNK - 5
    _, alone = delta_chunks(q[:, :own], k[:, :own], v[:, :own], g[:, :own], beta[:, :own], state)
    g, beta = g.clone(), beta.clone()
    g[:, own:], beta[:, own:] = 0, 0
    out, padded = delta_chunks(q, k, v, g, beta, state)
    assert torch.equal(padded, alone)
    assert torch.isfinite(out).all()


def test_the_default_prompt_closes_the_think_block():
    """The stand-in's template (the 9B's) opens a reasoning block by default; qwen3_5_chat renders
    it with enable_thinking=False, so the prompt ends after the empty block, where the answer
    begins."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    prompt = get_template("qwen3_5_chat").render(QUESTIONS[0], tok)
    assert prompt == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" + QUESTIONS[0]
                      + " Answer yes or no only.<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    qwen2_vl = get_template("qwen2_vl_chat").render(QUESTIONS[0], tok)
    assert qwen2_vl.endswith("<|im_start|>assistant\n<think>\n")


def test_attention_edits_and_the_probe_are_refused():
    with pytest.raises(NotImplementedError,
                       match="^AttentionEdit edits attention on every layer; .*DeltaNet"):
        refuse(AttentionEdit())
    with pytest.raises(NotImplementedError,
                       match="^probe image-attention reads attention on every layer"):
        refuse(None, probe=True)
    refuse(None)


@pytest.fixture
def ids_as_text(checkpoint, monkeypatch):
    """The stand-in tokenizer decodes the ids it has no word for (nearly all of its 248,320) to
    nothing, so that continuations compared as text would agree on any tokens: decoded here as the
    ids themselves."""
    cls = type(AutoTokenizer.from_pretrained(str(checkpoint)))
    monkeypatch.setattr(cls, "decode", lambda self, ids, **_: " ".join(str(int(i)) for i in ids))


def _new_tokens(generated: list[int], stop_ids) -> str:
    """generate's new tokens up to the first stop id, as the readouts' `decoded` holds them
    (ids_as_text)."""
    end = next((n for n, t in enumerate(generated) if t in stop_ids), len(generated))
    return " ".join(map(str, generated[:end]))


@pytest.mark.slow
def test_continuations_are_generates_token_for_token(checkpoint, oracle, ids_as_text):
    """The battery's continuation check, with every generated id told apart: from the prefix's
    carry, two questions in one batch; the stand-in's special tokens at the published ids."""
    engine = Engine.load(checkpoint, Settings(batch_size=2, max_new_tokens=4),
                         readouts="string_parse")
    tok = engine.model.tokenizer
    # the published ids
    assert {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_IDS} == SPECIAL_IDS
    questions = REGISTRY[FAMILY].oracle_questions
    for answer in engine.answer(REGISTRY[FAMILY].images[0], questions):
        expected = _new_tokens(oracle[0, answer.question][1], engine.model.stop_ids)
        assert expected and answer.decoded == expected, answer.question


def _deltanet_layer(seed: int) -> DeltaNetLayer:
    """A DeltaNet layer of random weights: width 16, 2 key heads of 8, 4 value heads of 6, a conv of
    4."""
    dims = HybridDims(vocab_size=8, hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=8, rms_eps=1e-6, rope_theta=1e4,
                      linear_layers=(True,), linear_k_heads=2, linear_v_heads=4, linear_k_dim=8,
                      linear_v_dim=6, conv_kernel=4)
    gen = torch.Generator().manual_seed(seed)
    weights = {name: torch.randn(shape, generator=gen) * 0.3
               for name, shape in dims.expected_shapes().items() if name.startswith("layers.0.")}
    weights = {name[len("layers.0."):]: w for name, w in weights.items()}
    return DeltaNetLayer(dims, weights,
                         partial(make_linear, bias=None, dtype=torch.float32,
                                 device=torch.device("cpu"), quantize=False, keep_packed=False,
                                 kernels="torch"))


def test_a_right_padded_row_carries_its_own_state_and_tail():
    """Rows of 9 and 5 tokens in one right-padded batch, from carries of their own: each row's
    output at its tokens, state and conv tail are those of the row alone (DeltaNetLayer.mix's mask
    and gather)."""
    layer = _deltanet_layer(3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 9, 16, generator=gen)
    state, tail = torch.randn(2, 4, 8, 6, generator=gen), torch.randn(2, 56, 3, generator=gen)
    out, states, tails = layer.mix(x, state, tail, torch.tensor([9, 5]))
    for row, length in enumerate((9, 5)):
        own, own_state, own_tail = layer.mix(x[row:row + 1, :length], state[row:row + 1],
                                             tail[row:row + 1])
        assert (out[row, :length] - own[0]).abs().max() <= 1e-5
        assert (states[row] - own_state[0]).abs().max() <= 1e-5 \
            and (tails[row] - own_tail[0]).abs().max() <= 1e-6
    assert not torch.allclose(states[1], layer.mix(x[1:], state[1:], tail[1:])[1][0], atol=1e-3)


@pytest.mark.slow
def test_a_template_that_thinks_regardless_runs_with_its_block_closed(checkpoint, tmp_path):
    """A template that opens a reasoning block even with enable_thinking=False: the default
    (thinking off, as the template allows) closes the block empty, so the prompt still ends where
    the answer begins."""
    folder = tmp_path / "thinking"
    shutil.copytree(checkpoint, folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n<think>\n")
    engine = Engine.load(folder, Settings())
    assert engine.meta()["thinking"] == {"mode": "off"}
    rendered = engine.template.render(QUESTIONS[0], engine.model.tokenizer)
    assert rendered.endswith("assistant\n<think>\n\n</think>\n\n")
