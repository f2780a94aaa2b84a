"""VLMEvalKit 0.2rc1 (e8e78f05)'s POPE, offline (--judge exact_matching): its answer rule and
aggregation, its prompt per model class (POPE adds no suffix but for Qwen2-VL), and how it runs each
family."""
from __future__ import annotations

import dataclasses
from typing import Mapping

from ..readouts import NO, YES
from ..templates import Template
from .base import Coverage, Protocol, by_model_type, count

# LLaVA conv_llava_v1 (llava/conversation.py l.325-335), the "human" wording, which VLMEvalKit's
# LLaVA class hard-codes (vlmeval/vlm/llava/llava.py l.34-37).
LLAVA_V1_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)


# InternVL's internvl2_5 conversation template, which InternVL3's config names (OpenGVLab/InternVL
# internvl_chat/internvl/conversation.py l.393-402, 2410d1d): its system message, the chat's default
# (modeling_internvl_chat.py l.97-101)
INTERNVL_SYSTEM = "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。"


def vlmevalkit_metrics(labels: list[str], decided: list[str]) -> dict:
    """VLMEvalKit e8e78f05 vlmeval/dataset/utils/yorn.py POPE_rating l.148-187: an extracted
    'Unknown' is a negative prediction in precision, recall and F1 (y_pred 1 only for 'Yes') and
    wrong in accuracy (image_yorn.py l.91: score = answer == extracted); F1 2(PR)/(P+R); 0 for an
    empty denominator; every value x100, F1 in the column it names `Overall`; no yes-ratio."""
    tp, fp = count(labels, decided, YES, YES), count(labels, decided, NO, YES)
    fn = sum(1 for y, d in zip(labels, decided) if y == YES and d != YES)
    precision = tp / (tp + fp) if (tp + fp) != 0 else 0
    recall = tp / (tp + fn) if (tp + fn) != 0 else 0
    f1 = 2 * (precision * recall) / (precision + recall) if (precision + recall) != 0 else 0
    right = sum(1 for y, d in zip(labels, decided) if y == d)
    return {"Overall": f1 * 100, "acc": right / len(labels) * 100, "precision": precision * 100,
            "recall": recall * 100}


