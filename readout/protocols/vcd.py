"""VCD's POPE protocol (DAMO-NLP-SG/VCD d6568ff), the one most mitigation papers inherit: its
sampled baseline, as `experiments/eval/object_hallucination_vqa_{llava,instructblip}.py` generate
it, and `experiments/eval/eval_pope.py`'s rule and metrics, one answer file (a dataset's split) at a
time.

Its rule reads the label: a yes-labelled question counts right where "yes" is anywhere in the
lowercased, stripped answer, a no-labelled one where "no" is (eval_pope.py l.33-50), so "not",
"nothing", "know" and "snow" count as no, and an answer holding both words counts right under either
label. No readout, which sees the text alone, can say that: the readout `vcd` decides the answers
that hold one of the words and leaves the others unknown, and the protocol counts every answer by
its label (`counted`).

Its baseline samples (do_sample=True, l.75) at the scripts' defaults, which
cd_scripts/llava1.5_pope.bash leaves as they are (it sets the seed, the dataset, the split and VCD's
own settings, l.1-23): temperature 1.0, top_p 1, top_k None (l.111-113), under transformers 4.31.0
(requirements.txt l.2), whose generate builds no warper for any of them: every token drawn from the
softmax of the logits (vcd_utils/vcd_sample.py l.162-166, without images_cd)."""
from __future__ import annotations

from ..readouts import NO, UNKNOWN, YES
from ..templates import Template
from .base import Coverage, Protocol, by_model_type
from .pope_official import SCRIPT_STOPS, script_prf

# experiments/llava/conversation.py l.335-345: conv_llava_v1, the eval script's default --conv-mode
# (l.108)
LLAVA_V1_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions.")
ONE_WORD = " Please answer this question with one word."

TEMPLATES = (
    Template("vcd_llava", "USER: <image>\n{question}" + ONE_WORD + " ASSISTANT:", "<image>",
             "VCD object_hallucination_vqa_llava.py l.44-52: '<image>\\n' + question + ' Please "
             "answer this question with one word.' in conv llava_v1 (its 'curious human' system "
             "text)", system=LLAVA_V1_SYSTEM),
    Template("vcd_instructblip", "{question}" + ONE_WORD, "",
             "VCD object_hallucination_vqa_instructblip.py l.49: question + ' Please answer this "
             "question with one word.', to LAVIS's Q-Former and language model"),
)


def vcd_counted(label: str, text: str) -> str:
    """The answer eval_pope.py counts for a question of this label (l.31-53): the text lowercased
    and stripped; a yes-labelled question counted yes (a true positive) where "yes" is in it, else
    no (a false negative); a no-labelled one counted no (a true negative) where "no" is in it, else
    yes (a false positive). A label neither yes nor no is its `unknown` (l.51-53)."""
    answer = text.lower().strip()
    if label == YES:
        return YES if "yes" in answer else NO
    if label == NO:
        return NO if "no" in answer else YES
    return UNKNOWN


def vcd_metrics(labels: list[str], decided: list[str]) -> dict:
    """eval_pope.py l.17-67 over one answer file, the answers as `vcd_counted` counts them:
    precision, recall, F1 2PR/(P+R) in that order of operations, accuracy and the yes proportion
    over every question (TP + FP: the answers counted yes), and the share of labels neither yes nor
    no (`unknow`, as it prints it). Fractions, printed as Python prints a float. Where it divides by
    zero (nothing counted yes, or nothing right) it stops with ZeroDivisionError: those values are
    None and `error` says so."""
    tp = sum(1 for y, d in zip(labels, decided) if y == YES and d == YES)
    fn = sum(1 for y, d in zip(labels, decided) if y == YES and d == NO)
    tn = sum(1 for y, d in zip(labels, decided) if y == NO and d == NO)
    fp = sum(1 for y, d in zip(labels, decided) if y == NO and d == YES)
    total = len(labels)
    out = {"TP": tp, "FP": fp, "TN": tn, "FN": fn, "Precision": None, "Recall": None, "F1": None,
           "Accuracy": None, "yes": (tp + fp) / total,
           "unknow": (total - tp - fp - tn - fn) / total}
    try:
        precision, recall, f1 = script_prf(tp, fp, fn)
    except ZeroDivisionError:
        return {**out, "error": SCRIPT_STOPS}
    return {**out, "Precision": precision, "Recall": recall, "F1": f1,
            "Accuracy": (tp + tn) / total}


