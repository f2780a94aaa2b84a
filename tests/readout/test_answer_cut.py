"""VLMEvalKit's LLaVA_Next answer (vlm/llava/llava.py generate_inner l.392-394, output_process
l.311-330): cut out of generate's whole output decoded with its special tokens, reproduced as
Settings.answer_cut "vlmevalkit_llava"."""
import json
import shutil

import pytest
import torch
from PIL import Image

from pope_fast.engine import Engine, Settings
from pope_fast.coverage import protocol_for
from pope_fast.readout.protocols import PROTOCOLS, get_template
from pope_fast.readout.protocols.scoring import checks
from pope_fast.readout.tool_steps import ANSWER_CUTS, llava_answer

Q = "Is there a dog in the image?"


# Worked by hand from output_process: '<s>' out and strip; the part after the first marker (by the
# markers' order, not by where they stand), up to a second one; up to the first end token; '<unk>'
# out last.
@pytest.mark.parametrize("whole, answer", [
    ("<s> [INST] <image>\nQ? [/INST] Yes, there is.</s>", "Yes, there is."),
    ("<s> [INST] <image>\nQ? [/INST] Yes [/INST] no</s>", "Yes"),  # a second marker ends it
    # every <s> goes, before the cut
    ("<s> [INST] <image>\nQ? [/INST] No<s> dog</s> yes", "No dog"),
    ("<s> USER: <image>\nQ? ASSISTANT: Yes</s>", "Yes"),
    # [/INST] is looked for first, wherever it is
    ("<s> USER: <image>\nQ? ASSISTANT: Yes [/INST] No", "No"),
    ("<s> USER: <image>\nQ? ASSISTANT: Y<unk>es<image>", "Yes<image>"),  # other specials stay
    # </s> is looked for first
    ("<s> USER: <image>\nQ? ASSISTANT: yes<|im_end|>no</s>", "yes<|im_end|>no"),
    ("no marker </s> here", "no marker"),
])
def test_llava_answer_is_output_process(whole, answer):
    assert llava_answer(whole) == answer


def test_vlmevalkit_cuts_llava_next_answers_and_only_those():
    cut = ANSWER_CUTS["vlmevalkit_llava"]
    assert cut.cut is llava_answer and cut.readout == "yorn" and cut.special_tokens
    with pytest.raises(ValueError,
                       match="answer_cut must be none or one of vlmevalkit_llava, lmms_eval_whole, "
                                         "not 'x'"):
        Settings(answer_cut="x")
    assert "answer_cut" not in Settings().to_json()
    assert Settings(answer_cut="vlmevalkit_llava").to_json()["answer_cut"] == "vlmevalkit_llava"


@pytest.mark.slow  # transformers' generate and the engine on a tiny checkpoint
def test_the_cut_is_generates_whole_output_decoded_with_specials(tiny, tmp_path):
    """A tiny LLaVA-NeXT (Mistral tokenizer) whose eos is its third greedy token: generate's output
    (prompt, new tokens, the eos) decoded as VLMEvalKit decodes it, then cut, is each text readout's
    text; the new tokens decoded alone stay `decoded`; score --protocol vlmevalkit names a run
    without the cut."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    folder = shutil.copytree(tiny.checkpoint("llava_next"), tmp_path / "ckpt")
    covered = protocol_for(folder, "vlmevalkit")
    assert covered.answer_cut == "vlmevalkit_llava" and covered.deviations == ()
    model = LlavaNextForConditionalGeneration.from_pretrained(str(folder),
                                                              dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(folder))
    image = Image.new("RGB", (48, 40), (200, 30, 90))
    inputs = processor(text=f"[INST] <image>\n{Q} [/INST]", images=image, return_tensors="pt")
    with torch.no_grad():
        free = model.generate(**inputs, max_new_tokens=6,
                              do_sample=False)[0, inputs["input_ids"].shape[1]:]
        eos = int(free[2])
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False, eos_token_id=eos)[0]
    config = json.loads((folder / "generation_config.json").read_text()) \
        if (folder / "generation_config.json").is_file() else {}
    (folder / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    # sic: no decode argument, as theirs
    theirs = llava_answer(processor.decode(out, skip_special_token=True))
    plain = processor.tokenizer.decode(out[inputs["input_ids"].shape[1]:-1],
                                       skip_special_tokens=True)
    for cut in ("vlmevalkit_llava", "none"):
        engine = Engine.load(folder, Settings(max_new_tokens=6, answer_cut=cut,
                                              image_reencode="rgb"),
                             template=get_template("vlmevalkit_mistral"),
                             readouts="yorn,exact_match")
        answer = engine.answer(image, [Q])[0]
        assert answer.decoded == plain
        # the tool's rule reads the tool's answer; the other readouts, the new tokens as their
        # references do
        assert answer.text_for("yorn") == (theirs if cut != "none" else plain)
        assert answer.text_for("exact_match") == plain
    # the stop token's own text, at least, is the cut's and not the plain text's
    assert theirs != plain
    meta = {"template": "vlmevalkit_mistral",
            "protocol_coverage": {"vlmevalkit": covered.to_json()},
            "settings": {**Settings(image_reencode="rgb", dtype="fp16",
                                    generation_config="greedy").to_json()},
            "generation": {"yorn": {"max_new_tokens": 2048}}}
    assert checks(PROTOCOLS["vlmevalkit"], meta, 0) == [
        "answer: this run's answer_cut is none, vlmevalkit's vlmevalkit_llava"]


@pytest.mark.slow  # transformers' generate and the engine on a tiny checkpoint
def test_lmms_eval_instructblip_answers_with_the_whole_output(tiny, tmp_path):
    """lmms-eval's instructblip (models/simple/instructblip.py l.216): generate's whole output,
    which transformers begins with the prompt's ids, decoded without special tokens and stripped, is
    its exact-match text, so no answer is yes or no; `decoded` keeps the new tokens, which the other
    readouts read."""
    from transformers import AutoProcessor, InstructBlipForConditionalGeneration

    checkpoint = tiny.checkpoint("instructblip")
    covered = protocol_for(checkpoint, "lmms-eval")
    assert covered.answer_cut == "lmms_eval_whole" and covered.deviations == ()
    model = InstructBlipForConditionalGeneration.from_pretrained(str(checkpoint),
                                                                 dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(checkpoint))
    image = Image.new("RGB", (48, 40), (20, 130, 90))
    prompt = Q + "\nAnswer the question using a single word or phrase."
    inputs = processor(images=image, text=prompt, return_tensors="pt", truncation=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    theirs = processor.tokenizer.batch_decode(out, skip_special_tokens=True)[0].strip()
    assert theirs.startswith(prompt)
    engine = Engine.load(checkpoint, Settings(max_new_tokens=5, answer_cut="lmms_eval_whole",
                                              dtype="fp32"),
                         template=get_template("lmms_eval_instructblip"),
                         readouts="exact_match,repope")
    answer = engine.answer(image, [Q])[0]
    assert (answer.text_for("exact_match") == theirs
            and answer.predictions["exact_match"] == "unknown")
    new = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                     skip_special_tokens=True)
    assert answer.decoded == new and answer.text_for("repope") == new