TEMPLATES = (
    Template("vlmevalkit_llava", "USER:  <image> {question} ASSISTANT: ", "<image>",
             "VLMEvalKit LLaVA: system + 'USER: ' + ' <image> ' + question + ' ASSISTANT: '",
             system=LLAVA_V1_SYSTEM, image_part=" <image> "),
    Template("vlmevalkit_mistral", "[INST] <image>\n{question} [/INST]", "<image>",
             "VLMEvalKit LLaVA_Next: the LLaVA-1.6-Mistral processor's template "
             "over the bare question"),
    Template("vlmevalkit_vicuna_hf", "USER: <image>\n{question} ASSISTANT:", "<image>",
             "VLMEvalKit LLaVA_Next: the LLaVA-1.6-Vicuna processor's template "
             "over the bare question"),
    Template("vlmevalkit_qwen2_vl", "", "<|vision_start|><|image_pad|><|vision_end|>",
             "VLMEvalKit Qwen2VLChat (Qwen2-VL): [image, question + ' Please answer yes or no.'], "
             "the chat template's default system", chat=True, suffix=" Please answer yes or no."),
    Template("vlmevalkit_qwen2_5_vl", "", "<|vision_start|><|image_pad|><|vision_end|>",
             "VLMEvalKit Qwen2VLChat (Qwen2.5-VL) and Qwen3VLChat, use_custom_prompt=False: "
             "[image, the bare question] through the checkpoint's chat template (its default "
             "system, if it has one)", chat=True, suffix=""),
    Template("vlmevalkit_qwen3_5", "", "<|vision_start|><|image_pad|><|vision_end|>",
             "VLMEvalKit Qwen3VLChat on Qwen3.5, use_custom_prompt=False: [image, the bare "
             "question] through the checkpoint's chat template, here with enable_thinking=False "
             "(its empty think block)", chat=True, suffix="", enable_thinking=False),
    Template("vlmevalkit_gemma3", "", "<start_of_image>",
             "VLMEvalKit Gemma3: its system prompt 'You are a helpful assistant. ', then [image, "
             "the bare question], through the processor's chat template",
             chat=True, system="You are a helpful assistant. ", suffix=""),
    Template("vlmevalkit_gemma4", "", "<|image|>",
             "VLMEvalKit Gemma4: [image, the bare question] as one user turn, no system prompt, "
             "through the processor's chat template with enable_thinking=False",
             chat=True, suffix=""),
    Template("vlmevalkit_llava_onevision",
             "<|im_start|>user \n<image>\n{question}<|im_end|><|im_start|>assistant\n", "<image>",
             "VLMEvalKit LLaVA_OneVision_HF: the llava-hf processor's chat template over one text "
             "part, '<image>\\n' + question (the image part becomes text, so the template renders "
             "no image)"),
    Template("vlmevalkit_internvl", "", "<IMG_CONTEXT>",
             "VLMEvalKit InternVLChat (InternVL3): InternVL's internvl2_5 template, its system "
             "message, then '<image>\\n' + the bare question, as the -hf chat template renders "
             "[image, question] under that system",
             chat=True, system=INTERNVL_SYSTEM, suffix=""),
    Template("vlmevalkit_instructblip", "{question}", "",
             "VLMEvalKit InstructBLIP (LAVIS blip2_vicuna_instruct): the bare question, to the "
             "Q-Former and the language model"),
    Template("vlmevalkit_mplug_owl2", "USER: <|image|>{question} \nASSISTANT: ", "<|image|>",
             "VLMEvalKit mPLUG_Owl2: 'USER: <|image|>' + question + ' \\nASSISTANT: '"),
    # Idefics3's (its processor expands <image>, which a text-only prompt drops)
    Template("vlmevalkit_smolvlm",
             "<|im_start|>User:<image>{question}<end_of_utterance>\nAssistant:", "<image>",
             "VLMEvalKit SmolVLM: build_prompt_default's '<|im_start|>User:' + '<image>' + the "
             "bare question + '<end_of_utterance>\\nAssistant:'", image_part="<image>"),
)


# qwen_vl_utils' resize within the bounds VLMEvalKit's config gives Qwen2VLChat (1280 to 16384
# tokens of 28x28)
QWEN_RESIZE = f"qwen_vl_utils:28:{1280 * 28 * 28}:{16384 * 28 * 28}"
# The classes below that run transformers' generate (all but Qwen3VLChat's vLLM and InternVLChat,
# whose chat runs its inner language model's) get the checkpoint's generation_config.json under
# their own arguments: reproduced (Settings.generation_config greedy; LLaVA's own generate gives it
# inputs_embeds alone: greedy_output). Qwen2VLChat passes repetition_penalty 1.0 over the Qwen
# checkpoints' 1.05 (vlm/qwen2_vl/model.py l.190, l.206-213, l.492-495), and top_k 1 with do_sample,
# which keeps only the argmax: greedy.
GENERATE = "greedy"


def llava_next(config: Mapping) -> Coverage:
    """vlmeval/vlm/llava/llava.py LLaVA_Next l.280-281, l.373-394: the checkpoint processor's
    template, LLaVA-1.6-Vicuna's or -Mistral's by the language model inside, over the bare
    question."""
    vicuna = (config.get("text_config") or {}).get("model_type") == "llama"
    return Coverage("LLaVA_Next (llava_next_vicuna_7b, llava_next_mistral_7b)",
                    "vlmevalkit_vicuna_hf" if vicuna else "vlmevalkit_mistral", 2048,
                    # fp16: l.257-275; the answer: llava_answer
                    image_reencode="rgb", dtype="fp16", answer_cut="vlmevalkit_llava",
                    generation_config=GENERATE)


