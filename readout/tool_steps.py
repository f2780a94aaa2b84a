"""What a tool does beyond its prompt and length, as the engine's settings name it: its steps (image
handling and generate's options, each an engine Settings field) and how it cuts its answer out of
generate's whole output. A protocol's coverage sets them (protocols/base.py `Coverage`), a readout
plan carries the cut, and a comparison holds two runs to the same steps (compare.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# What a tool does to each image and to its generate beyond the prompt and length, each an engine
# Settings field of the same name and default (meta.json's settings and coverage record each only
# where it is not the default).
TOOL_STEPS = ("image_reencode", "image_resize", "processor_pixels", "processor_patches",
              "min_new_tokens", "answer_cut", "image_mask", "generation_config",
              "repetition_penalty", "num_beams", "length_penalty", "max_length", "do_sample",
              "temperature", "top_k", "top_p")


@dataclass(frozen=True)
class AnswerCut:
    """How a tool makes its answer from generate's whole output (the prompt, the new tokens and the
    stop token that ended them, decoded as one), where it does not decode the new tokens alone
    (Settings.answer_cut)."""

    # the tool's rule, whose text this is (the other readouts read the new tokens, as theirs do)
    readout: str
    special_tokens: bool  # decoded with the special tokens (skip_special_tokens=False), or without
    cut: Callable[[str], str]  # that text → the tool's answer


def llava_answer(whole: str) -> str:
    """VLMEvalKit's LLaVA_Next answer (vlm/llava/llava.py generate_inner l.392-394, output_process
    l.311-330) from generate's whole output decoded with its special tokens (the
    `skip_special_token=True` it passes is no decode argument): '<s>' removed and the text stripped;
    the part after the first '[/INST]' (else 'ASSISTANT:', 'assistant\n', the third after
    '<|end_header_id|>\n\n'), which the prompt ends with, up to a second one; then up to the first
    '</s>' (else '<|im_end|>', '<|eot_id|>'), stripped; '<unk>' removed."""
    answer = whole.replace("<s>", "").strip() if "<s>" in whole else whole
    for marker, part in (("[/INST]", 1), ("ASSISTANT:", 1), ("assistant\n", 1),
                         ("<|end_header_id|>\n\n", 2)):
        if marker in answer:
            answer = answer.split(marker)[part].strip()
            break
    for end in ("</s>", "<|im_end|>", "<|eot_id|>"):
        if end in answer:
            answer = answer.split(end)[0].strip()
            break
    return answer.replace("<unk>", "")


# How a tool makes its answer from generate's whole output (Settings.answer_cut; "none": the new
# tokens up to the stop token, decoded without special tokens, as most tools and every reference
# decode): VLMEvalKit's LLaVA_Next cuts it out (llava_answer); lmms-eval's instructblip decodes it
# whole without special tokens and strips it (models/simple/instructblip.py l.216), the prompt's
# text included, since transformers 4.47 returns the prompt's ids first
# (InstructBlipForConditionalGeneration.generate passes input_ids on). Here, not in the tools'
# rooms: each is a step the engine takes (a Settings name), as the other TOOL_STEPS are; the rooms
# name them.
ANSWER_CUTS: dict[str, AnswerCut] = {"vlmevalkit_llava": AnswerCut("yorn", True, llava_answer),
                                     "lmms_eval_whole": AnswerCut("exact_match", False, str.strip)}
