"""Named prompt templates.

A template renders a question into the exact prompt text, with the model's image marker where the
image goes; the engine expands the marker into image tokens. The answer position is the end of the
rendered prompt, so the template-aware token sets are derived from this same rendering.
"""
from __future__ import annotations

from dataclasses import dataclass

YES_NO_SUFFIX = " Answer yes or no only."
VICUNA_V1_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)


@dataclass(frozen=True)
class Template:
    name: str
    text: str  # format string with {question}; unused for chat templates
    image_marker: str
    origin: str
    chat: bool = False  # rendered by the tokenizer's own chat template
    system: str = ""  # the system text before the turn (plain templates), joined by a space

    def render(self, question: str, tokenizer=None, system: str | None = None) -> str:
        """The prompt; `system` replaces the template's system text (ICD's disturbance instruction),
        for a chat template as a system message."""
        if not self.chat:
            text = self.text.format(question=question)
            system = self.system if system is None else system
            return f"{system} {text}" if system else text
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"template {self.name} needs a tokenizer with a chat template")
        messages = [{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": question + YES_NO_SUFFIX}]}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("llava_plain", "USER: <image>\n{question}\nASSISTANT:", "<image>",
                 "pope-audit (arXiv 2610.25964), the paper's LLaVA-1.5 prompt"),
        Template("llava_yesno", "USER: <image>\n{question}" + YES_NO_SUFFIX + "\nASSISTANT:", "<image>",
                 "the multi-model audit's LLaVA prompt"),
        Template("llava_official",
                 "USER: <image>\n{question}\nAnswer the question using a single word or phrase. ASSISTANT:",
                 "<image>", "LLaVA-1.5 eval_pope: vicuna_v1 conversation", system=VICUNA_V1_SYSTEM),
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
    )
}

SAMPLE_QUESTION = "Is there a dog in the image?"


def get_template(name: str) -> Template:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}") from None
