"""lmms-eval's POPE task: its answer rule and aggregation, its prompt per model class (its
post_prompt after the question, in each class's own prompt), and how it runs each family. Read at
v0.7.2 (cb45ac4d) and checked against the 0.7.3 release (PyPI), which users run: every file of its
POPE path is the same there (tasks/pope/utils.py, the chat classes, strip_reasoning_tags,
media_encoder.py), but for pope.yaml's dataset (lmms-lab-encoder/POPE, the same questions) and Gemma
3's padding (below); the line numbers cited are v0.7.2's."""
from __future__ import annotations

import dataclasses
from typing import Mapping

from ..readouts import NO, YES
from ..templates import SHORT_ANSWER, Template
from .base import Coverage, Protocol, by_model_type, count

QWEN_SYSTEM = "You are a helpful assistant."
# LLaVA-NeXT's conv_qwen (llava/conversation.py l.443-452, df17966), which lmms-eval's
# llava_onevision class renders (its conv_template default qwen_1_5,
# models/simple/llava_onevision.py l.82), CHATML-style (l.85-95): the system, then each role, '\n',
# the message and '<|im_end|>\n'
ONEVISION_CONV = ("<|im_start|>system\n" + QWEN_SYSTEM
                  + "<|im_end|>\n<|im_start|>user\n<image>\n{question}"
                  + SHORT_ANSWER + "<|im_end|>\n<|im_start|>assistant\n")
# The POPE task hands every model class its image through PIL's convert('RGB') (tasks/pope/utils.py
# l.4-6); the classes that re-encode it as a JPEG (jpeg85) convert it to RGB themselves, to the same
# pixels.
TASK_IMAGE = "rgb"
# Every class calls transformers' generate (greedy: do_sample False), passing no repetition penalty
# or other processor of its own, so the checkpoint's generation_config.json applies (Qwen2-VL's and
# Qwen2.5-VL's repetition_penalty 1.05): reproduced (Settings.generation_config greedy).
GENERATE = "greedy"


def lmms_eval_metrics(labels: list[str], decided: list[str]) -> dict:
    """lmms-eval v0.7.2 tasks/pope/utils.py l.31-84: accuracy the mean score (an answer other than
    the label scores 0); precision over answers "yes"; recall's false negatives only the answers
    "no" (another answer to a yes question leaves its denominator); F1 2(PR)/(P+R); the yes-ratio
    that of the labels; 0 for an empty denominator. Fractions."""
    score = 0.0
    for y, d in zip(labels, decided):
        score += 1.0 if d == y else 0.0
    tp, fp, fn = (count(labels, decided, YES, YES), count(labels, decided, NO, YES),
                  count(labels, decided, YES, NO))
    precision = tp / (tp + fp) if (tp + fp) > 0 else 0
    recall = tp / (tp + fn) if (tp + fn) > 0 else 0
    f1 = 2 * (precision * recall) / (precision + recall) if (precision + recall) > 0 else 0
    yes, no = labels.count(YES), labels.count(NO)
    return {"pope_accuracy": score / len(labels), "pope_f1_score": f1, "pope_precision": precision,
            "pope_recall": recall, "pope_yes_ratio": yes / (yes + no) if (yes + no) > 0 else 0}


