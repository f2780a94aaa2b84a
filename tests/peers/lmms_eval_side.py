"""lmms-eval 0.7.3's own model class on a checkpoint and POPE questions, asked as its evaluator asks
them: the POPE task's doc_to_visual and doc_to_text (tasks/pope/utils.py), a chat class's messages
as ConfigurableMessagesTask builds them (api/task.py l.1762-1783), the Instance arguments of
api/task.py l.1573 (simple) or l.1863 (chat), pope.yaml's generation kwargs, then
strip_reasoning_tags with __main__.py's default tags and pope_process_results. Prints one JSON line
per question (its id, the raw text, the stripped text, the prediction).

Usage (tests/peers/test_lmms_eval.py runs it): python lmms_eval_side.py MODEL CHECKPOINT QUESTIONS
IMAGES [JSON] where JSON may hold {"fp32": true}: the model loaded in fp32 (and gemma3's cast of its
inputs to bf16, a no-op against its own bf16 model, made to fp32), so that two implementations agree
to rounding and texts compare."""
import json
import sys
from pathlib import Path

from PIL import Image

from lmms_eval.api.instance import Instance
from lmms_eval.api.reasoning import strip_reasoning_tags
from lmms_eval.api.task import ConfigurableMessagesTask
from lmms_eval.models import get_model
from lmms_eval.tasks.pope import utils as pope

name, checkpoint, questions, images = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
KWARGS = {"pre_prompt": "", "post_prompt": "\nAnswer the question using a single word or phrase."}
GEN = {"max_new_tokens": 128, "temperature": 0, "top_p": 1.0, "num_beams": 1, "do_sample": False}

docs = []
for line in questions.read_text().splitlines():
    q = json.loads(line)
    docs.append({"question_id": q["question_id"], "question": q["text"], "answer": q["label"],
                 "image": Image.open(images / q["image"])})

# the comparison in fp32, where two implementations' logits agree to 1e-4
if extra.pop("fp32", False):
    import torch
    from transformers import modeling_utils

    loader = modeling_utils.PreTrainedModel.from_pretrained.__func__

    def fp32(klass, *args, **kwargs):
        kwargs.pop("torch_dtype", None)
        kwargs["dtype"] = torch.float32
        return loader(klass, *args, **kwargs)

    modeling_utils.PreTrainedModel.from_pretrained = classmethod(fp32)
    # gemma3 casts its inputs to bf16 whatever the model's dtype (models/simple/gemma3.py l.292): in
    # the real run a no-op against its bf16 model; in fp32 the model's dtype is the cast's analogue
    from transformers import BatchFeature

    move = BatchFeature.to

    def to_fp32(self, *args, **kwargs):
        if kwargs.get("dtype") is torch.bfloat16:
            kwargs["dtype"] = torch.float32
        return move(self, *args, **kwargs)

    BatchFeature.to = to_fp32
# the registry resolves to the chat class where lmms-eval has one, as --model does
cls = get_model(name)
model = cls(pretrained=checkpoint, device="cpu", device_map="cpu", **extra)
model.task_dict = {"pope": {"test": docs}}
chat = not getattr(cls, "is_simple", True)


def messages(doc):
    return ConfigurableMessagesTask._build_user_turn(pope.pope_doc_to_visual(doc),
                                                     pope.pope_doc_to_text(doc, KWARGS))


requests = []
for i, doc in enumerate(docs):
    ctx = pope.pope_doc_to_text(doc, KWARGS)
    # api/task.py l.1573 (a simple class's arguments), l.1863 (a chat class's)
    arguments = (ctx, messages, dict(GEN), i, "pope", "test") if chat else \
        (ctx, dict(GEN), pope.pope_doc_to_visual, i, "pope", "test")
    requests.append(Instance("generate_until", arguments, i,
                             {"task": "pope", "doc_id": i, "repeats": 1}))
out = model.generate_until(requests)
# __main__.py's default --reasoning_tags
tags = [("<think>", "</think>"), ("<analysis>", "</analysis>")]
for doc, raw in zip(docs, out):
    text = raw.text if hasattr(raw, "text") else raw
    stripped = strip_reasoning_tags(text, tags)
    pred = pope.pope_process_results(doc, [stripped])["pope_accuracy"]["prediction"]
    print(json.dumps({"question_id": doc["question_id"], "raw": text, "stripped": stripped,
                      "prediction": pred, "class": cls.__name__}))