# What VCD's generate does that is the same for both of its classes here
SAMPLED = ("VCD draws with one global generator, seeded once per script (set_seed, l.121 / l.98) "
           "and run through the questions in file order, on CUDA: no run elsewhere draws its "
           "tokens. Here each question draws from a generator of its own (the run's --seed, its "
           "image, its prompt), so a run's records are the same whatever the batch, the ranks or a "
           "resume; its rates are what compare with VCD's, within their sampling error (run "
           "several seeds)",
           "--method vcd here reads the answer position only (its logits contrasted): VCD's "
           "contrastive sampling of the text (vcd_sample.py l.130-161) is not run, so a method's "
           "run has no text for this rule")
NOT_RUN = ("VCD's scripts run LLaVA-1.5, InstructBLIP and Qwen-VL "
           "(experiments/eval/object_hallucination_vqa_*.py)")
COVERAGE = {
    # object_hallucination_vqa_llava.py: image_processor.preprocess alone (l.57: CLIP's resize and
    # centre crop, no pad to square), fp16 (llava/model/builder.py l.40), generate over input_ids
    # (l.69-80: the checkpoint's generation config read over the prompt's ids), up to 1024 new
    # tokens, the KeywordsStoppingCriteria it makes (l.64-66) never passed to generate: the eos
    # token ends the answer; the answer decoded without special tokens, stripped, a trailing '</s>'
    # cut (l.86-90)
    "llava": Coverage("VCD's LLaVA fork (llava-v1.5-7b), object_hallucination_vqa_llava.py",
                      "vcd_llava", 1024, dtype="fp16", generation_config="greedy", do_sample=True,
                      deviations=(
                          "VCD loads liuhaotian/llava-v1.5-7b through its LLaVA fork; the engine "
                          "runs the llava-hf conversion of the same weights", *SAMPLED)),
    # object_hallucination_vqa_instructblip.py: LAVIS's blip2_vicuna_instruct (l.39), each image
    # convert('RGB') (l.51) through its eval processor; LAVIS's generate
    # (lavis/models/blip2_models/blip2_vicuna_instruct.py l.241-407) with use_nucleus_sampling=True,
    # num_beams=1, top_p 1, repetition_penalty 1 (l.61-64) and its own defaults temperature 1,
    # max_length 256, min_length 1, over inputs_embeds alone (l.385-401); top_k is not passed, so
    # generate's default 50 applies. transformers 4.31 starts input_ids empty for inputs_embeds, so
    # max_length and min_length count new tokens: 256 at most, the eos ids banned at the first
    "instructblip": Coverage("LAVIS blip2_vicuna_instruct (vicuna7b), "
                             "object_hallucination_vqa_instructblip.py, on the -hf conversion of "
                             "its weights", "vcd_instructblip", 256, image_reencode="rgb",
                             dtype="fp16", min_new_tokens=1, generation_config="greedy_output",
                             repetition_penalty=1.0, do_sample=True, top_k=50, deviations=(
                                 "LAVIS computes under CUDA autocast (blip2_vicuna_instruct.py "
                                 "l.325, l.374); here every module in fp16", *SAMPLED)),
    "llava_next": NOT_RUN,
    "qwen2_vl": NOT_RUN + ": Qwen-VL, not Qwen2-VL",
    "mplug_owl2": NOT_RUN,
    "qwen2_5_vl": NOT_RUN,
    "llava_onevision": NOT_RUN,
    "internvl": NOT_RUN,
    "qwen3_vl": NOT_RUN,
    "qwen3_vl_moe": NOT_RUN,
    "gemma3": NOT_RUN,
}

PROTOCOL = Protocol(
    "vcd", "VCD's experiments/eval/eval_pope.py over its sampled baseline",
    "DAMO-NLP-SG/VCD d6568ff", "vcd", vcd_metrics, "Accuracy", False, str,
    ("experiments/cd_scripts/llava1.5_pope.bash l.1-23 (seed 55, one dataset and split per run)",
     "experiments/eval/object_hallucination_vqa_llava.py l.44-52 (prompt), l.57 (image), l.69-80 "
     "(do_sample, max_new_tokens 1024), l.86-90 (answer), l.111-113 (temperature 1.0, top_p 1, "
     "top_k None), l.121 (set_seed)",
     "experiments/eval/object_hallucination_vqa_instructblip.py l.49 (prompt), l.61-64 (generate)",
     "experiments/llava/conversation.py l.335-345 (conv_llava_v1)",
     "vcd_utils/vcd_sample.py l.162-166 (the sampled baseline's step)",
     "experiments/eval/eval_pope.py l.26-53 (answer rule, by label), "
     "l.54-67 (metrics, one answer file)"),
    "eval_pope.py's lines per dataset and split (the tables of VCD and the papers that copy its "
    "sampled baseline); VCD's data/POPE files are POPE's but for 57 questions of "
    "coco_pope_adversarial.json",
    covers=by_model_type(COVERAGE), templates=TEMPLATES, counted=vcd_counted)