TEMPLATES = (
    Template("lmms_eval_llava_hf", "USER: <image>\n{question}" + SHORT_ANSWER + " ASSISTANT:",
             "<image>",
             "lmms-eval llava_hf (chat class): the llava-hf processor's template "
             "(LLaVA-1.5, LLaVA-1.6-Vicuna)"),
    Template("lmms_eval_mistral", "[INST] <image>\n{question}" + SHORT_ANSWER + " [/INST]",
             "<image>",
             "lmms-eval llava_hf (chat class): the LLaVA-1.6-Mistral processor's template"),
    Template("lmms_eval_instructblip", "{question}" + SHORT_ANSWER, "",
             "lmms-eval instructblip: the task text alone, to the Q-Former and the language model"),
    Template("lmms_eval_qwen2_vl", "", "<|vision_start|><|image_pad|><|vision_end|>",
             "lmms-eval qwen2_vl: its system message, then [image, question + post_prompt]",
             chat=True, system=QWEN_SYSTEM, suffix=SHORT_ANSWER),
    Template("lmms_eval_qwen3_5", "", "<|vision_start|><|image_pad|><|vision_end|>",
             "lmms-eval qwen3_5 with enable_thinking=False: its system message, then [image, "
             "question + post_prompt], the chat template's empty think block",
             chat=True, system=QWEN_SYSTEM, suffix=SHORT_ANSWER, enable_thinking=False),
    Template("lmms_eval_gemma3", "", "<start_of_image>",
             "lmms-eval gemma3: its system message, then [image, question + post_prompt], through "
             "the processor's chat template", chat=True, system=QWEN_SYSTEM, suffix=SHORT_ANSWER),
    Template("lmms_eval_llava_onevision", ONEVISION_CONV, "<image>",
             "lmms-eval llava_onevision: LLaVA-NeXT's conv qwen_1_5 over "
             "'<image>\\n' + question + post_prompt"),
    Template("lmms_eval_internvl_hf", "", "<IMG_CONTEXT>",
             "lmms-eval internvl_hf (chat class): the processor's chat template over [image, "
             "question + post_prompt], no system message", chat=True, suffix=SHORT_ANSWER),
    Template("lmms_eval_llama_vision", "", "",
             "lmms-eval llama_vision: the processor's chat template over [image, question + "
             "post_prompt], no system message, tokenized without added special tokens (the "
             "transformers backend)", chat=True, suffix=SHORT_ANSWER),
)


def llava_next(config: Mapping) -> Coverage:
    """lmms-eval renders the checkpoint processor's template: LLaVA-1.6-Vicuna's or -Mistral's, by
    the language model inside."""
    vicuna = (config.get("text_config") or {}).get("model_type") == "llama"
    return Coverage("llava_hf (the chat class)",
                    "lmms_eval_llava_hf" if vicuna else "lmms_eval_mistral", 128,
                    image_reencode=TASK_IMAGE, dtype="auto", generation_config=GENERATE)


