"""Prompt token ids: a bounded memo of a prompt text's ids, and the ids with the image expanded,
shared by the families whose processors repeat one placeholder token once per image feature (LLaVA,
LLaVA-NeXT, Qwen2-VL)."""
from __future__ import annotations

from typing import Callable


class PromptMemo:
    """ids(prompt) computed once per distinct prompt text: POPE asks ~160 distinct questions of 500
    images, so each prompt is tokenized once, not once per image."""

    # The most prompts kept before the memo starts over: far more than a benchmark's distinct
    # question texts (POPE's ~160), so a run tokenizes each once, while a run of ever new texts
    # keeps memory bounded.
    LIMIT = 4096

    def __init__(self, ids: Callable[[str], list[int]]):
        self.ids, self._memo = ids, {}

    def __call__(self, prompt: str) -> list[int]:
        if prompt not in self._memo:
            if len(self._memo) >= self.LIMIT:
                self._memo.clear()
            self._memo[prompt] = self.ids(prompt)
        return self._memo[prompt]


class ExpandedPromptIds:
    """The prompt's token ids with its one image placeholder repeated num_image_tokens times, as the
    processors make them: the expanded text through the tokenizer, specials added.

    That text is kilobytes of placeholders, slow to tokenize once per prompt; tokenizing the prompt
    with one placeholder and repeating its id gives the same ids (the placeholder is a special
    token, split out before anything else sees the text). Whether it does is checked against the
    full tokenization once per template context and token count, and the full path is kept where it
    does not."""

    def __init__(self, tokenizer, placeholder: str, token_id: int):
        self.tokenizer, self.placeholder, self.token_id = tokenizer, placeholder, token_id
        self._checked: dict[tuple, bool] = {}
        self._ids = PromptMemo(lambda prompt: list(tokenizer(prompt)["input_ids"]))

    def __call__(self, prompt: str, num_image_tokens: int) -> list[int]:
        if prompt.count(self.placeholder) != 1:
            raise ValueError(f"prompt must hold exactly one {self.placeholder}: {prompt!r}")
        ids = self._ids(prompt)
        if ids.count(self.token_id) != 1:
            return self._full(prompt, num_image_tokens)
        at = ids.index(self.token_id)
        fast = ids[:at] + [self.token_id] * num_image_tokens + ids[at + 1:]
        before, after = prompt.split(self.placeholder)
        context = (before, after[:1], num_image_tokens)
        if context not in self._checked:
            self._checked[context] = fast == self._full(prompt, num_image_tokens)
        return fast if self._checked[context] else self._full(prompt, num_image_tokens)

    def _full(self, prompt: str, num_image_tokens: int) -> list[int]:
        expanded = prompt.replace(self.placeholder, self.placeholder * num_image_tokens)
        return list(self.tokenizer(expanded)["input_ids"])
