"""A paired run: mitigation methods as passes of the engine's one step (`Engine.run_methods`), each
distinct pass run once for every method that reads it, a contrastive method's passes combined into
its results. Engine takes these from MethodRuns; they ask the engine for its features, prompts and
passes (core.Engine.encode, prompt, run_passes)."""
from __future__ import annotations

import torch

from .inputs.plan import PromptResult, Row, SuffixBatch, without_image
from .methods import Method, Pass
from .models import TextOnlyRefused
from .runner import ImagePrompts


class MethodRuns:
    """Engine's paired runs. `prepared`: core.Prepared per image (None: questions asked without
    one); `_text_logits`: the engine's text-only results (PAI's pass) by token ids, which its
    reset() forgets."""

    _text_logits: dict[tuple[int, ...], PromptResult]

    def run_methods(self, prepared: list, questions: list[list[str]], methods: list[Method]
                    ) -> dict[str, list[list[PromptResult]]]:
        """Each method's PromptResults for the questions of each prepared image (per method, per
        image, per question); a prepared None stands for questions asked without an image (text-only
        prompts), which a method that needs the image refuses (TextOnlyRefused, its
        text_only_refusal). Every distinct pass of the methods runs once (methods.Pass): passes on
        the same features and prompts share their prefixes, the text-only pass is computed once per
        distinct prompt for the engine's lifetime. Only a non-contrastive method's own pass decodes
        (text readouts): the baseline's, VTI's, an Intervention's."""
        if len(prepared) != len(questions):
            raise ValueError(f"run_methods: {len(prepared)} prepared images but {len(questions)} "
                             "question lists; give one list of questions per image")
        if any(p is None for p in prepared):
            for why in [self.text_only_refusal(), *(self.text_only_refusal(m) for m in methods)]:
                if why:
                    raise TextOnlyRefused(why)
        features = self.encode(prepared)
        layers = self.model.lm.dims.num_layers
        wanted = {m.name: m.passes(layers) for m in methods}
        got = self._passes(prepared, features, questions, list(dict.fromkeys(
            p for passes in wanted.values() for p in passes.values())), methods,
            {wanted[m.name]["main"] for m in methods if not m.contrastive})
        later = {m.name: m.later({role: got[p] for role, p in wanted[m.name].items()})
                 for m in methods}
        got |= self._passes(prepared, features, questions, list(dict.fromkeys(
            p for passes in later.values() for p in passes.values())), methods, set())
        wanted = {name: passes | later[name] for name, passes in wanted.items()}
        where = [(i, j) for i, qs in enumerate(questions) for j in range(len(qs))]
        out = {}
        for m in methods:
            passes = wanted[m.name]
            if not m.contrastive:
                out[m.name] = got[passes["main"]]
                continue
            flat = self._combined(m, {role: [got[p][i][j] for i, j in where]
                                      for role, p in passes.items()})
            out[m.name] = [[None] * len(qs) for qs in questions]
            for (i, j), result in zip(where, flat):
                out[m.name][i][j] = result
        return out

    def _passes(self, prepared: list, features: list[torch.Tensor], questions: list[list[str]],
                distinct: list[Pass], methods: list[Method], decoded: set[Pass]
                ) -> dict[Pass, list[list[PromptResult]]]:
        """Every distinct pass's results; passes on the same features and prompts share one prefix,
        each edit in turn. `decoded`: the passes whose records are a method's own (a
        non-contrastive method's one pass), which continue for the text readouts."""
        vocab, residuals = any(m.contrastive for m in methods), any(m.residuals for m in methods)
        got: dict[Pass, list[list[PromptResult]]] = {}
        shared: dict[tuple, list[Pass]] = {}
        for p in distinct:
            if p.image != "none":
                shared.setdefault((p.image, p.system, p.noise_step, p.seed), []).append(p)
        for (kind, system, step, seed), passes in shared.items():
            feats = features if kind == "image" else self.noised_features(prepared, step, seed)
            items = [ImagePrompts(f, [self.prompt(q, system, f is not None) for q in qs],
                                  "" if p is None else p.key)
                     for f, qs, p in zip(feats, questions, prepared)]
            runs = self.run_passes(items, [p.edit for p in passes], vocab=vocab,
                                   decode=[p in decoded for p in passes], residuals=residuals)
            got.update(zip(passes, runs))
        if any(p.image == "none" for p in distinct):
            got[Pass("none")] = self._text_only(features, questions, residuals)
        return got

    def _combined(self, method: Method, results: dict[str, list[PromptResult]]
                  ) -> list[PromptResult]:
        """A contrastive method's results, one batch of rows: its combined logits' argmax, candidate
        columns and log-sum-exp (where recorded), and the probe of its main pass."""
        logits = {role: torch.stack([r.vocab_logits for r in rs]) for role, rs in results.items()}
        combined = method.combine(logits | {f"{role}:lens": torch.stack([r.lens_logits for r in rs])
                                            for role, rs in results.items()
                                            if rs and rs[0].lens_logits is not None})
        ids = list(self.readout.candidate_ids)
        index = torch.tensor(ids, device=combined.device)
        mass = (combined.logsumexp(dim=-1).tolist() if self.settings.record_mass
                else [None] * len(combined))
        return [PromptResult(first_token_id=first, candidate_logits=dict(zip(ids, values)),
                             probe=main.probe, logsumexp=m)
                for first, values, main, m in zip(combined.argmax(dim=-1).tolist(),
                                                  combined[:, index].tolist(), results["main"],
                                                  mass)]

    def _text_only(self, features: list[torch.Tensor], questions: list[list[str]],
                   residuals: bool = False) -> list[list[PromptResult]]:
        """PAI's text-only pass: each prompt's own tokens with its image tokens removed, run whole
        (no image, no edit), one prompt per batch so that its logits are the same bits whichever
        prompts were run before; kept per distinct token sequence for the engine's life, since every
        image that asks a question asks the same text."""
        rows: dict[tuple[int, ...], Row] = {}  # the distinct prompts not yet run, by their ids
        order = []
        for i, (f, qs) in enumerate(zip(features, questions)):
            for j, q in enumerate(qs):
                prompt = self.model.layout(self.prompt(q), f)
                layout = without_image(prompt, self.model.lm.dims.mrope_section)
                order.append((i, j, layout.ids))
                known = self._text_logits.get(layout.ids)
                stale = known is None or (residuals and known.residuals is None)
                if stale and layout.ids not in rows:
                    rows[layout.ids] = Row(len(rows), 0, layout, f[:0])
        for row in rows.values():
            [self._text_logits[row.layout.ids]] = self.runner.run_batch(
                None, SuffixBatch([row], None), None, vocab=True, decode=False, residuals=residuals)
        out = [[None] * len(qs) for qs in questions]
        for i, j, ids in order:
            out[i][j] = self._text_logits[ids]
        return out
