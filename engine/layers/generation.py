"""What transformers' `generate` does to each step's scores when it decodes greedily, read from the
checkpoint's generation_config.json and the tool's own arguments, and the greedy choice under it.

Every tool that calls `generate` gets the checkpoint's generation config merged under its arguments,
greedy or not: Qwen2-VL's and Qwen2.5-VL's ship repetition_penalty 1.05, which lmms-eval's classes
apply and VLMEvalKit's Qwen2VLChat overrides with 1.0. The processors greedy decoding runs are built
in GenerationMixin._get_logits_processor (transformers 5.24 generation/utils.py l.1430-1600); those
that change which token is the argmax are implemented here, each as its processor computes it
(generation/logits_process.py), the others refused by name. Each row is decoded as generate decodes
it alone (no padding in its input_ids)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

# generation_config fields whose processors change a greedy step's argmax and which the engine does
# not compute: a checkpoint that sets one is refused where its rules are applied, naming it
UNSUPPORTED = ("sequence_bias", "bad_words_ids", "forced_eos_token_id",
               "exponential_decay_length_penalty", "guidance_scale")


def greedy_fields(config: dict) -> dict:
    """The fields of a generation config that a greedy generate's choice depends on, as meta.json
    records them (score --protocol compares the rules a run applied with those the tool's generate
    applies)."""
    names = (*(f.name for f in fields(GreedyRules)), *UNSUPPORTED)
    return {name: config[name] for name in names if config.get(name) is not None}


def rule_fields(config: dict, where: str) -> dict:
    """GreedyRules' fields that a generation config sets, each of the type its transformers
    processor takes (logits_process.py refuses a penalty that is no float and a length or n-gram
    size that is no integer, where it applies them), else a ValueError naming the field."""
    values = {}
    for field in fields(GreedyRules):
        name, default, value = field.name, field.default, config.get(field.name)
        if value is None:
            continue
        if isinstance(default, tuple):
            if not isinstance(value, list) \
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise ValueError(f"{where}: {name} must be a list of token ids, not {value!r}")
            value = tuple(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                or (name == "repetition_penalty" and value <= 0):
            raise ValueError(f"{where}: {name} must be a "
                             f"{'positive' if default == 1.0 else 'non-negative'} number, not "
                             f"{value!r}")
        elif isinstance(default, int) and not isinstance(value, int) and value != 0:
            # 0.0: no processor
            raise ValueError(f"{where}: {name} must be an integer, not {value!r} (transformers' "
                             "generate refuses another number)")
        elif isinstance(default, float) and isinstance(value, int) and value != 1:
            raise ValueError(f"{where}: {name} must be a float, not {value!r} (transformers' "
                             f"generate refuses an integer: write {value}.0)")
        values[name] = type(default)(value)
    return values


@dataclass(frozen=True)
class GreedyRules:
    """The processors of a greedy `generate`, as the fields of generation_config.json that make
    them."""

    # RepetitionPenaltyLogitsProcessor over every id in the prompt and output
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0  # NoRepeatNGramLogitsProcessor
    # MinLengthLogitsProcessor: the eos ids masked while prompt + output is shorter
    min_length: int = 0
    # MinNewTokensLengthLogitsProcessor: the eos ids masked while the output is shorter
    min_new_tokens: int = 0
    suppress_tokens: tuple[int, ...] = ()  # SuppressTokensLogitsProcessor: never chosen
    # SuppressTokensAtBeginLogitsProcessor: not as the first new token
    begin_suppress_tokens: tuple[int, ...] = ()

    @classmethod
    def of(cls, config: dict, where: str) -> "GreedyRules":
        """The rules a generation config (generation_config.json's object; `where` names it in
        errors) sets."""
        for name in UNSUPPORTED:
            value = config.get(name)
            if value is not None and not (name == "guidance_scale" and value == 1):
                raise ValueError(f"{where}: {name} {value!r} changes generate's greedy choice, "
                                 "which the engine does not compute; run without the tool's "
                                 "generation config or remove the field")
        return cls(**rule_fields(config, where))

    @property
    def active(self) -> bool:
        """Whether any rule can change a greedy step's argmax."""
        return self != GreedyRules()

    def start(self, prompts: list[list[int]], vocab: int, stop_ids: set[int], device,
              read_prompt: bool = True) -> "GreedyState":
        """The rows' state before their first new token: `prompts` their input_ids as generate reads
        them; without read_prompt, generate is given the prompt as inputs_embeds alone (LLaVA's and
        LLaVA-NeXT's own generate), so the penalty and the n-gram ban read the new tokens only
        (generation/utils.py l.1486-1499 warns so)."""
        return GreedyState(self, prompts, vocab, stop_ids, device, read_prompt)


