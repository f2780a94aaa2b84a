"""Named prompt templates.

A template renders a question into the exact prompt text, with the model's image marker where the
image goes; the engine expands the marker into image tokens. The answer position is the end of the
rendered prompt, so the template-aware token sets are derived from this same rendering.

Besides the audit's own prompts, the templates named after a tool render that tool's POPE prompt for one
model class exactly, byte for byte (`pope-fast protocols` shows them per family; the sources are cited
in `protocols.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

YES_NO_SUFFIX = " Answer yes or no only."
# lmms-eval's POPE post_prompt (tasks/pope/pope.yaml, lmms_eval_specific_kwargs.default), which LLaVA's
# own question file llava_pope_test.jsonl carries too.
SHORT_ANSWER = "\nAnswer the question using a single word or phrase."
# LLaVA conv_vicuna_v1 (llava/conversation.py l.242-251): what LLaVA-1.5's scripts/v1_5/eval/pope.sh runs
# (--conv-mode vicuna_v1), and lmms-eval's `llava` class.
VICUNA_V1_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
# LLaVA conv_llava_v1 (l.325-335), the "human" wording, which VLMEvalKit's LLaVA class hard-codes
# (vlmeval/vlm/llava/llava.py l.34-37).
LLAVA_V1_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
QWEN_SYSTEM = "You are a helpful assistant."


@dataclass(frozen=True)
class Template:
    name: str
    text: str  # format string with {question}; unused for chat templates
    image_marker: str
    origin: str
    chat: bool = False  # rendered by the tokenizer's own chat template
    # The system text: before the turn, joined by a space (plain templates); a system message (chat
    # templates; "" leaves the chat template's own default, if it has one).
    system: str = ""
    suffix: str = YES_NO_SUFFIX  # chat templates: the text after the question in the user message
    # Plain templates: the text the image adds to the prompt, which a text-only prompt leaves out; None
    # means the marker and the newline after it where one follows, else the marker alone.
    image_part: str | None = None

    def render(self, question: str, tokenizer=None, system: str | None = None, image: bool = True) -> str:
        """The prompt; `system` replaces the template's system text (ICD's disturbance instruction),
        for a chat template as a system message. Without `image`, the prompt of a question asked with
        no image: a chat template's user message holds the text part alone, a plain template drops its
        `image_part`."""
        system = self.system if system is None else system
        if not self.chat:
            text = self.text if image else self.text.replace(self.without_image(), "", 1)
            text = text.format(question=question)
            return f"{system} {text}" if system else text
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"template {self.name} needs a tokenizer with a chat template")
        messages = [{"role": "user", "content": [
            {"type": "image"}] * image + [{"type": "text", "text": question + self.suffix}]}]
        if system:
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def without_image(self) -> str:
        """What a plain template's text loses when no image is asked about (image_part)."""
        if self.image_part is not None:
            return self.image_part
        if not self.image_marker:
            return ""
        return self.image_marker + "\n" if self.image_marker + "\n" in self.text else self.image_marker


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("llava_plain", "USER: <image>\n{question}\nASSISTANT:", "<image>",
                 "pope-audit (arXiv 2610.25964), the paper's LLaVA-1.5 prompt"),
        Template("llava_yesno", "USER: <image>\n{question}" + YES_NO_SUFFIX + "\nASSISTANT:", "<image>",
                 "the multi-model audit's LLaVA prompt"),
        Template("llava_official", "USER: <image>\n{question}" + SHORT_ANSWER + " ASSISTANT:", "<image>",
                 "LLaVA-1.5 scripts/v1_5/eval/pope.sh: model_vqa_loader, conv vicuna_v1, llava_pope_test.jsonl's "
                 "text (lmms-eval's `llava` class renders the same)", system=VICUNA_V1_SYSTEM),
        Template("mistral_inst", "[INST] <image>\n{question}" + YES_NO_SUFFIX + " [/INST]", "<image>",
                 "LLaVA-1.6-Mistral instruction format"),
        Template("instructblip", "Question: {question}" + YES_NO_SUFFIX + " Answer:", "",
                 "InstructBLIP (the image enters through the Q-Former, not the text)"),
        Template("mplug_owl2", "USER: <|image|>{question}" + YES_NO_SUFFIX + "\nASSISTANT:", "<|image|>",
                 "pope-audit (arXiv 2610.25964), the paper's mPLUG-Owl2 prompt"),
        Template("mplug_owl2_conv", "USER: <|image|>{question} ASSISTANT:", "<|image|>",
                 "mPLUG-Owl2's own conv_mplug_owl2, one turn (roles USER/ASSISTANT, separator ' ')"),
        Template("qwen2_vl_chat", "", "<|vision_start|><|image_pad|><|vision_end|>",
                 "the tokenizer's chat template, one user message [image, question + yes/no instruction]",
                 chat=True),
        Template("llava_onevision_chat", "", "<image>",
                 "the tokenizer's chat template (llava-hf OneVision's processor template), one user message "
                 "[image, question + yes/no instruction]", chat=True),
        Template("gemma3_chat", "", "<start_of_image>",
                 "the tokenizer's chat template (Gemma 3's: the image as '<start_of_image>'), one user message "
                 "[image, question + yes/no instruction]", chat=True),
        Template("internvl_chat", "", "<IMG_CONTEXT>",
                 "the tokenizer's chat template (InternVL3-hf's: images as '<IMG_CONTEXT>\\n'), one user message "
                 "[image, question + yes/no instruction]", chat=True),
        # lmms-eval v0.7.2: its post_prompt after the question, in each model class's own prompt.
        Template("lmms_eval_llava_hf", "USER: <image>\n{question}" + SHORT_ANSWER + " ASSISTANT:", "<image>",
                 "lmms-eval llava_hf (chat class): the llava-hf processor's template (LLaVA-1.5, LLaVA-1.6-Vicuna)"),
        Template("lmms_eval_mistral", "[INST] <image>\n{question}" + SHORT_ANSWER + " [/INST]", "<image>",
                 "lmms-eval llava_hf (chat class): the LLaVA-1.6-Mistral processor's template"),
        Template("lmms_eval_instructblip", "{question}" + SHORT_ANSWER, "",
                 "lmms-eval instructblip: the task text alone, to the Q-Former and the language model"),
        Template("lmms_eval_qwen2_vl", "", "<|vision_start|><|image_pad|><|vision_end|>",
                 "lmms-eval qwen2_vl: its system message, then [image, question + post_prompt]", chat=True,
                 system=QWEN_SYSTEM, suffix=SHORT_ANSWER),
        Template("lmms_eval_gemma3", "", "<start_of_image>",
                 "lmms-eval gemma3: its system message, then [image, question + post_prompt], through the "
                 "processor's chat template", chat=True, system=QWEN_SYSTEM, suffix=SHORT_ANSWER),
        Template("lmms_eval_internvl_hf", "", "<IMG_CONTEXT>",
                 "lmms-eval internvl_hf (chat class): the processor's chat template over [image, question + "
                 "post_prompt], no system message", chat=True, suffix=SHORT_ANSWER),
        # VLMEvalKit e8e78f05: POPE adds no suffix but for Qwen2-VL.
        Template("vlmevalkit_llava", "USER:  <image> {question} ASSISTANT: ", "<image>",
                 "VLMEvalKit LLaVA: system + 'USER: ' + ' <image> ' + question + ' ASSISTANT: '",
                 system=LLAVA_V1_SYSTEM, image_part=" <image> "),
        Template("vlmevalkit_mistral", "[INST] <image>\n{question} [/INST]", "<image>",
                 "VLMEvalKit LLaVA_Next: the LLaVA-1.6-Mistral processor's template over the bare question"),
        Template("vlmevalkit_vicuna_hf", "USER: <image>\n{question} ASSISTANT:", "<image>",
                 "VLMEvalKit LLaVA_Next: the LLaVA-1.6-Vicuna processor's template over the bare question"),
        Template("vlmevalkit_qwen2_vl", "", "<|vision_start|><|image_pad|><|vision_end|>",
                 "VLMEvalKit Qwen2VLChat (Qwen2-VL): [image, question + ' Please answer yes or no.'], the chat "
                 "template's default system", chat=True, suffix=" Please answer yes or no."),
        Template("vlmevalkit_qwen2_5_vl", "", "<|vision_start|><|image_pad|><|vision_end|>",
                 "VLMEvalKit Qwen2VLChat (Qwen2.5-VL) and Qwen3VLChat, use_custom_prompt=False: [image, the bare "
                 "question] through the checkpoint's chat template (its default system, if it has one)", chat=True,
                 suffix=""),
        Template("vlmevalkit_gemma3", "", "<start_of_image>",
                 "VLMEvalKit Gemma3: its system prompt 'You are a helpful assistant. ', then [image, the bare "
                 "question], through the processor's chat template", chat=True, system="You are a helpful assistant. ",
                 suffix=""),
        Template("vlmevalkit_llava_onevision",
                 "<|im_start|>user \n<image>\n{question}<|im_end|><|im_start|>assistant\n", "<image>",
                 "VLMEvalKit LLaVA_OneVision_HF: the llava-hf processor's chat template over one text part, "
                 "'<image>\\n' + question (the image part becomes text, so the template renders no image)"),
        Template("vlmevalkit_mplug_owl2", "USER: <|image|>{question} \nASSISTANT: ", "<|image|>",
                 "VLMEvalKit mPLUG_Owl2: 'USER: <|image|>' + question + ' \\nASSISTANT: '"),
    )
}

SAMPLE_QUESTION = "Is there a dog in the image?"


def get_template(name: str) -> Template:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}") from None