COVERAGE = {
    # vlmeval/vlm/llava/llava.py l.72-79 (2048 new tokens), l.190 (convert('RGB')), l.191-196
    # (image_aspect_ratio "pad"); fp16: LLaVA's load_pretrained_model (l.48-54;
    # llava/model/builder.py l.42-43 at c121f04)
    "llava": Coverage("LLaVA (llava_v1.5_7b)", "vlmevalkit_llava", 2048, image_aspect="pad",
                      # LLaVA's generate: inputs_embeds alone
                      image_reencode="rgb", dtype="fp16", generation_config="greedy_output"),
    "llava_next": llava_next,
    # vlmeval/vlm/instructblip.py: LAVIS's blip2_vicuna_instruct (misc/blip2_instruct_vicuna7b.yaml)
    # on the bare question (message_to_promptimg), each image opened with convert('RGB') (l.58)
    # through blip_image_eval at 224 px (LAVIS processors/blip_processors.py l.18-25, l.167-182: the
    # -hf processor's pixels, bit for bit: tests/families/test_instructblip.py). LAVIS's generate
    # (blip2_vicuna_instruct.py l.249-382, salesforce/LAVIS 506965b) puts the question to the
    # Q-Former and the language model and calls its generate with inputs_embeds alone (the rules
    # read the output only), 5 beams, repetition_penalty 1.5, length_penalty 1, max_length 256 (of
    # which the prompt's embeddings take their share), min_length 1 (nothing once that is taken
    # off), greedy (no sampling); the answer is the output decoded without special tokens, stripped.
    # It computes under CUDA autocast with its ViT in fp16 and its Q-Former in fp32: a difference of
    # rounding, said below.
    "instructblip": Coverage("InstructBLIP (instructblip_7b: LAVIS's blip2_vicuna_instruct), on "
                             "the -hf conversion of its weights",
                             "vlmevalkit_instructblip", 256, image_reencode="rgb", dtype="fp16",
                             generation_config="greedy_output", repetition_penalty=1.5,
                             num_beams=5, max_length=256, deviations=(
        "LAVIS computes under CUDA autocast (the ViT and the language model in fp16, the Q-Former "
        "and its projection in fp32: blip2_vicuna_instruct.py l.92, l.303-364); here every module "
        "in fp16, the same search up to rounding",)),
    # vlmeval/config.py l.1936-1941: min_pixels 1280*28*28, max_pixels 16384*28*28, which
    # vlm/qwen2_vl/model.py _prepare_content (l.318-335) puts on each image entry for qwen_vl_utils
    # (l.485: process_vision_info) to resize within (upscaling a COCO image to about 1,300 visual
    # tokens); the checkpoint's own processor (l.258, l.263) then leaves that size as it is. The
    # model in its own dtype (torch_dtype='auto', l.312).
    "qwen2_vl": Coverage("Qwen2VLChat (Qwen2-VL-7B-Instruct)", "vlmevalkit_qwen2_vl", 2048,
                         image_resize=QWEN_RESIZE, dtype="auto", generation_config=GENERATE,
                         repetition_penalty=1.0),
    # vlmeval/vlm/mplug_owl2.py l.40-42 (512 new tokens, greedy, min_new_tokens 1: the first step's
    # eos ids masked, engine Settings.min_new_tokens), l.98-103 (prompt), l.113-117 (convert('RGB'),
    # the square); fp16: mPLUG-Owl2's load_pretrained_model (l.28-29;
    # mPLUG-Owl2/mplug_owl2/model/builder.py l.44 at X-PLUG 0f3068f)
    "mplug_owl2": Coverage("mPLUG_Owl2", "vlmevalkit_mplug_owl2", 512, min_new_tokens=1,
                           image_reencode="rgb", dtype="fp16", generation_config=GENERATE),
    # vlmeval/config.py l.2004-2010: Qwen2-VL's bounds and path, use_custom_prompt=False
    "qwen2_5_vl": Coverage("Qwen2VLChat (Qwen2.5-VL-7B-Instruct)", "vlmevalkit_qwen2_5_vl", 2048,
                           image_resize=QWEN_RESIZE, dtype="auto", generation_config=GENERATE,
                           repetition_penalty=1.0),
    # vlmeval/vlm/llava/llava.py LLaVA_OneVision_HF l.734-758 (2048 new tokens, convert('RGB')
    # l.742), fp16 (l.723-724); image_base.py build_prompt
    "llava_onevision": Coverage("LLaVA_OneVision_HF (llava-onevision-qwen2-7b-ov-hf)",
                                "vlmevalkit_llava_onevision", 2048, image_reencode="rgb",
                                dtype="fp16", generation_config=GENERATE),
    # vlmeval/config.py l.1289-1291: InternVL3-8B is InternVLChat, version V2.0, on OpenGVLab's
    # original weights (trust_remote_code, bf16: vlm/internvl/internvl_chat.py l.181-186), which the
    # -hf checkpoints hold converted. POPE is a Y/N dataset: the bare question (l.252-259);
    # generate_v2 (l.381-437) asks '<image>\n' + it (utils.py reorganize_prompt l.227-228) of the
    # model's chat: the internvl2_5 template with its system message (INTERNVL_SYSTEM), eos
    # <|im_end|> (the -hf checkpoints' generation config's too), greedy (l.212, l.415), 4,096 new
    # tokens, through the inner language model's generate over inputs_embeds, whose generation
    # config is its own default: none of the checkpoint's rules (OpenGVLab/InternVL
    # modeling_internvl_chat.py l.343-437). Images: load_image (utils.py l.19-93, max_num 6 for
    # POPE: set_max_num l.316-337): convert('RGB'), the grid of up to 6 448-px tiles, PIL's bicubic
    # resize, the thumbnail, ToTensor and Normalize: the -hf processor's tiles with min_patches 1
    # and max_patches 6, bit for bit (tests/families/test_internvl.py).
    "internvl": Coverage("InternVLChat (InternVL3-8B, version V2.0), on the -hf conversion of "
                         "its weights", "vlmevalkit_internvl", 4096, image_reencode="rgb",
                         processor_patches="1:6", dtype="bf16"),
    # vlmeval/config.py l.1451-1462 (Qwen3-VL-8B-Instruct): Qwen3VLChat with
    # use_custom_prompt=False, so the dataset's [image, question] messages (no system_prompt: the
    # template's own opening), through the processor's chat template (vlm/qwen3_vl/model.py
    # l.361-367), 16384 new tokens. Each image resized by qwen_vl_utils at image_patch_size 16
    # (l.371-376) within its default bounds (the config sets none, so _prepare_content l.165-181
    # adds none), then by the checkpoint's processor: reproduced (image_resize). The model in its
    # own dtype (dtype='auto', l.155-159).
    "qwen3_vl": Coverage("Qwen3VLChat (Qwen3-VL-8B-Instruct)", "vlmevalkit_qwen2_5_vl", 16384,
                         image_resize="qwen_vl_utils:32", dtype="auto", deviations=(
        "VLMEvalKit samples with vLLM (temperature 0.7, top_p 0.8, top_k 20, presence_penalty 1.5: "
        "config.py l.1451-1462, vlm/qwen3_vl/model.py l.378-386); here the greedy answer",)),
    # vlmeval/config.py l.1403-1414 (Qwen3-VL-30B-A3B-Instruct): the 8B's Qwen3VLChat settings, word
    # for word.
    "qwen3_vl_moe": Coverage("Qwen3VLChat (Qwen3-VL-30B-A3B-Instruct)", "vlmevalkit_qwen2_5_vl",
                             16384, image_resize="qwen_vl_utils:32", dtype="auto", deviations=(
        "VLMEvalKit samples with vLLM (temperature 0.7, top_p 0.8, top_k 20, presence_penalty 1.5: "
        "config.py l.1403-1414, vlm/qwen3_vl/model.py l.378-386); here the greedy answer",)),
    # vlmeval/config.py l.1648-1657 (at e8e78f05, qwen3_5_series: Qwen3.5-27B, the dense one; the
    # MoE sizes alike): Qwen3VLChat as for Qwen3-VL (use_custom_prompt=False, qwen_vl_utils at
    # image_patch_size 16: vlm/qwen3_vl/ model.py l.367-376), through vLLM, sampling (temperature
    # 1.0, top_p 0.95, top_k 20, presence_penalty 1.5), 32,768 new tokens, the chat template
    # rendered without enable_thinking (l.367): its default, thinking.
    "qwen3_5": Coverage("Qwen3VLChat (Qwen3.5-27B)", "vlmevalkit_qwen3_5", 32768,
                        image_resize="qwen_vl_utils:32", dtype="auto", deviations=(
        "VLMEvalKit samples with vLLM (temperature 1.0, top_p 0.95, top_k 20, "
        "presence_penalty 1.5: config.py l.1648-1657); here the greedy answer",
        "VLMEvalKit renders the template's default, thinking, and reads the answer after </think>; "
        "here enable_thinking=False (the empty think block), so the prompt ends where the answer "
        "begins")),
    # vlmeval/vlm/gemma.py: Gemma3's system prompt (l.108) and the dataset's [image, question]
    # (image_base.py l.329-336) as one user turn (message2pipeline l.116-129) through the
    # processor's chat template (l.187), greedy with 4,096 new tokens (l.109-112); each image a path
    # in the message (l.127), which the processor opens with transformers' load_image (EXIF
    # orientation, then convert('RGB')); bf16 (l.103). It loads the model with
    # attn_implementation='flash_attention_2' (l.102-104), whose kernel takes no mask but the causal
    # one, so the image tokens attend causally there (transformers 5's Gemma3 refuses flash
    # attention for that reason: _supports_flash_attn False): reproduced (image_mask). A
    # continuation past the 1,024-token sliding window attends within it, as the sliding layers do
    # (DecodeCache.window_masks).
    "gemma3": Coverage("Gemma3 (gemma-3-4b-it)", "vlmevalkit_gemma3", 4096,
                       image_reencode="load_image", dtype="bf16", image_mask="causal",
                       generation_config=GENERATE),
    # vlmeval/vlm/gemma.py Gemma4 (config.py l.2277-2280: E2B, E4B, 31B, 26B-A4B): the dataset's
    # [image, question] as one user turn, no system prompt (message2pipeline l.328-336), through the
    # processor's chat template with enable_thinking=False (l.321, l.385-390), greedy with 4,096 new
    # tokens (l.315-318) under the checkpoint's generation config; each image PIL-opened and
    # convert('RGB') (_load_image l.324-326: no EXIF transpose); bf16 (l.298); transformers' default
    # attention (sdpa), the processor's mm_token_type_ids passed, so the image's bidirectional mask
    # is kept.
    "gemma4": Coverage("Gemma4 (gemma-4-E4B-it)", "vlmevalkit_gemma4", 4096, image_reencode="rgb",
                       dtype="bf16", generation_config=GENERATE, deviations=(
        "VLMEvalKit decodes with special tokens and keeps the text after '</think>' or a "
        "'<|channel>final' block (extract_response_for_eval l.359-381, l.398-405); here the answer "
        "decoded as every other family's, which is the same text for an answer with no thinking "
        "block",)),
    # vlmeval/vlm/smolvlm.py SmolVLM (config.py l.1720-1725: SmolVLM-Instruct, -256M, -500M, all
    # Idefics3ForConditionalGeneration): fp32 (l.22), 2048 new tokens (l.24) under the checkpoint's
    # generation config; POPE takes build_prompt_default (l.83-84): '<|im_start|>User:', '<image>'
    # per image (each opened with transformers' load_image, l.109), the stripped question,
    # '<end_of_utterance>\nAssistant:' (l.103-118), which the processor tokenizes with its
    # tokenizer's own special tokens (l.91-93: SmolVLM's add none, so the engine's ids, tokenized
    # without them, are the same); the answer: the new tokens decoded without special tokens,
    # stripped (l.96-101). Idefics3-8B-Llama3 is VLMEvalKit's IDEFICS2 instead (config.py
    # l.1711-1712).
    "idefics3": Coverage("SmolVLM (SmolVLM-Instruct: Idefics3ForConditionalGeneration)",
                         "vlmevalkit_smolvlm", 2048, image_reencode="load_image", dtype="fp32",
                         generation_config=GENERATE, deviations=(
        "Idefics3-8B-Llama3 runs through VLMEvalKit's IDEFICS2 (config.py l.1711-1712; "
        "vlm/idefics.py l.61-118: 'User:<image>' + the question + "
        "'<end_of_utterance>\\nAssistant:' without '<|im_start|>', the processor's BOS added, "
        "bf16, 1,024 new tokens); this is SmolVLM's run",)),
    # Models the engine has no family for, which the transformers backend runs.
    "mllama": "VLMEvalKit's llama_vision samples for an Instruct checkpoint (vlm/llama_vision.py "
              "l.33-34: do_sample, temperature 0.6, top_p 0.9), which no deterministic run "
              "reproduces",
}
# qwen3_5_series' MoE entries (config.py at e8e78f05: Qwen3.5-397B-A17B, -122B-A10B) are the dense
# one's class and arguments, so their coverage is its
COVERAGE["qwen3_5_moe"] = dataclasses.replace(COVERAGE["qwen3_5"],
                                              model_class="Qwen3VLChat (Qwen3.5-122B-A10B)")