class GreedyState:
    """A batch's rows under GreedyRules: what each has read so far (its prompt, then its new
    tokens)."""

    def __init__(self, rules: GreedyRules, prompts: list[list[int]], vocab: int, stop_ids: set[int],
                 device, read_prompt: bool = True):
        self.rules, self.vocab, self.new = rules, vocab, 0
        self.ids = [list(p) if read_prompt else [] for p in prompts]
        # min_length counts the prompt either way (_prepare_generated_length takes it off an
        # inputs_embeds' length)
        self.prompt_lengths = torch.tensor([len(p) for p in prompts], device=device)
        self.stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
        # the ids each row has read (RepetitionPenalty scatters them into the vocabulary; ids
        # outside it, as mPLUG-Owl2's -200 image sentinel, are dropped there)
        self.seen = torch.zeros(len(prompts), vocab, dtype=torch.bool, device=device)
        for row, ids in enumerate(self.ids):
            inside = [t for t in ids if 0 <= t < vocab]
            self.seen[row, inside] = True
        # NoRepeatNGram's n-grams per row, by their first n - 1 tokens: the tokens that
        # complete each
        n = rules.no_repeat_ngram_size
        self.grams: list[dict[tuple[int, ...], set[int]]] = [{} for _ in prompts]
        for ids, grams in zip(self.ids, self.grams) if n else ():
            for end in range(n, len(ids) + 1):
                grams.setdefault(tuple(ids[end - n:end - 1]), set()).add(ids[end - 1])

    def bites(self) -> bool:
        """Whether the rules can change this step's argmax (else the plain argmax is the choice):
        the minimum lengths and begin_suppress_tokens only while they hold."""
        r = self.rules
        return bool(r.repetition_penalty != 1.0 or r.no_repeat_ngram_size or r.suppress_tokens
                    or (self.new == 0 and r.begin_suppress_tokens) or self.new < r.min_new_tokens
                    or bool((self.prompt_lengths + self.new < r.min_length).any()))

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] (fp32, as generate's scores before the processors) → each row's next token
        [B]."""
        return self.process(logits).argmax(dim=-1)

    def process(self, scores: torch.Tensor) -> torch.Tensor:
        """scores [B, V] (a greedy step's logits, or a beam step's log-probabilities) as the
        processors leave them, in their order (a penalty, then -inf for what the others ban)."""
        scores = scores.clone()
        r = self.rules
        if r.repetition_penalty != 1.0:
            # logits_process.py l.426-433: the score divided or, if negative, multiplied
            penalised = torch.where(scores < 0, scores * r.repetition_penalty,
                                    scores / r.repetition_penalty)
            scores = torch.where(self.seen, penalised, scores)
        n = r.no_repeat_ngram_size
        for row, (ids, grams) in enumerate(zip(self.ids, self.grams) if n else ()):
            # l.1150-1170: a token that would complete an n-gram the row has read (none before
            # n - 1 tokens)
            banned = [t for t in grams.get(tuple(ids[len(ids) + 1 - n:]), ())
                      if 0 <= t < self.vocab] if len(ids) >= n else []
            if banned:
                scores[row, banned] = float("-inf")
        lengths = self.prompt_lengths + self.new
        short = (lengths < r.min_length) | torch.tensor(self.new < r.min_new_tokens,
                                                        device=scores.device)
        if bool(short.any()):  # the eos ids masked on the rows still too short
            is_stop = torch.isin(torch.arange(self.vocab, device=scores.device), self.stops)
            scores[short[:, None] & is_stop] = float("-inf")
        suppressed = list(r.suppress_tokens) \
            + (list(r.begin_suppress_tokens) if self.new == 0 else [])
        suppressed = [t for t in suppressed if 0 <= t < self.vocab]
        if suppressed:
            scores[:, suppressed] = float("-inf")
        return scores

    def push(self, tokens: torch.Tensor) -> None:
        """Each row's new token [B] read: it joins what the rules look back on."""
        self.seen[torch.arange(len(self.ids), device=tokens.device), tokens] = True
        n = self.rules.no_repeat_ngram_size
        for ids, grams, token in zip(self.ids, self.grams, tokens.tolist()):
            ids.append(token)
            if n and len(ids) >= n:
                grams.setdefault(tuple(ids[len(ids) - n:-1]), set()).add(token)
        self.new += 1

    def reorder(self, rows: torch.Tensor) -> None:
        """The rows carried over to the next step [B'] (a beam search's surviving beams, each the
        continuation of the row named), with what each has read."""
        picked = rows.tolist()
        self.ids = [list(self.ids[r]) for r in picked]
        self.grams = [{k: set(v) for k, v in self.grams[r].items()} for r in picked]
        self.seen, self.prompt_lengths = self.seen[rows], self.prompt_lengths[rows]
