"""The engine with its Triton kernels (run by the interpreter on CPU) against the engine with the
torch references: the same switch the CUDA path takes, on a model small enough to interpret."""
import pytest
from tinymodels import QUESTIONS, make_tiny_llava, synthetic_image

from pope_fast.engine import Engine, Settings
from pope_fast.kernels import interpreter_on

pytestmark = [pytest.mark.skipif(not interpreter_on(),
                                 reason="needs TRITON_INTERPRET=1 before triton is imported"),
              # the engine on a tiny checkpoint, its kernels under the interpreter
              pytest.mark.slow]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # The built-in word-level tokenizer keeps the vocabulary (and the interpreted argmax) small.
    return make_tiny_llava(tmp_path_factory.mktemp("tiny_kernels") / "ckpt", vision_hidden=64,
                           builtin_tokenizer=True, vocab_size=160, seed=5)


@pytest.mark.parametrize("settings, tol", [
    (dict(), 1e-4),
    (dict(quant="nf4", dtype="fp16", nf4_weights="packed"), 2e-3),
], ids=["fp32-dense", "fp16-nf4-packed"])
def test_triton_kernels_agree_with_references(checkpoint, settings, tol):
    image = synthetic_image(7, (70, 50))
    readouts = "dynamic_single,template_aware,first_token,string_parse,pope_official,exact_match"
    ours = Engine.load(checkpoint,
                       Settings(kernels="triton", batch_size=4, max_new_tokens=6, **settings),
                       readouts=readouts)
    ref = Engine.load(checkpoint,
                      Settings(kernels="torch", batch_size=4, max_new_tokens=6, **settings),
                      readouts=readouts)
    got, want = ours.answer(image, QUESTIONS), ref.answer(image, QUESTIONS)
    for a, b in zip(got, want):
        worst = max(abs(a.candidate_logits[i] - b.candidate_logits[i]) for i in a.candidate_logits)
        assert worst <= tol, (a.question, worst)
        assert a.first_token_id == b.first_token_id
        assert a.decoded == b.decoded
        assert a.predictions == b.predictions


def test_fixed_ids_outside_a_small_vocabulary(checkpoint):
    """The legacy readouts' fixed ids (3582, 1217, ...) are not rows of a 160-row model."""
    # all: every readout this model has
    engine = Engine.load(checkpoint, Settings(max_new_tokens=6), readouts="all")
    assert ("legacy_2tok" not in engine.readout.token_sets
            and "template_aware" in engine.readout.token_sets)
    assert "legacy_2tok" not in engine.readout.names and "string_parse" in engine.readout.names
    assert max(engine.readout.candidate_ids) < engine.model.lm.dims.vocab_size
    with pytest.raises(ValueError,
                       match=r"readout legacy_2tok: ids \[1217, 3582\] are outside this model's "
                             r"vocabulary"):
        Engine.load(checkpoint, Settings(), readouts="legacy_2tok,template_aware")


def test_kernels_agree_with_references_under_an_attention_edit(checkpoint):
    """An amplification of the image attention and its probe: the prefix kernel's edit against the
    torch path's (the rows continue their image's prefix in both)."""
    from pope_fast.engine import ImageAttentionAmplification

    image = synthetic_image(9, (60, 60))
    edit = ImageAttentionAmplification(3.0, (0, 1))
    results = []
    for kernels in ("triton", "torch"):
        engine = Engine.load(checkpoint,
                             Settings(kernels=kernels, batch_size=4, probe="image-attention"),
                             readouts="dynamic_single,template_aware,first_token")
        results.append((engine.answer(image, QUESTIONS, intervention=edit),
                        engine.answer(image, QUESTIONS)))
    (kernel, kernel_plain), (torch_path, _) = results
    for a, b, plain in zip(kernel, torch_path, kernel_plain):
        assert max(abs(a.candidate_logits[i] - b.candidate_logits[i])
                   for i in a.candidate_logits) <= 1e-4
        assert a.first_token_id == b.first_token_id and a.predictions == b.predictions
        assert a.probe["image_attention"] == pytest.approx(b.probe["image_attention"], abs=1e-5)
        # amplified, as asked
        assert a.probe["image_attention"][1] > plain.probe["image_attention"][1]
