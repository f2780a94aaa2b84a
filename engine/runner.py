"""The one-step prefill: a call's prompts (their features and text) → rows with their layouts → the
batching plan (`plan.make_plan`) → each stage's distinct prefixes prefilled once, then its suffix
batches against them → candidate logits and the argmax at each answer position → (only for text
readouts) a greedy continuation, or a sampled one (sampling.py) → one PromptResult per prompt.

The Runner holds what every batch needs (the model, settings and readout plan) and counts the work
it does; the Engine above it decides what to run (images, methods, passes)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import torch

from ..readout.readout_plan import ReadoutPlan
from .layers.attention import PrefixKV
from .layers.beam import BeamSearch
from .layers.generation import GreedyRules, GreedyState
from .layers.interventions import Intervention
from .models import Family
from .inputs.plan import (PrefixGroup, PromptLayout, PromptResult, Row, Stage, SuffixBatch,
                          TokenBatch, make_plan)
from .layers.sampling import SampledState, Warpers, row_seed
from .utils.settings import Settings
from .utils.stats import Clock, Counts, Timings


@dataclass(frozen=True)
class ImagePrompts:
    """One image's features (what its family's encode_images gave) and the prompts asked of it;
    features None: text-only prompts, asked of no image (rendered without the image marker)."""

    features: torch.Tensor | None
    prompts: list[str]
    # the image's key (Prepared.key): with each prompt, what seeds a sampled continuation
    key: str = ""


DECODE_TICK = 32  # new tokens between two calls of Runner.on_decode


@dataclass
class Launched:
    """A question batch whose work is queued on the device, its results not yet read back
    (Runner.results): a caller that launches the next batch first keeps the device busy while the
    host reads and builds these."""

    rows: list[Row]
    first: torch.Tensor  # [B] the argmax at each answer position
    logits: torch.Tensor  # [B, n] fp32 candidate logits
    texts: list[dict]  # each row's continuation's fields (empty without one)
    image_attention: torch.Tensor | None  # [B, L, Hq], the probe's
    vocab: torch.Tensor | None  # [B, V], where asked for
    logsumexp: torch.Tensor | None = None  # [B], where settings.record_mass
    residuals: torch.Tensor | None = None  # [B, L, H], where asked for
    lens: torch.Tensor | None = None  # [B, V], where the intervention names lens_layers


class Runner:
    def __init__(self, model: Family, settings: Settings, readout: ReadoutPlan,
                 on_decode: Callable[[int, int, int], None] | None = None):
        self.model, self.settings, self.readout = model, settings, readout
        self.timings, self.counts = Timings(), Counts()
        self._decode = partial(model.tokenizer.decode, skip_special_tokens=True)
        # a tool's answer cut
        self._decode_special = partial(model.tokenizer.decode, skip_special_tokens=False)
        # the length alone ends a continuation, unless a readout's text ends at its first sentence
        self._finished = partial(readout.finished, stop_ids=model.stop_ids, decode=self._decode) \
            if readout.first_sentence else None
        self.rules = self._rules() if readout.generates else GreedyRules()
        # told (new tokens so far, the most a row may take, rows) as a greedy continuation goes: a
        # long one (a tool's 2,048 tokens) otherwise shows nothing until its batch is recorded
        self.on_decode = on_decode

    def _ticked(self, steps: int, most: int, rows: int) -> None:
        if steps % DECODE_TICK == 0:
            self.on_decode(steps, most, rows)

    def _rules(self) -> GreedyRules:
        """What a continuation's every step applies besides the argmax: the checkpoint's generation
        config where the settings apply it, under the tool's own arguments (refused at load where it
        sets what the engine does not compute)."""
        s = self.settings
        config = self.model.generation_config if s.generation_config != "none" else {}
        rules = GreedyRules.of(config, str(self.model.folder / "generation_config.json"))
        tool = {"min_new_tokens": s.min_new_tokens} if s.min_new_tokens else {}
        if s.repetition_penalty is not None:
            tool |= {"repetition_penalty": float(s.repetition_penalty)}
        return replace(rules, **tool)

    def rows(self, items: list[ImagePrompts]) -> list[Row]:
        """One Row per (image, prompt): its layout and the features its image slots take
        (InstructBLIP's come from a Q-Former that reads the prompt, run here for every prompt in one
        batch). An item without features holds text-only prompts: their layouts come from the
        family's text_layout (which refuses where the family cannot run one) before any image
        work."""
        model = self.model
        text = {(i, j): self._checked(model.text_layout(prompt)) for i, item in enumerate(items)
                if item.features is None for j, prompt in enumerate(item.prompts)}
        with_image = [item for item in items if item.features is not None]
        if model.features_per_prompt and with_image:
            with Clock(self.timings, "image_encode", self.settings.torch_device):
                encoded = iter(model.prompt_features(with_image))
        else:
            encoded = iter([item.features] * len(item.prompts) for item in with_image)
        per_prompt = [[None] * len(item.prompts) if item.features is None else next(encoded)
                      for item in items]
        return [Row(i, j, text[i, j] if f is None else self._checked(model.layout(prompt, f)), f,
                    item.key)
                for i, (item, features) in enumerate(zip(items, per_prompt))
                for j, (prompt, f) in enumerate(zip(item.prompts, features))]

    def plan(self, rows: list[Row], prefix_reuse: bool | None = None) -> list[Stage]:
        reuse = self.settings.prefix_reuse if prefix_reuse is None else prefix_reuse
        return make_plan(rows, self.question_rows, reuse)

    @property
    def question_rows(self) -> int:
        """The rows of a question batch: the settings', or the device's
        budget for this model's rows."""
        return self.settings.rows_for(self.model.lm.dims.row_state_bytes)

    def _checked(self, layout: PromptLayout) -> PromptLayout:
        """A layout the model can run, refused before anything is
        allocated for it where it cannot."""
        dims = self.model.lm.dims
        if len(layout) > dims.max_positions:
            raise ValueError(f"a {len(layout)}-token prompt (its image's tokens included) exceeds "
                             f"the model's {dims.max_positions} positions "
                             "(max_position_embeddings)")
        return layout

    def _steps(self, prompt_length: int) -> int:
        """New tokens a prompt of this length may take: the longest a readout asks, within the
        model's positions (and the tool's max_length, where it sets one over the prompt); a
        continuation cut there is `capped`, and its readouts say so."""
        limit = self.model.lm.dims.max_positions
        limit = limit if self.settings.max_length is None else min(limit, self.settings.max_length)
        return max(1, min(self.readout.new_tokens, limit - prompt_length))

    def _tokens(self, rows: list[Row], start: int, end: int | None) -> TokenBatch:
        return TokenBatch.of(rows, start, end, self.settings.torch_device,
                             mrope=self.model.lm.dims.mrope_section is not None)

    def prefill_prefix(self, group: PrefixGroup, intervention: Intervention | None) -> PrefixKV:
        with Clock(self.timings, "prefix_prefill", self.settings.torch_device):
            tokens = self._tokens(group.rows, 0, group.length)
            prefix = self.model.lm.prefill_prefix(tokens, intervention)
        self.counts.prefix_tokens += group.length * len(group.rows)
        return prefix

    def run_batch(self, prefix: PrefixKV | None, batch: SuffixBatch,
                  intervention: Intervention | None, *, vocab: bool = False, decode: bool = True,
                  residuals: bool = False) -> list[PromptResult]:
        """One suffix batch: prefill, the answer position's candidate logits and argmax (with vocab,
        the whole vocabulary's logits too; with residuals, every layer's output there), and the
        greedy continuation when a text readout asks for one."""
        return self.results(self.launch(prefix, batch, intervention, vocab=vocab, decode=decode,
                                        residuals=residuals))

    def launch(self, prefix: PrefixKV | None, batch: SuffixBatch, intervention: Intervention | None,
               *, vocab: bool = False, decode: bool = True, residuals: bool = False) -> "Launched":
        """run_batch's work, queued on the device, its results not read back (`results`)."""
        lm, device = self.model.lm, self.settings.torch_device
        ids = list(self.readout.candidate_ids)
        start = prefix.length if prefix is not None else 0
        lens = None if intervention is None else intervention.lens_layers
        if intervention is not None:
            intervention.rows(batch.rows)
        with Clock(self.timings, "question_prefill", device):
            tokens = self._tokens(batch.rows, start, None)
            out = lm.prefill_suffix(prefix, batch.slots, tokens, intervention,
                                    self.settings.probe != "none", residuals or lens is not None)
            logits, first = lm.answer(out.last_hidden, ids)
            everything = lm.vocab_logits(out.last_hidden) if vocab else None
            mass = lm.vocab_logsumexp(out.last_hidden) if self.settings.record_mass else None
            lensed = None if lens is None else lm.lens_logits(out.residuals, *lens)
            if intervention is not None:
                adjusted = intervention.logits(logits, ids)
                if adjusted is not None and mass is not None:
                    raise ValueError(f"record_mass: {type(intervention).__name__}.logits edits the "
                                     "candidate logits alone, so the whole vocabulary's "
                                     "log-sum-exp would not be theirs")
                logits = logits if adjusted is None else adjusted
        self.counts.prompts += len(batch.rows)
        # the host's: no read back
        self.counts.suffix_tokens += sum(len(row.layout) - start for row in batch.rows)
        texts = [{}] * len(batch.rows)
        if self.readout.generates and decode:
            texts = self._continue(prefix, batch, out, first, intervention)
        return Launched(batch.rows, first, logits, texts, out.image_attention, everything, mass,
                        out.residuals if residuals else None, lensed)

    def results(self, launched: "Launched") -> list[PromptResult]:
        """A launched batch's PromptResults, read back from the device (waiting for it
        where it has not finished)."""
        ids, rows = list(self.readout.candidate_ids), launched.rows
        attention = launched.image_attention
        # per layer: heads averaged, and each head; none for a row with no
        # image keys (a text-only prompt)
        probes = [None] * len(rows) if attention is None else \
            [{"image_attention": layers, "image_attention_heads": heads}
             if row.layout.image_spans else None
             for layers, heads, row in zip(attention.mean(dim=-1).tolist(), attention.tolist(),
                                           rows)]
        vocab, streams, lens = ([None] * len(rows) if t is None else list(t)
                                for t in (launched.vocab, launched.residuals, launched.lens))
        mass = [None] * len(rows) if launched.logsumexp is None else launched.logsumexp.tolist()
        # (text, token count)
        thought = [(None, None) if row.reasoning is None else row.reasoning for row in rows]
        return [PromptResult(first_token_id=f, candidate_logits=dict(zip(ids, values)), probe=probe,
                             vocab_logits=v, logsumexp=m, residuals=r, lens_logits=lo,
                             reasoning=said, reasoning_tokens=n, **text)
                for f, values, text, probe, v, m, r, lo, (said, n) in zip(
                    launched.first.tolist(), launched.logits.tolist(), launched.texts, probes,
                    vocab, mass, streams, lens, thought)]

    def reason(self, prefix: PrefixKV | None, batch: SuffixBatch, most: int, stop_ids: set[int],
               reserve: int) -> list[list[int]]:
        """Each row's greedy tokens after its prompt (the argmax at every step, no rules), at most
        `most` and within the model's positions less `reserve`, up to and including the first of
        stop_ids (a thinking checkpoint's reasoning, engine/thinking.py)."""
        lm, device = self.model.lm, self.settings.torch_device
        with Clock(self.timings, "decode", device):
            tokens = self._tokens(batch.rows, prefix.length if prefix is not None else 0, None)
            out = lm.prefill_suffix(prefix, batch.slots, tokens, None, False)
            first = lm.answer(out.last_hidden, list(self.readout.candidate_ids))[1]
            allowed = [max(1, min(most, lm.dims.max_positions - len(row.layout) - reserve))
                       for row in batch.rows]
            generated = lm.decode(prefix, batch.slots, out.kv, first, max(allowed),
                                  stop_ids).tolist()
        self.counts.decode_steps += (len(generated[0]) - 1) * len(batch.rows)
        return [ids[:next((k + 1 for k, t in enumerate(ids) if t in stop_ids), len(ids))][:steps]
                for ids, steps in zip(generated, allowed)]

    def _rules_state(self, rows: list[Row], beams: int = 1) -> GreedyState | SampledState | None:
        """The rows' rules, each row's prompt read `beams` times over (its beams side by side), or
        None; where the settings sample, the rows' draws under them."""
        s = self.settings
        greedy = None
        if self.rules.active:
            prompts = [list(row.layout.ids) for row in rows for _ in range(beams)]
            greedy = self.rules.start(prompts, self.model.lm.dims.vocab_size, self.model.stop_ids,
                                      s.torch_device, s.generation_config != "greedy_output")
        if not s.do_sample:
            return greedy
        seeds = [row_seed(s.seed, row.key, row.layout.ids) for row in rows]
        return SampledState(Warpers(s.temperature, s.top_k, s.top_p), seeds, s.torch_device, greedy)

    def _continue(self, prefix, batch: SuffixBatch, out, first: torch.Tensor,
                  intervention) -> list[dict]:
        """The batch's continuation (greedy, or the tool's beam search), and what each
        row's gives its text readouts."""
        lm, s = self.model.lm, self.settings
        # each row takes its own allowance, whatever it is batched with: the
        # batch runs to the longest one
        allowed = [self._steps(len(row.layout)) for row in batch.rows]
        with Clock(self.timings, "decode", s.torch_device):
            if s.num_beams > 1:
                # False: generate's default early_stopping, which LAVIS keeps
                search = BeamSearch(len(batch.rows), s.num_beams, allowed, self.model.stop_ids,
                                    s.length_penalty, False, s.torch_device)
                generated = lm.beam_decode(prefix, batch.slots, out.kv,
                                           lm.vocab_logits(out.last_hidden), search,
                                           self._rules_state(batch.rows, s.num_beams), intervention)
                self.counts.decode_steps += search.new * s.num_beams * len(batch.rows)
            else:
                greedy = self._rules_state(batch.rows)
                # the first new token: the answer position's argmax, unless the rules choose another
                if greedy is not None and greedy.bites():
                    first = greedy.choose(lm.vocab_logits(out.last_hidden)).to(first.dtype)
                tick = None if self.on_decode is None else partial(self._ticked, most=max(allowed),
                                                                      rows=len(batch.rows))
                generated = lm.decode(prefix, batch.slots, out.kv, first, max(allowed),
                                      self.model.stop_ids, intervention, self._finished,
                                      greedy=greedy, tick=tick)
                self.counts.decode_steps += (generated.shape[1] - 1) * len(batch.rows)
                generated = generated.tolist()
        # the prompt's own ids: image slots are special tokens, skipped when decoded anyway (an
        # answer cut reads past the prompt's closing marker, which follows them)
        return [self.readout.texts(tokens[:steps], self.model.stop_ids, self._decode,
                                   [t for t in row.layout.ids if t != row.layout.image_token_id],
                                   self._decode_special)
                for row, tokens, steps in zip(batch.rows, generated, allowed)]
