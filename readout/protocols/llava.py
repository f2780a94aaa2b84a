"""LLaVA-1.5's scripts/v1_5/eval/pope.sh (haotian-liu/LLaVA c121f04): model_vqa_loader's prompt and
length, and eval_pope.py's answer rule and metrics (POPE's evaluate.py, copied); it evaluates
LLaVA-1.5 alone."""
from __future__ import annotations

from ..templates import SHORT_ANSWER, Template
from .base import Coverage, Protocol, by_model_type
from .pope_official import pope_evaluate_metrics

# LLaVA conv_vicuna_v1 (llava/conversation.py l.242-251): what LLaVA-1.5's scripts/v1_5/eval/pope.sh
# runs (--conv-mode vicuna_v1), and lmms-eval's `llava` class.
VICUNA_V1_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)

TEMPLATES = (
    Template("llava_official", "USER: <image>\n{question}" + SHORT_ANSWER + " ASSISTANT:",
             "<image>",
             "LLaVA-1.5 scripts/v1_5/eval/pope.sh: model_vqa_loader, conv vicuna_v1, "
             "llava_pope_test.jsonl's text (lmms-eval's `llava` class renders the same)",
             system=VICUNA_V1_SYSTEM),
)

ONLY_LLAVA = "LLaVA's pope.sh evaluates LLaVA-1.5"
COVERAGE = {
    # model_vqa_loader: process_images pads to square (LLaVA-1.5's image_aspect_ratio "pad") fp16:
    # load_pretrained_model (llava/model/builder.py l.42-43), which model_vqa_loader calls; its
    # generate (l.104-114: greedy, no processor of its own) applies the checkpoint's
    # generation_config.json, over the prompt as inputs_embeds alone
    # (llava/model/language_model/llava_llama.py l.105-142): a penalty reads the output only
    "llava": Coverage("model_vqa_loader --conv-mode vicuna_v1", "llava_official", 128,
                      image_aspect="pad", dtype="fp16", generation_config="greedy_output"),
    "llava_next": ONLY_LLAVA + "; LLaVA-NeXT's own numbers come from lmms-eval",
}

PROTOCOL = Protocol(
    "llava", "LLaVA-1.5's scripts/v1_5/eval/pope.sh", "haotian-liu/LLaVA c121f04", "pope_official",
    pope_evaluate_metrics, "F1 score", False, str,
    ("scripts/v1_5/eval/pope.sh (model_vqa_loader --conv-mode vicuna_v1 --temperature 0)",
     "llava/eval/model_vqa_loader.py l.39-51 (prompt), l.104-114 (max_new_tokens 128, greedy)",
     "llava/conversation.py l.242-251 (conv_vicuna_v1)",
     "llava/eval/eval_pope.py l.8-20 (answer rule), l.22-61 (metrics, per category)"),
    "eval_pope.py's per-split lines and the paper's one number, the mean of the splits' F1; "
    "LLaVA used POPE at e3e39262 (random: 2,910 questions): give those files to reproduce its "
    "figures",
    mean_of_splits=True, covers=by_model_type(COVERAGE, ONLY_LLAVA), templates=TEMPLATES)
