"""Named prompt templates: the Template itself, the audit's own prompts and each family's defaults.

A template renders a question into the exact prompt text, with the model's image marker where the
image goes; the engine expands the marker into image tokens. The answer position is the end of the
rendered prompt, so the template-aware token sets are derived from this same rendering.

The templates named after a tool render that tool's POPE prompt for one model class exactly, byte
for byte; they live in the tool's room (readout/protocols/<tool>.py, beside its sources), and
readout/protocols' registry collects every template with these (`TEMPLATES`, `get_template`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .thinking import closed

YES_NO_SUFFIX = " Answer yes or no only."
# lmms-eval's POPE post_prompt (tasks/pope/pope.yaml, lmms_eval_specific_kwargs.default), which
# LLaVA's own question file llava_pope_test.jsonl carries too: both tools' rooms ask it, and MME's
# asking drops it.
SHORT_ANSWER = "\nAnswer the question using a single word or phrase."


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
    # Plain templates: the text the image adds to the prompt, which a text-only prompt leaves out;
    # None means the marker and the newline after it where one follows, else the marker alone.
    image_part: str | None = None
    # chat templates: the chat template's enable_thinking. False: thinking off as the template
    # allows (its empty think block, or one closed after a block it opens regardless:
    # readout/thinking.py, `--thinking off`), so that the prompt ends where the answer begins; None
    # passes none (a thinking template then opens its reasoning)
    enable_thinking: bool | None = None

    def render(self, question: str, tokenizer=None, system: str | None = None,
               image: bool = True) -> str:
        """The prompt; `system` replaces the template's system text (ICD's disturbance instruction),
        for a chat template as a system message. Without `image`, the prompt of a question asked
        with no image: a chat template's user message holds the text part alone, a plain template
        drops its `image_part`."""
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
        return render_chat(tokenizer, messages, self.enable_thinking)

    def without_image(self) -> str:
        """What a plain template's text loses when no image is asked about (image_part)."""
        if self.image_part is not None:
            return self.image_part
        if not self.image_marker:
            return ""
        marker = self.image_marker
        return marker + "\n" if marker + "\n" in self.text else marker


# where a checkpoint keeps its chat template: transformers reads the first two beside the
# tokenizer's config
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def render_chat(tokenizer, messages: list[dict], enable_thinking: bool | None = None) -> str:
    """The prompt the tokenizer's chat template renders of `messages`, ending in the assistant's
    turn (with enable_thinking where given; False also closes, empty, a reasoning block the template
    still opens); a template that does not parse or raises (jinja's raise_exception) is one
    ValueError naming its file and why."""
    switch = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    try:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                               **switch)
        return closed(prompt) if enable_thinking is False else prompt
    # the template is the checkpoint's code: whatever it raises is its fault
    except Exception as err:  # noqa: BLE001
        line = f" at line {err.lineno}" if isinstance(getattr(err, "lineno", None), int) else ""
        why = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"{chat_template_file(tokenizer)}: its chat template fails{line} "
                         f"({type(err).__name__}: {why})") from None


def chat_template_file(tokenizer) -> str:
    """The tokenizer folder's file holding its chat template, else what names the tokenizer."""
    folder = Path(tokenizer.name_or_path) if getattr(tokenizer, "name_or_path", "") else None
    for path in (folder / name for name in CHAT_TEMPLATE_FILES) if folder else ():
        try:
            own = path.read_text(encoding="utf-8")
            own = own if path.suffix == ".jinja" else json.loads(own).get("chat_template")
        except (OSError, ValueError, AttributeError):  # absent, or not what a template file holds
            continue
        named = own if isinstance(own, list) else [{"template": own}]  # a list: named templates
        if any(isinstance(t, dict) and t.get("template") == tokenizer.chat_template for t in named):
            return str(path)
    return f"{folder or 'the tokenizer'} (its tokenizer's chat template)"


OWN_TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("llava_plain", "USER: <image>\n{question}\nASSISTANT:", "<image>",
                 "pope-audit (arXiv 2610.25964), the paper's LLaVA-1.5 prompt"),
        Template("llava_yesno", "USER: <image>\n{question}" + YES_NO_SUFFIX + "\nASSISTANT:",
                 "<image>", "the multi-model audit's LLaVA prompt"),
        Template("mistral_inst", "[INST] <image>\n{question}" + YES_NO_SUFFIX + " [/INST]",
                 "<image>", "LLaVA-1.6-Mistral instruction format"),
        Template("instructblip", "Question: {question}" + YES_NO_SUFFIX + " Answer:", "",
                 "InstructBLIP (the image enters through the Q-Former, not the text)"),
        Template("mplug_owl2", "USER: <|image|>{question}" + YES_NO_SUFFIX + "\nASSISTANT:",
                 "<|image|>", "pope-audit (arXiv 2610.25964), the paper's mPLUG-Owl2 prompt"),
        Template("mplug_owl2_conv", "USER: <|image|>{question} ASSISTANT:", "<|image|>",
                 "mPLUG-Owl2's own conv_mplug_owl2, one turn "
                 "(roles USER/ASSISTANT, separator ' ')"),
        Template("qwen2_vl_chat", "", "<|vision_start|><|image_pad|><|vision_end|>",
                 "the tokenizer's chat template, one user message "
                 "[image, question + yes/no instruction]", chat=True),
        Template("qwen3_5_chat", "", "<|vision_start|><|image_pad|><|vision_end|>",
                 "the tokenizer's chat template with enable_thinking=False (Qwen3.5's empty think "
                 "block), one user message [image, question + yes/no instruction]", chat=True,
                 enable_thinking=False),
        Template("llava_onevision_chat", "", "<image>",
                 "the tokenizer's chat template (llava-hf OneVision's processor template), "
                 "one user message [image, question + yes/no instruction]", chat=True),
        Template("gemma3_chat", "", "<start_of_image>",
                 "the tokenizer's chat template (Gemma 3's: the image as '<start_of_image>'), "
                 "one user message [image, question + yes/no instruction]", chat=True),
        Template("gemma4_chat", "", "<|image|>",
                 "the tokenizer's chat template (Gemma 4's: the image as '<|image|>'), "
                 "one user message [image, question + yes/no instruction]", chat=True),
        Template("internvl_chat", "", "<IMG_CONTEXT>",
                 "the tokenizer's chat template (InternVL3-hf's: images as '<IMG_CONTEXT>\\n'), "
                 "one user message [image, question + yes/no instruction]", chat=True),
        Template("idefics3_chat", "", "<image>",
                 "the tokenizer's chat template (Idefics3's, SmolVLM's: the image as '<image>'), "
                 "one user message [image, question + yes/no instruction]", chat=True),
        # the transformers backend's, for a model the engine has no family for: the processor places
        # the image's tokens (the chat template's image part, or before the text where the processor
        # puts them)
        Template("reference_chat", "", "",
                 "the checkpoint's chat template (the transformers backend), one user message "
                 "[image, question + yes/no instruction]", chat=True),
        Template("reference_plain", "{question}" + YES_NO_SUFFIX, "",
                 "the question and the yes/no instruction as the processor takes them "
                 "(a checkpoint without a chat template, on the transformers backend)"),
    )
}

SAMPLE_QUESTION = "Is there a dog in the image?"