# Each class's dtype: llava_hf's dtype="auto" (models/simple/llava_hf.py l.69, l.97: the
# checkpoint's own, as config.json names it), instructblip's none (l.44: transformers 5's default,
# "auto" too), qwen2_vl's "auto" (l.67, l.72), bfloat16 for qwen2_5_vl (simple l.73), qwen3_vl
# (simple l.117), internvl_hf (l.103) and gemma3 (simple l.65). The chat classes load through their
# simple ones.
COVERAGE = {
    "llava": Coverage("llava_hf (the chat class, lmms-eval's default for llava-hf checkpoints)",
                      "lmms_eval_llava_hf", 128, image_reencode=TASK_IMAGE, dtype="auto",
                      generation_config=GENERATE),
    "llava_next": llava_next,
    # models/simple/instructblip.py l.216 decodes generate's whole output, which from transformers
    # 4.47 on begins with the prompt's ids: its exact match finds no answer, and its F1 is 0
    # (reproduced: lmms_eval_whole; the other readouts read the new tokens)
    "instructblip": Coverage("instructblip (its answer: the whole output decoded, the prompt's "
                             "text first, so exact match finds none)",
                             "lmms_eval_instructblip", 128, image_reencode=TASK_IMAGE, dtype="auto",
                             answer_cut="lmms_eval_whole", generation_config=GENERATE),
    # models/simple/qwen2_vl.py (no chat class: the simple one runs): each image a JPEG data URL of
    # quality 85 (l.173-180, l.293), which qwen_vl_utils resizes within the message's min_pixels
    # 3136 and max_pixels 602112 (l.42-43, l.293-295, l.348), for a processor made with those bounds
    # (l.73).
    "qwen2_vl": Coverage("qwen2_vl", "lmms_eval_qwen2_vl", 128, image_reencode="jpeg85",
                         image_resize="qwen_vl_utils:28:3136:602112",
                         processor_pixels="3136:602112", dtype="auto", generation_config=GENERATE),
    "gemma4": "lmms-eval 0.7.3 (and its main branch at 75571cfe) has no Gemma 4 model class: its "
              "gemma3 loads Gemma3ForConditionalGeneration (models/simple/gemma3.py l.10, l.74)",
    "mplug_owl2": "lmms-eval 0.7.3 has no mPLUG-Owl2 model class "
                  "(its mplug_owl_video is mPLUG-Owl v1 for video)",
    # `--model qwen2_5_vl` runs the chat class: models/registry_v2.py l.82-97 (v0.7.2) resolves a
    # name to its chat class where models/__init__.py registers one (AVAILABLE_CHAT_TEMPLATE_MODELS:
    # qwen2_5_vl, qwen3_vl, llava_hf, internvl_hf), unless forced simple. The chat class hands
    # qwen_vl_utils the task's image as read (no JPEG round trip: models/chat/qwen2_5_vl.py
    # l.93-112), with the simple class's processor (l.91 of models/simple/qwen2_5_vl.py, min_pixels
    # 256*28*28, max_pixels 1605632: l.44-45). Reproduced: qwen_vl_utils' resize at its defaults
    # (factor 28, 3136 to 12845056 pixels: the chat class's image entries carry no bounds,
    # protocol.py to_hf_messages l.82-83), then the processor made with min_pixels 256*28*28 and
    # max_pixels 1605632 resizes again (upscaling a 500x375 image's 504x364 to 532x392).
    "qwen2_5_vl": Coverage("qwen2_5_vl (the chat class, which --model qwen2_5_vl runs)",
                           "lmms_eval_qwen2_vl", 128, image_reencode=TASK_IMAGE,
                           image_resize="qwen_vl_utils:28", processor_pixels="200704:1605632",
                           dtype="bf16", generation_config=GENERATE),
    # `--model llava_onevision` (what LLaVA-OneVision's own numbers come from) runs LLaVA-NeXT's
    # code on lmms-lab's original folder, of which the -hf checkpoints hold the weights converted:
    # models/simple/llava_onevision.py renders '<image>\n' + the task's text in conv qwen_1_5
    # (l.517-551: ONEVISION_CONV), hands the task's RGB image to process_images (l.482-496:
    # anyres_max_9, LLaVA-NeXT mm_utils.py l.119-293, whose crops are the -hf processor's bit for
    # bit: tests/families/test_llava_onevision.py), in fp16 (load_pretrained_model's default,
    # llava/model/builder.py l.27-36; the images cast to fp16, l.484-496), and calls generate
    # greedily with POPE's 128 new tokens (l.577-590), which LLaVA-NeXT's LlavaQwenForCausalLM hands
    # transformers' generate as inputs_embeds alone (llava/model/language_model/llava_qwen.py
    # l.117-135): the folder's generation config, read over the output only. Its rules and eos ids
    # are the folder's own: lmms-lab's carry their generation_config.json (the -chat one sets
    # repetition_penalty 1.05 and eos [151645, 151643]), the -hf conversions theirs (eos 151645).
    "llava_onevision": Coverage("llava_onevision (LLaVA-NeXT's code on lmms-lab's checkpoint), on "
                                "the -hf conversion of its weights",
                                "lmms_eval_llava_onevision", 128, image_reencode=TASK_IMAGE,
                                dtype="fp16", generation_config="greedy_output"),
    # lmms_eval/models/chat/internvl_hf.py: the processor's chat template over the task's [image,
    # text] messages (tasks/pope: question + post_prompt), 128 new tokens, and min_patches 1,
    # max_patches 12 (its defaults, l.67-68) in every call's images_kwargs (l.248-251): reproduced
    # (processor_patches; InternVL3's -hf checkpoints hold the same bounds).
    "internvl": Coverage("internvl_hf (the chat class)", "lmms_eval_internvl_hf", 128,
                         image_reencode=TASK_IMAGE, processor_patches="1:12", dtype="bf16",
                         generation_config=GENERATE),
    # `--model qwen3_vl` runs the chat class (models/chat/qwen3_vl.py; see qwen2_5_vl above): the
    # system prompt (l.50), the task's image then text, the processor's chat template over them,
    # POPE's 128 new tokens. Reproduced: qwen_vl_utils' resize at image_patch_size 16 (l.66-70:
    # factor 32, its defaults of 4096 to 16777216 pixels), the processor told to keep that size
    # (do_resize=False, l.86, l.98): here a processor with qwen_vl_utils' bounds, whose smart_resize
    # leaves such a size as it is (PIL resizes to the same size by copying).
    "qwen3_vl": Coverage("qwen3_vl (the chat class, which --model qwen3_vl runs)",
                         "lmms_eval_qwen2_vl", 128, image_reencode=TASK_IMAGE,
                         image_resize="qwen_vl_utils:32", processor_pixels="4096:16777216",
                         dtype="bf16", generation_config=GENERATE),
    # The same class for Qwen3-VL-MoE: models/simple/qwen3_vl.py (which the chat class extends)
    # loads Qwen3VLMoeForConditionalGeneration where the checkpoint's name reads like 30B-A3B
    # (l.113-114, l.46-52).
    "qwen3_vl_moe": Coverage("qwen3_vl (the chat class; its MoE class for an A3B checkpoint)",
                             "lmms_eval_qwen2_vl", 128, image_reencode=TASK_IMAGE,
                             image_resize="qwen_vl_utils:32", processor_pixels="4096:16777216",
                             dtype="bf16", generation_config=GENERATE),
    # `--model qwen3_5` (v0.7.2: models/__init__.py l.90, l.123) runs the chat class,
    # models/chat/qwen3_5.py: Qwen3-VL's chat class (as for qwen3_vl above: the system prompt,
    # chat/qwen3_vl.py l.50; qwen_vl_utils at image_patch_size 16, l.66-70; do_resize=False, l.86,
    # l.98) with simple/qwen3_5.py's defaults: enable_thinking True (l.29), which simple/qwen3_vl.py
    # passes to the chat template (l.227-230) and whose <think> block the chat class strips from the
    # answer (chat/qwen3_vl.py l.124); bf16 (simple/qwen3_vl.py l.111).
    "qwen3_5": Coverage("qwen3_5 (the chat class, which --model qwen3_5 runs)", "lmms_eval_qwen3_5",
                        128, image_reencode=TASK_IMAGE, image_resize="qwen_vl_utils:32",
                        processor_pixels="4096:16777216", dtype="bf16", generation_config=GENERATE,
                        deviations=(
        "enable_thinking: the class's default is True, where Qwen3.5's template opens a <think> "
        "block and the answer is what follows the reasoning (chat/qwen3_vl.py l.124) within 128 "
        "new tokens; here as --model_args enable_thinking=False runs it (the empty think block: "
        "the prompt ends where the answer begins)",)),
    # models/simple/gemma3.py: a system message 'You are a helpful assistant.' (l.47, l.242), then
    # [image, the task's text] (l.263-266) through the processor's chat template (l.271), greedy,
    # the POPE task's 128 new tokens (tasks/pope/pope.yaml l.11, its post_prompt l.36). Every image
    # a JPEG data URL of quality 85 (l.176-183, l.257): reproduced (jpeg85). Every prompt padded to
    # its max_length of 2048 (l.79, l.271; 0.7.3: to a multiple of 8, l.292) on the tokenizer's
    # side, gemma-3's left: masked, with positions that follow the mask, the unpadded prompt's
    # logits to rounding (tests/families/test_gemma3.py test_lmms_eval_padding_changes_no_logit), so
    # the unpadded run is lmms-eval's.
    "gemma3": Coverage("gemma3", "lmms_eval_gemma3", 128, image_reencode="jpeg85", dtype="bf16",
                       generation_config=GENERATE),
    "idefics3": "lmms-eval 0.7.3 has no Idefics3 (SmolVLM) class: its idefics2 loads "
                "Idefics2ForConditionalGeneration (models/simple/idefics2.py l.74), and its "
                "generic chat class huggingface (models/chat/huggingface.py l.92-95: any "
                "image-text-to-text model, in bf16, l.82) is no family's class and not reproduced "
                "here",
    # Models the engine has no family for, which the transformers backend runs (their class,
    # processor and chat template). models/simple/llama_vision.py: the checkpoint's own dtype
    # (dtype="auto", l.32, l.55), the task's RGB image, [image, the task's text] (l.174-187) through
    # the processor's chat template (l.188), tokenized without added special tokens (l.189: the
    # template writes <|begin_of_text|> itself, as the backend tokenizes a chat-rendered prompt),
    # generate greedily (l.191-208: temperature 0, do_sample False) for the task's 128 new tokens,
    # which it decodes without special tokens (l.209-210).
    "mllama": Coverage("llama_vision", "lmms_eval_llama_vision", 128, image_reencode=TASK_IMAGE,
                       dtype="auto", generation_config=GENERATE),
}
# qwen3_5_moe: the same classes, whose simple/qwen3_5.py loads Qwen3_5MoeForConditionalGeneration
# where the checkpoint's name reads like A3B (re.search(r"A\d+B", pretrained), l.86-88 at 578f029a):
# the dense one's coverage
COVERAGE["qwen3_5_moe"] = dataclasses.replace(
    COVERAGE["qwen3_5"],
    model_class="qwen3_5 (the chat class; its MoE class for an A3B checkpoint)")

