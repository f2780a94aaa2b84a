"""The README's bound on fp16 and bf16: the engine's candidate logits against transformers' class in
the same dtype, on tiny checkpoints of two families whose paths differ most (LLaMA with CLIP; Gemma
3's offset norms, scaled embeddings, local and global RoPE and bidirectional image mask). The two
round the same sums in another order, so they differ by rounding, not by zero; measured worst over
all ten families: 0.004 in fp16, 0.031 in bf16, on logits of magnitude up to 4."""
import pytest
import torch
from registry import REGISTRY
from tinymodels import QUESTIONS

from pope_fast.engine import Engine, Settings

pytestmark = pytest.mark.slow  # transformers' class and the engine, each loaded in two dtypes

BOUND = {"fp16": 0.01, "bf16": 0.05}  # the README's
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.mark.parametrize("dtype", list(BOUND))
@pytest.mark.parametrize("name", ["llava", "gemma3"])
def test_half_precision_logits_are_transformers_within_the_stated_bound(name, dtype, tiny):
    family = REGISTRY[name]
    checkpoint = tiny.checkpoint(name)
    model = family.transformers_class().from_pretrained(str(checkpoint), dtype=DTYPES[dtype]).eval()
    engine = Engine.load(checkpoint, Settings(dtype=dtype, max_new_tokens=1),
                         readouts="template_aware")
    inputs_of = family.inputs_of(checkpoint)
    worst, fp32_scale = 0.0, 0.0
    # one prefill
    for question, answer in zip(QUESTIONS[:2], engine.answer(family.images[0], QUESTIONS[:2])):
        inputs = {k: v.to(DTYPES[dtype]) if torch.is_floating_point(v) else v
                  for k, v in inputs_of(family.images[0], engine.prompt(question)).items()}
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1].float()
        worst = max(worst, *(abs(v - float(logits[i])) for i, v in answer.candidate_logits.items()))
        fp32_scale = max(fp32_scale, float(logits.abs().max()))
    assert worst <= BOUND[dtype], f"{name} {dtype}: worst candidate-logit difference {worst:.4f}"
    assert fp32_scale > 1  # logits large enough that the bound is not met by their smallness
