"""What the sweep carries from the engine to a record (pope_fast/replies.py): a PromptResult's
answer fields, every one, and not its tensors; an error every method's folder records, or one
method's refusal."""
import json
import math
from dataclasses import fields

import torch

from pope_fast.engine import PromptResult
from pope_fast.readout import Question, make_record
from pope_fast.readout.records import AnswerFields
from pope_fast.replies import Outcome, Reply

QUESTION = Question(4, "img1.jpg", "Is there a cat?", "no", "popular", "coco")
ANSWER = dict(first_token_id=1939, candidate_logits={3869: -0.5, 1939: math.nan}, logsumexp=3.5,
              decoded="No", texts={"pope_official": "No."},
              decoded_sequence="USER: Is there a cat? ASSISTANT: No", capped=("string_parse",),
              reasoning="Hmm", reasoning_tokens=2, unanswered="reasoning not closed")


def test_a_prompt_results_answer_fields_reach_its_record_and_its_tensors_do_not():
    # a new field: give it a value here
    assert set(ANSWER) == {f.name for f in fields(AnswerFields)}
    result = PromptResult(**ANSWER, probe={"image_attention": [0.25]}, vocab_logits=torch.ones(5),
                          residuals=torch.ones(2, 3), lens_logits=torch.ones(5))
    reply = Reply(result.as_answer(), {"template_aware": "no"}, {"image_attention": [0.25]},
                  "ab" * 32)
    assert type(reply.answer) is AnswerFields and vars(reply.answer) == ANSWER
    record = reply.record(QUESTION, "t")
    assert record == make_record(QUESTION, "t", **ANSWER, predictions={"template_aware": "no"},
                                 probe={"image_attention": [0.25]}, image_sha256="ab" * 32)
    assert (all(name in record for name in ANSWER)
            and record["non_finite"] == {"candidate_logits": {"1939": "nan"}})
    json.dumps(record, allow_nan=False)  # strict JSON, nothing of torch in it


def test_an_error_is_every_methods_and_a_refusal_one_methods():
    unusable = Outcome(QUESTION, error="image missing")
    assert unusable.reply("vcd") == Reply(error="image missing") and not unusable.refused
    assert unusable.reply("none").record(QUESTION, "t") == make_record(QUESTION, "t",
                                                                       error="image missing")
    refused = Outcome(QUESTION, {"none": Reply(AnswerFields(first_token_id=5)),
                                 "vcd": Reply(error="needs an image")})

    assert (refused.refused
            and refused.reply("vcd").record(QUESTION, "t")["error"] == "needs an image")
    assert refused.reply("none").record(QUESTION, "t")["first_token_id"] == 5