# e8e78f05: inference.py l.247-273 (SPLIT_THINK), config.py l.1427-1438 (Qwen3-VL-8B-Thinking).
THINKING = ("with SPLIT_THINK set, the prediction is the text after the last </think> (the "
            "reasoning kept as 'thinking'), the whole output where none closes; without it the "
            "whole output is scored. Qwen3-VL-*-Thinking runs sampled with vLLM (temperature 1.0, "
            "top_p 0.95, top_k 20), 40,960 new tokens. Here: --thinking decode, greedy within its "
            "cap, the answer position after </think>; a reasoning past the cap unknown")

PROTOCOL = Protocol(
    "vlmevalkit", "VLMEvalKit's POPE (offline: --judge exact_matching)",
    "VLMEvalKit 0.2rc1 (e8e78f05)", "yorn", vlmevalkit_metrics, "Overall", True,
    lambda v: format(v, "g"),
    ("vlmeval/dataset/image_yorn.py l.31-38 (the bare question), l.91 (score)",
     "vlmeval/dataset/utils/yorn.py l.148-187 (POPE_rating), l.254-261 (YOrN_Extraction)",
     "vlmeval/smp/misc.py l.18-33 (process_punctuation)",
     "vlmeval/vlm/llava/llava.py, vlmeval/vlm/qwen2_vl/prompt.py, vlmeval/vlm/mplug_owl2.py, "
     "vlmeval/vlm/smolvlm.py (prompts, generation)"),
    "the POPE score CSV: F1 (`Overall`), acc, precision, recall in percent, an Overall row over "
    "every split and one per split; with an API judge configured, VLMEvalKit asks GPT for its "
    "Unknown rows, which this does not",
    unknown_is_no=True, covers=by_model_type(COVERAGE), templates=TEMPLATES, thinking=THINKING)
