"""What a run reads at each answer position, decided once from the model's tokenizer and template:
the readouts it decides, the token sets of every logit readout (so that the records can be rescored
under any of them later, without the model), the candidate ids whose logits are recorded, and the
greedy continuation each text readout reads. The engine asks this one object; it knows nothing of
readout kinds itself."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from .continuation import Decode, all_finished, cut, generation_plan
from .readouts import (FIRST_TOKEN, GENERATING, LOGIT, READOUTS, SEQUENCE, Generation, Missing,
                       TokenSets, parse_readouts)
from .templates import Template
from .tokens import derive_token_sets, outside_vocabulary
from .tool_steps import AnswerCut


@dataclass(frozen=True)
class ReadoutPlan:
    names: tuple[str, ...]  # the readouts decided, in registry order
    token_sets: Mapping[str, TokenSets]  # every logit and first-token readout of this vocabulary
    candidate_ids: tuple[int, ...]  # the ids whose logits each answer records: all logit readouts
    generation: Mapping[str, Generation]  # each decided text readout's continuation
    # how a tool makes its rule's text from its whole output, if it does
    answer_cut: AnswerCut | None = None

    @classmethod
    def make(cls, tokenizer, template: Template, spec: str | list[str] | None, *, vocab_size: int,
             max_new_tokens: int | None, positions: int, lengths: Mapping[str, int] | None = None,
             answer_cut: AnswerCut | None = None) -> "ReadoutPlan":
        """The plan for `spec` ("all", None, or readout names) under this tokenizer and template,
        for a model of vocab_size lm_head rows and `positions` positions. A logit readout whose
        fixed ids lie outside the vocabulary is dropped from "all", and refused (ValueError) when
        named. `lengths`: new tokens for some text readouts (a protocol's tool's), in place of their
        references'. `answer_cut`: how a tool's rule reads its text from the whole output instead
        (Settings.answer_cut)."""
        spec = ",".join(spec) if isinstance(spec, list) else spec
        names = parse_readouts(spec)
        explicit = spec is not None and spec.strip() != "all"
        sets = derive_token_sets(tokenizer, template)
        outside = outside_vocabulary(sets, vocab_size)
        asked = [n for n in outside if n in names and explicit]
        if asked:
            raise ValueError("; ".join(f"readout {n}: ids {outside[n]} are outside this model's "
                                       f"vocabulary of {vocab_size} rows" for n in asked))
        token_sets = {n: s for n, s in sets.items() if n not in outside}
        names = [n for n in names if n not in outside]
        ids = sorted({i for n, s in token_sets.items() if READOUTS[n].kind == LOGIT for i in s.ids})
        generation = generation_plan(names, max_new_tokens, positions, lengths)
        if max_new_tokens is not None and generation and max_new_tokens >= positions:
            raise ValueError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the "
                             f"model's {positions} positions (max_position_embeddings)")
        return cls(tuple(names), token_sets, tuple(ids), generation, answer_cut)

    @property
    def generates(self) -> bool:
        """Whether any decided readout reads a greedy continuation."""
        return bool(self.generation)

    @property
    def new_tokens(self) -> int:
        """The longest continuation a decided readout reads (one decoded, each reads its prefix)."""
        return max((g.new_tokens for g in self.generation.values()), default=0)

    @property
    def first_sentence(self) -> bool:
        """Whether a readout's text ends at its first sentence: the continuation can stop there."""
        return any(g.first_sentence for g in self.generation.values())

    def finished(self, rows: list[list[int]], stop_ids: set[int], decode: Decode) -> bool:
        """Whether every row's greedy tokens so far are all that every decided readout reads."""
        return all_finished(rows, stop_ids, self.generation, decode)

    def texts(self, tokens: list[int], stop_ids: set[int], decode: Decode, prompt_ids: list[int],
              decode_special: Decode | None = None) -> dict:
        """What a row's greedy tokens give the readouts (PromptResult's text fields): `decoded`, the
        new tokens up to the first stop token; `texts`, each text readout's own prefix of them;
        `decoded_sequence`, for string_parse_with_prompt, the prompt's ids and its prefix decoded as
        one; `capped`, the readouts whose text its length cut (the answer may go on past what they
        read). Under an answer_cut, its readout's text is the cut of the prompt, that readout's
        prefix and the stop token that ended it, decoded as one (by `decode_special` where the tool
        keeps special tokens), as the tool decodes generate's output.

        Only the new tokens make the text readouts' texts: decoding the prompt too is how published
        InstructBLIP string_parse scores picked up 'yes' from 'Answer yes or no only', which
        string_parse_with_prompt reproduces on purpose."""
        continuation = cut(tokens, stop_ids, self.generation, decode)
        whole = [n for n in self.generation if READOUTS[n].kind == SEQUENCE]
        sequence = None
        if whole:
            sequence = decode(list(prompt_ids)
                              + list(continuation.ids[:continuation.ends[whole[0]]]))
        texts = continuation.texts
        tool = self.answer_cut
        if tool is not None and tool.readout in continuation.ends:
            end, ids = continuation.ends[tool.readout], continuation.ids
            # the stop token generate returns
            ended = [tokens[end]] if end == len(ids) < len(tokens) else []
            decoding = decode_special if tool.special_tokens else decode
            output = decoding([*prompt_ids, *ids[:end], *ended])
            texts = {**texts, tool.readout: tool.cut(output)}
        return {"decoded": continuation.text, "texts": texts, "decoded_sequence": sequence,
                "capped": continuation.capped}

    def capped(self, new_tokens: int) -> "ReadoutPlan":
        """This plan, each text readout's continuation at most `new_tokens` long (a warm-up's)."""
        return replace(self, generation={n: replace(g, new_tokens=min(g.new_tokens, new_tokens))
                                         for n, g in self.generation.items()})

    def at_answer_position(self) -> "ReadoutPlan":
        """The readouts that read the answer position alone (logit and first-token): what a method
        that combines logits there supports, its text readouts needing it inside a decode loop."""
        names = tuple(n for n in self.names if READOUTS[n].kind in (LOGIT, FIRST_TOKEN))
        return replace(self, names=names, generation={})

    def decide(self, answer) -> dict[str, str]:
        """Every decided readout's decision from one answer (Readout.read says what each reads); a
        text readout whose text the answer lacks (a method's combined logits) is left out."""
        out = {}
        for name in self.names:
            try:
                out[name] = READOUTS[name].read(self.token_sets.get(name), answer)
            except Missing:
                if READOUTS[name].kind not in GENERATING:
                    raise
        return out

    def to_meta(self) -> dict:
        """What meta.json records of the plan."""
        return {"readouts": list(self.names),
                "token_sets": {n: s.to_json() for n, s in self.token_sets.items()},
                "candidate_ids": list(self.candidate_ids),
                "generation": {n: g.to_json() for n, g in self.generation.items()}}
