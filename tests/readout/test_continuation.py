"""Each text readout generates as its reference does and reads its own prefix of one shared
continuation; string_parse_with_prompt parses the decoded whole sequence, as the paper's
InstructBLIP adapter did."""
import json

import pytest

from pope_fast.readout import read_records, score_records
from pope_fast.readout.continuation import all_finished, cut, generation_plan
from pope_fast.readout.readouts import (READOUTS, Generation, exact_match, pope_official,
                                        string_parse)

# A SentencePiece-like vocabulary: '▁' is a space, the first leading space is dropped, 0 ends the
# sequence.
PIECES = {0: "</s>", 1: "▁Yes", 2: "▁there", 3: "▁is", 4: "▁a", 5: "▁dog", 6: "▁but", 7: "▁not",
          8: "▁here", 9: ".", 10: "▁It", 11: "▁sleeps", 12: "▁No", 13: ","}
STOP = {0}


def decode(ids):
    return "".join(PIECES[i] for i in ids if i not in STOP).replace("▁", " ").removeprefix(" ")


def test_each_readout_generates_as_its_reference_does():
    plan = generation_plan(list(READOUTS), None, positions_limit=4096)
    # every reference stops at 128 new tokens or fewer: none decodes to the model's positions
    assert plan == {"string_parse": Generation(6), "string_parse_with_prompt": Generation(6),
                    "pope_official": Generation(128, first_sentence=True),
                    "exact_match": Generation(128),
                    "yorn": Generation(128), "repope": Generation(128), "vcd": Generation(128)}
    assert generation_plan(["template_aware", "string_parse"], 3, 4096) == {
        "string_parse": Generation(3)}
    # --max-new-tokens is every text readout's length, with no first-sentence end
    assert set(generation_plan(list(READOUTS), 6, 4096).values()) == {Generation(6)}
    assert generation_plan(["exact_match"], None, positions_limit=100) == {
        "exact_match": Generation(100)}
    # a protocol's length for its readout (VLMEvalKit's 2048), within the positions; the others keep
    # theirs
    assert generation_plan(["yorn", "pope_official"], None, 4096, {"yorn": 2048}) == {
        "yorn": Generation(2048), "pope_official": Generation(128, first_sentence=True)}
    assert generation_plan(["yorn"], None, 1000, {"yorn": 2048}) == {"yorn": Generation(1000)}


def test_a_sentence_that_ends_after_the_sixth_token():
    """'Yes there is a dog but not here.': the paper's 6 tokens stop at 'but'; evaluate.py reads the
    whole first sentence, whose 'not' makes it no. Only the 6-token readout's text was cut by its
    length."""
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 9, 0, 5, 5]
    c = cut(tokens, STOP,
            generation_plan(["string_parse", "pope_official", "exact_match"], None, 4096), decode)
    assert c.ids == tuple(tokens[:12]) and c.text == "Yes there is a dog but not here. It sleeps."
    assert c.texts == {"string_parse": "Yes there is a dog but",
                       "pope_official": "Yes there is a dog but not here.",
                       "exact_match": "Yes there is a dog but not here. It sleeps."}
    assert c.ends == {"string_parse": 6, "pope_official": 9, "exact_match": 12}
    assert (string_parse(c.texts["string_parse"]), pope_official(c.texts["pope_official"]),
            exact_match(c.texts["exact_match"])) == ("yes", "no", "unknown")
    assert pope_official("Yes there is a dog but") == "yes"   # what a 6-token cut made of it
    # the sentence ended pope_official's, the stop token exact_match's
    assert c.capped == ("string_parse",)
    looping = cut([1, 2, 3, 4, 5, 6, 7, 8], STOP,
                  generation_plan(["exact_match", "pope_official"], 5, 4096), decode)
    assert looping.capped == ("exact_match", "pope_official")  # no stop, no sentence: both cut at 5


def test_a_stop_token_ends_every_readout_and_an_override_cuts_at_its_length():
    plan = generation_plan(["string_parse", "pope_official", "exact_match"], None, 4096)
    c = cut([12, 0, 1, 1], STOP, plan, decode)
    assert (c.texts == {"string_parse": "No", "pope_official": "No", "exact_match": "No"}
            and c.ids == (12,))
    fixed = cut([1, 9, 2, 3, 4, 5, 6, 7], STOP, generation_plan(["pope_official"], 4, 4096), decode)
    assert fixed.texts == {"pope_official": "Yes. there is"}   # a fixed length reads past the '.'