# v0.7.2: __main__.py l.304-307 (--reasoning_tags, default [<think>, </think>] and [<analysis>,
# </analysis>]), evaluator.py l.1092-1136, api/reasoning.py l.5-31; models/simple/qwen3_vl.py l.86,
# l.227-230, l.261-266.
THINKING = ("reasoning stripped before scoring, by default (--reasoning_tags: each closed "
            "<think>...</think> removed, and where the prompt opened the block the text after the "
            "last </think>; an unclosed one scored as it is), within POPE's 128 new tokens; its "
            "qwen3_vl class hands enable_thinking to the chat template and cuts its answer at "
            "</think>. Here: --thinking decode reads the answer position after </think> (a "
            "reasoning past its cap unknown, not scored as text); --thinking off is "
            "enable_thinking=False")

PROTOCOL = Protocol(
    "lmms-eval", "lmms-eval's POPE task", "lmms-eval 0.7.3 and v0.7.2 (cb45ac4d)", "exact_match",
    lmms_eval_metrics, "pope_f1_score", True, lambda v: "%.4f" % v,
    ("lmms_eval/tasks/pope/pope.yaml (max_new_tokens 128, greedy; post_prompt '\\nAnswer the "
     "question using a single word or phrase.')",
     "lmms_eval/tasks/pope/utils.py l.9-14 (prompt), l.17-28 (exact match), l.31-84 (aggregation)",
     "lmms_eval/evaluator.py l.1092-1136, api/reasoning.py l.5-35 (each answer's "
     "<think>/<analysis> blocks cut and the text stripped before the task scores it: __main__.py "
     "l.303-308's default --reasoning_tags)",
     "lmms_eval/utils.py make_table l.606, l.625 (sorted metrics, '%.4f')",
     "lmms_eval/models/chat/llava_hf.py, simple/qwen2_vl.py, simple/instructblip.py, "
     "simple/llama_vision.py (each class's prompt)"),
    "`--tasks pope` (the Overall row: all 9,000 questions pooled) and `--tasks pope_full` "
    "(one row per split), as fractions",
    covers=by_model_type(COVERAGE), templates=TEMPLATES, thinking=THINKING)