def test_the_loop_stops_once_every_row_is_finished_for_every_readout():
    sentence = generation_plan(["pope_official"], None, 4096)
    # row 2 has not ended its sentence
    assert not all_finished([[1, 9], [1, 2]], STOP, sentence, decode)
    # ... now it has stopped
    assert all_finished([[1, 9], [1, 2, 0]], STOP, sentence, decode)
    both = generation_plan(["pope_official", "exact_match"], None, 4096)
    # exact_match reads to the end
    assert not all_finished([[1, 9], [12, 9]], STOP, both, decode)
    assert all_finished([[1, 9] + [2] * 126], STOP, both, decode)            # or to its 128 tokens
    assert all_finished([[1, 2, 3, 4, 5, 6]], STOP, generation_plan(["string_parse"], None, 4096),
                        decode)


@pytest.mark.slow
def test_whole_sequence_parse_on_an_instructblip_prompt(shared):
    """The paper's InstructBLIP adapter decoded generate's whole output: the prompt's 'Answer yes or
    no only' comes first, so string_parse of it is yes whatever the model said."""
    from pope_fast.readout import load_tokenizer

    from pope_fast.readout import get_template
    from pope_fast.readout.readout_plan import ReadoutPlan

    tokenizer = load_tokenizer(shared / "tokenizers/llama2/vicuna-7b-v1.5")
    prompt = "Question: Is there a dog in the image? Answer yes or no only. Answer:"
    new = tokenizer("No", add_special_tokens=False)["input_ids"]
    plan = ReadoutPlan.make(tokenizer, get_template("instructblip"),
                            "string_parse,string_parse_with_prompt",
                            vocab_size=len(tokenizer), max_new_tokens=None, positions=4096)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    texts = plan.texts(new + [tokenizer.eos_token_id], {tokenizer.eos_token_id}, decode,
                       tokenizer(prompt)["input_ids"])
    sequence = texts["decoded_sequence"]
    assert sequence == "Question: Is there a dog in the image? Answer yes or no only. Answer: No"
    assert texts["texts"]["string_parse"] == "No"
    assert READOUTS["string_parse_with_prompt"](None, None, None, sequence) == "yes"
    assert READOUTS["string_parse"](None, None, None,
                                    tokenizer.decode(new, skip_special_tokens=True)) == "no"


def _instructblip_file(tmp_path, n=6):
    results = []
    for i in range(n):
        label, answer = ("yes", "Yes") if i % 2 == 0 else ("no", "No")
        whole = f"Question: Is there a dog in the image? Answer yes or no only. Answer: {answer}"
        results.append({"question_id": str(i + 1), "label": label, "top_token_id": 1,
                        "pred_legacy_2tok": label, "pred_legacy_8tok": label,
                        "pred_dynamic_single": label,
                        "pred_string_parse": string_parse(whole), "decoded_response": whole})
    path = tmp_path / "instructblip_pope_random_6q_paper_template_token_audit.json"
    path.write_text(json.dumps({"summary": {"model": "instructblip", "split": "random"},
                                "results": results}))
    return path


def test_the_papers_instructblip_string_row_is_the_whole_sequence_readout(tmp_path):
    """Imported, that file's string_parse is our string_parse_with_prompt (its decoded_response is
    the whole sequence), and it scores to the published all-yes F1 of 0.6667; recomputed from the
    decoded whole sequence, the same."""
    records = read_records(_instructblip_file(tmp_path))
    assert (records.meta["whole_sequence"]
            and records.entries[1].decoded_sequence.endswith("Answer: No"))
    [run] = score_records(records, ["string_parse", "string_parse_with_prompt", "pope_official"])
    m = run["readouts"]["string_parse_with_prompt"]
    assert (m["tp"], m["fp"], m["tn"], m["fn"], m["f1"]) == (3, 3, 0, 0, 2 / 3)
    # no new-token text in that file
    assert set(run["unavailable"]) == {"string_parse", "pope_official"}
    records.prefer_stored = False
    [again] = score_records(records, ["string_parse_with_prompt"])
    assert again["readouts"]["string_parse_with_prompt"]["f1"] == 2 / 3

