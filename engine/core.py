"""The engine: load a checkpoint once, then answer yes/no questions about images under every readout.

Per call: projected features per image (cached by content) → each prompt's layout from its family →
a plan of prefix groups and suffix batches (`plan.make_plan`) → the shared prefixes prefilled once →
the question suffixes prefilled in batches against them → candidate logits and the argmax at each
answer position → (only for string readouts) a short greedy continuation → one PromptResult per
prompt, and its decisions from `Engine.decide`.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from PIL import Image

from ..readout import READOUTS, Template, TokenSets, derive_token_sets, get_template, parse_readouts
from ..readout.templates import SAMPLE_QUESTION
from ..readout.continuation import all_finished, cut, generation_plan
from ..readout.protocols import FIRST_TOKEN, GENERATING, LOGIT, SEQUENCE, TEXT
from ..readout.tokens import outside_vocabulary, tokenizer_info
from .models import Family, load_model
from .fingerprint import checkpoint_digests
from .images import DECODE_ERRORS, ImageError, LoadedImage, read_image, to_rgb
from .attention import PrefixKV
from .interventions import Intervention, changes_prefix
from .methods import Method, Pass, diffusion_noise, noise_generator
from .plan import PrefixGroup, PromptLayout, PromptResult, Row, SuffixBatch, TokenBatch, make_plan
from .settings import Settings
from .stats import Clock, Counts, Timings
from .vision_cache import VisionCache, feature_key

__all__ = ["Answer", "Engine"]

# Modes a PNG holds as they are; any other in-memory image is converted first, as preprocessing
# converts it when the same image comes from a file.
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")


@dataclass
class Answer(PromptResult):
    """One question's raw outputs at the answer position (a PromptResult), the question, and its decisions."""

    question: str = ""
    predictions: dict[str, str] = field(default_factory=dict)


class Engine:
    def __init__(self, model, settings: Settings, template: Template | str | None = None,
                 readouts: str | list[str] | None = None, cache: VisionCache | None = None):
        self.model, self.settings = model, settings
        self.template = get_template(template or model.default_template) if not isinstance(template, Template) \
            else template
        if self.template.image_marker != model.image_marker:
            raise ValueError(f"template {self.template.name} marks the image with {self.template.image_marker!r}, "
                             f"but {model.family} expects {model.image_marker!r}")
        spec = ",".join(readouts) if isinstance(readouts, list) else readouts
        self.readouts = parse_readouts(spec)
        explicit = spec is not None and spec.strip() != "all"
        self.cache = cache or VisionCache()
        # Token sets of every logit readout are derived (not only the requested ones) so that the
        # records can be re-scored under any of them later without the model; one whose fixed ids
        # this vocabulary lacks is dropped, or refused when it was asked for.
        sets = derive_token_sets(model.tokenizer, self.template)
        outside = outside_vocabulary(sets, model.lm.dims.vocab_size)
        asked = [n for n in outside if n in self.readouts and explicit]
        if asked:
            raise ValueError("; ".join(f"readout {n}: ids {outside[n]} are outside this model's vocabulary of "
                                       f"{model.lm.dims.vocab_size} rows" for n in asked))
        self.token_sets: dict[str, TokenSets] = {n: s for n, s in sets.items() if n not in outside}
        self.readouts = [n for n in self.readouts if n not in outside]  # "all" means all this model has
        self.candidate_ids = sorted({i for n, s in self.token_sets.items() if READOUTS[n].kind == LOGIT for i in s.ids})
        self.timings, self.counts = Timings(), Counts()
        self._preprocess = model.preprocess_settings()  # part of every feature-cache key
        self._file_digests: dict[str, str] | None = None  # the checkpoint's sha256s, hashed on first meta()
        self._text_logits: dict[tuple[int, ...], PromptResult] = {}  # text-only prompts (PAI), by token ids
        # Each text readout generates as its reference does (or settings.max_new_tokens, all alike): one
        # continuation runs to the longest of them, and each readout reads its own prefix of it (_text).
        self.generate = any(READOUTS[n].kind in GENERATING for n in self.readouts)
        self.generation = generation_plan(self.readouts, settings.max_new_tokens, model.lm.dims.max_positions)
        self.new_tokens = max((g.new_tokens for g in self.generation.values()), default=0)
        decode = partial(model.tokenizer.decode, skip_special_tokens=True)
        self._finished = partial(all_finished, stop_ids=model.stop_ids, plan=self.generation, decode=decode) \
            if any(g.first_sentence for g in self.generation.values()) else None  # else the length alone ends it
        if settings.max_new_tokens is not None and self.generate and \
                settings.max_new_tokens >= model.lm.dims.max_positions:
            raise ValueError(f"max_new_tokens {settings.max_new_tokens} leaves no room for a prompt in the model's "
                             f"{model.lm.dims.max_positions} positions (max_position_embeddings)")

    @classmethod
    def load(cls, folder: str | Path, settings: Settings | None = None, *, template: str | None = None,
             readouts: str | list[str] | None = None, cache_dir: str | Path | None = None) -> "Engine":
        settings = settings or Settings()
        return cls(load_model(folder, settings), settings, template, readouts, VisionCache(cache_dir))

    def warmup(self) -> None:
        """One untimed image batch through every step a sweep takes (preprocessing, vision, prefixes,
        a full question batch, and decoding when a string readout asks for it), so one-time costs land
        here rather than in the first batch: Triton compiles, CUDA and oneDNN setup for these shapes,
        allocator growth. Nothing is cached; timings and counts restart."""
        image = Image.new("RGB", (640, 480), (124, 116, 104))
        pixels = [self.model.preprocess(image)] * self.settings.image_batch
        prompts = [self.prompt(SAMPLE_QUESTION)] * max(1, self.settings.batch_size // self.settings.image_batch)
        self.run_images([(features, prompts) for features in self.model.encode_images(pixels)])
        if self.settings.torch_device.type == "cuda":
            torch.cuda.synchronize(self.settings.torch_device)
        self.reset()

    def reset(self, clear_cache: bool = False) -> None:
        """Timings and counts restart; with clear_cache, cached image features and text-only logits are
        forgotten too (an empty in-memory cache replaces the engine's), so the next sweep runs cold."""
        self.timings, self.counts = Timings(), Counts()
        if clear_cache:
            self.cache = VisionCache()
            self._text_logits = {}

    def readouts_of(self, method: Method | None) -> list[str]:
        """The readouts a method's records hold: a contrastive one's are read at the answer position
        (logit and first-token readouts), since its text readouts would need it inside a decode loop."""
        if method is None or not method.contrastive:
            return list(self.readouts)
        return [n for n in self.readouts if READOUTS[n].kind in (LOGIT, FIRST_TOKEN)]

    def meta(self, method: Method | None = None) -> dict:
        """What a run folder's meta.json says of this engine (and the method its records come from)."""
        if self._file_digests is None:  # hashed once per engine, not per call
            self._file_digests = checkpoint_digests(self.model.folder)
        extra = {} if method is None else {"method": method.to_json(self.model.lm.dims.num_layers)}
        return {
            "model": {"path": str(self.model.folder), "family": self.model.family, "files": self._file_digests},
            "template": self.template.name,
            "prompt_example": self.template.render(SAMPLE_QUESTION, self.model.tokenizer),
            "readouts": self.readouts_of(method),
            "token_sets": {n: s.to_json() for n, s in self.token_sets.items()},
            "candidate_ids": self.candidate_ids,
            "tokenizer": tokenizer_info(self.model.tokenizer),
            "settings": self.settings.to_json(),
            "generation": {name: g.to_json() for name, g in self.generation.items()  # each text readout's length
                           if name in self.readouts_of(method)},
            **extra,
        }

    def _loaded(self, image: LoadedImage | Image.Image | str | Path) -> LoadedImage:
        if isinstance(image, (str, Path)):
            return read_image(image)
        if isinstance(image, Image.Image):
            if image.mode not in PNG_MODES:  # CMYK, I, F, YCbCr, HSV, ...: the file path's conversion
                image = to_rgb(image)
            buf = io.BytesIO()
            image.save(buf, format="PNG")
            return LoadedImage(Path("<in-memory>"), buf.getvalue())
        return image

    def prepare(self, images: list) -> list[tuple[str, LoadedImage, object | None]]:
        """(cache key, image, the model's preprocess() output or None when cached) per image: the CPU
        half of the vision pass, which a sweep runs in background threads while the model works."""
        prepared = []
        for image in images:
            image = self._loaded(image)
            key = feature_key(image.data, self._preprocess, self.model.feature_fingerprint)
            pixels = None
            if not self.cache.contains(key):
                try:
                    decoded = image.open()
                except DECODE_ERRORS as err:  # a file that passed the check, not the decoder
                    raise ImageError(f"{image.path}: not a decodable image ({err})") from None
                pixels = self.model.preprocess(decoded)
            prepared.append((key, image, pixels))
        return prepared

    def encode(self, prepared: list[tuple[str, LoadedImage, object | None]]) -> list[torch.Tensor]:
        """Projected features [T, hidden] per prepared image; the uncached ones run as one vision batch."""
        out = [self.cache.get(key, self.settings.torch_device) if pixels is None else None
               for key, _, pixels in prepared]
        # An entry seen as cached while preparing may have left the in-memory cache since.
        todo = [(i, key, pixels if pixels is not None else self.model.preprocess(image.open()))
                for i, (key, image, pixels) in enumerate(prepared) if out[i] is None]
        return self._encode_into(out, todo)

    def _encode_into(self, out: list[torch.Tensor | None], todo: list[tuple[int, str, object]]) -> list[torch.Tensor]:
        """out with each (index, cache key, pixels) of todo encoded, as one vision batch, and cached."""
        if todo:
            with Clock(self.timings, "image_encode", self.settings.torch_device):
                features = self.model.encode_images([p for _, _, p in todo])
            for (i, key, _), f in zip(todo, features):
                self.cache.put(key, f.clone())  # its own storage, not a view that keeps the batch alive
                out[i] = f
            self.counts.images_encoded += len(todo)
            self.counts.vision_tokens += sum(self.model.vision_tokens(p) for _, _, p in todo)
        return out

    def features(self, image: LoadedImage | Image.Image | str | Path) -> torch.Tensor:
        """Projected features [T, hidden] of one image, from the cache when its content was seen."""
        return self.encode(self.prepare([image]))[0]

    def prompt(self, question: str, system: str | None = None) -> str:
        """The template's prompt for a question; `system` replaces its system text (ICD)."""
        return self.template.render(question, self.model.tokenizer, system)

    def noised_features(self, prepared: list[tuple[str, LoadedImage, object | None]], step: int, seed: int
                        ) -> list[torch.Tensor]:
        """Features of VCD's noised copy of each prepared image (methods.diffusion_noise at `step`), the
        noise drawn per image from `seed` and the image's content, so a rerun, another batch or another
        device draws the same; cached beside the image's own features under their own key."""
        keys = [f"{key}-noise{step}-seed{seed}" for key, _, _ in prepared]
        out = [self.cache.get(key, self.settings.torch_device) for key in keys]
        todo = [(i, keys[i], diffusion_noise(pixels if pixels is not None else self.model.preprocess(image.open()),
                                             step, noise_generator(key, seed)))
                for i, (key, image, pixels) in enumerate(prepared) if out[i] is None]
        return self._encode_into(out, todo)  # the uncached copies as one vision batch

    def decide(self, result: PromptResult) -> dict[str, str]:
        """Every requested readout's decision from one answer position's outputs. Each text readout
        reads its own prefix of the continuation (result.texts, else the whole of result.decoded);
        string_parse_with_prompt reads result.sequence, the prompt and continuation decoded as one. A
        readout whose text is not there is left out (adjusted logits, say)."""
        out = {}
        for name in self.readouts:
            readout = READOUTS[name]
            text = None
            if readout.kind == SEQUENCE:
                text = result.sequence
            elif readout.kind == TEXT:
                text = (result.texts or {}).get(name, result.decoded)
            if readout.kind in GENERATING and text is None:
                continue
            sets = self.token_sets.get(name) if readout.kind in (LOGIT, FIRST_TOKEN) else None
            out[name] = readout(sets, result.candidate_logits, result.first_token_id, text)
        return out

    def score(self, image, questions: list[str], intervention: Intervention | None = None) -> list[Answer]:
        """Answer questions about one image (a path, a PIL image or a LoadedImage)."""
        results = self.run_images([(self.features(image), [self.prompt(q) for q in questions])], intervention)[0]
        return [Answer(**vars(r), question=q, predictions=self.decide(r)) for q, r in zip(questions, results)]

    def run_images(self, items: list[tuple[torch.Tensor, list[str]]], intervention: Intervention | None = None
                   ) -> list[list[PromptResult]]:
        """items: (image features, prompts) per image → per image, per prompt, its PromptResult.

        The prompts' layouts are planned into stages (`plan.make_plan`); each stage prefills its
        distinct prefixes once, then its suffix batches against them."""
        return self.run_passes(items, [intervention])[0]

    def run_passes(self, items: list[tuple[torch.Tensor, list[str]]], interventions: list[Intervention | None], *,
                   vocab: bool = False, decode: list[bool] | None = None) -> list[list[list[PromptResult]]]:
        """run_images under each intervention in turn, each prefix prefilled once for all of them when
        none of them changes the prefix (attention edits never do: they act after the image; a hidden
        hook may). With vocab, each PromptResult also holds the answer position's logits over the whole
        vocabulary (`vocab_logits`); decode[k] False skips intervention k's continuation."""
        decode = decode or [True] * len(interventions)
        if len(interventions) > 1 and any(changes_prefix(i) for i in interventions):
            return [self.run_passes(items, [i], vocab=vocab, decode=[d])[0] for i, d in zip(interventions, decode)]
        results: list[dict[tuple[int, int], PromptResult]] = [{} for _ in interventions]
        for stage in make_plan(self._rows(items), self.settings.batch_size, self.settings.prefix_reuse):
            prefix = self._prefill_prefix(stage.prefix, interventions[0]) if stage.prefix is not None else None
            for batch in stage.batches:
                for k, intervention in enumerate(interventions):
                    out = self._run_batch(prefix, batch, intervention, vocab=vocab, decode=decode[k])
                    for row, result in zip(batch.rows, out):
                        results[k][row.item, row.prompt] = result
        return [[[done[i, p] for p in range(len(prompts))] for i, (_, prompts) in enumerate(items)]
                for done in results]

    def run_methods(self, prepared: list[tuple[str, LoadedImage, object | None]], questions: list[list[str]],
                    methods: list[Method]) -> dict[str, list[list[PromptResult]]]:
        """Each method's PromptResults for the questions of each prepared image (per method, per image,
        per question). Every distinct pass of the methods runs once (methods.Pass): passes on the same
        features and prompts share their prefixes, the text-only pass is computed once per distinct
        prompt for the engine's lifetime. Only the baseline's plain pass decodes (text readouts)."""
        features = self.encode(prepared)
        layers = self.model.lm.dims.num_layers
        wanted = {m.name: m.passes(layers) for m in methods}
        distinct = list(dict.fromkeys(p for passes in wanted.values() for p in passes.values()))
        vocab = any(m.contrastive for m in methods)
        plain_decodes = any(not m.contrastive for m in methods)
        got: dict[Pass, list[list[PromptResult]]] = {}
        shared: dict[tuple, list[Pass]] = {}  # same features and prompts: one prefix, each edit in turn
        for p in distinct:
            if p.image != "none":
                shared.setdefault((p.image, p.system, p.noise_step, p.seed), []).append(p)
        for (kind, system, step, seed), passes in shared.items():
            feats = features if kind == "image" else self.noised_features(prepared, step, seed)
            items = [(f, [self.prompt(q, system) for q in qs]) for f, qs in zip(feats, questions)]
            runs = self.run_passes(items, [p.edit for p in passes], vocab=vocab,
                                   decode=[plain_decodes and p == Pass() for p in passes])
            got.update(zip(passes, runs))
        if any(p.image == "none" for p in distinct):
            got[Pass("none")] = self._text_only(features, questions)
        out = {}
        for m in methods:
            passes = wanted[m.name]
            if not m.contrastive:
                out[m.name] = got[passes["main"]]
                continue
            where = [(i, j) for i, qs in enumerate(questions) for j in range(len(qs))]
            flat = self._combined(m, {role: [got[p][i][j] for i, j in where] for role, p in passes.items()})
            out[m.name] = [[None] * len(qs) for qs in questions]
            for (i, j), result in zip(where, flat):
                out[m.name][i][j] = result
        return out

    def _combined(self, method: Method, results: dict[str, list[PromptResult]]) -> list[PromptResult]:
        """A contrastive method's results, one batch of rows: its combined logits' argmax and candidate
        columns, and the probe of its main pass."""
        combined = method.combine({role: torch.stack([r.vocab_logits for r in rs]) for role, rs in results.items()})
        index = torch.tensor(self.candidate_ids, device=combined.device)
        return [PromptResult(first, dict(zip(self.candidate_ids, values)), probe=main.probe)
                for first, values, main in zip(combined.argmax(dim=-1).tolist(), combined[:, index].tolist(),
                                               results["main"])]

    def _text_only(self, features: list[torch.Tensor], questions: list[list[str]]) -> list[list[PromptResult]]:
        """PAI's text-only pass: each prompt's own tokens with its image tokens removed, run whole
        (no image, no edit); its logits are kept per distinct token sequence for the engine's life,
        since every image that asks a question asks the same text."""
        rows: dict[tuple[int, ...], Row] = {}  # the distinct prompts not yet run, by their ids
        order = []
        for i, (f, qs) in enumerate(zip(features, questions)):
            for j, q in enumerate(qs):
                layout = _without_image(self.model.layout(self.prompt(q), f), self.model.lm.dims.mrope_section)
                order.append((i, j, layout.ids))
                if layout.ids not in self._text_logits and layout.ids not in rows:
                    rows[layout.ids] = Row(len(rows), 0, layout, f[:0])
        for stage in make_plan(list(rows.values()), self.settings.batch_size, prefix_reuse=False):
            for batch in stage.batches:
                for row, result in zip(batch.rows, self._run_batch(None, batch, None, vocab=True, decode=False)):
                    self._text_logits[row.layout.ids] = result
        out = [[None] * len(qs) for qs in questions]
        for i, j, ids in order:
            out[i][j] = self._text_logits[ids]
        return out

    def _rows(self, items: list[tuple[torch.Tensor, list[str]]]) -> list[Row]:
        """One Row per (image, prompt): its layout and the features its image slots take (InstructBLIP's
        come from a Q-Former that reads the prompt, run here for every prompt in one batch)."""
        model = self.model
        if model.features_per_prompt:
            with Clock(self.timings, "image_encode", self.settings.torch_device):
                per_prompt = model.prompt_features(items)
        else:
            per_prompt = [[features] * len(prompts) for features, prompts in items]
        rows = []
        for it, ((_, prompts), features) in enumerate(zip(items, per_prompt)):
            for pi, (prompt, f) in enumerate(zip(prompts, features)):
                rows.append(Row(it, pi, self._checked(model.layout(prompt, f)), f))
        return rows

    def _checked(self, layout):
        window = self.model.lm.dims.sliding_window
        longest = len(layout) + (self._steps(len(layout)) - 1 if self.generate else 0)
        if window is not None and longest > window:  # shorter sequences attend exactly as without one
            raise NotImplementedError(f"a {longest}-token sequence exceeds the model's sliding window of "
                                      f"{window} tokens, which the engine does not implement")
        return layout

    def _steps(self, prompt_length: int) -> int:
        """Greedy tokens a prompt of this length may take: the longest a readout asks, within the model's positions."""
        return max(1, min(self.new_tokens, self.model.lm.dims.max_positions - prompt_length))

    def _tokens(self, rows: list[Row], start: int, end: int | None) -> TokenBatch:
        return TokenBatch.of(rows, start, end, self.settings.torch_device,
                             mrope=self.model.lm.dims.mrope_section is not None)

    def _prefill_prefix(self, group: PrefixGroup, intervention: Intervention | None) -> PrefixKV:
        with Clock(self.timings, "prefix_prefill", self.settings.torch_device):
            prefix = self.model.lm.prefill_prefix(self._tokens(group.rows, 0, group.length), intervention)
        self.counts.prefix_tokens += group.length * len(group.rows)
        return prefix

    def _run_batch(self, prefix: PrefixKV | None, batch: SuffixBatch, intervention: Intervention | None, *,
                   vocab: bool = False, decode: bool = True) -> list[PromptResult]:
        """One suffix batch: prefill, the answer position's candidate logits and argmax (with vocab, the
        whole vocabulary's logits too), and the greedy continuation when a string readout asks for one."""
        lm, device = self.model.lm, self.settings.torch_device
        with Clock(self.timings, "question_prefill", device):
            tokens = self._tokens(batch.rows, prefix.length if prefix is not None else 0, None)
            probe = self.settings.probe != "none"
            out = lm.prefill_suffix(prefix, batch.slots, tokens, intervention, probe)
            last, suffix_kv, image_attention = out.last_hidden, out.kv, out.image_attention
            logits, first = lm.answer(last, self.candidate_ids)
            everything = lm.vocab_logits(last) if vocab else None
            if intervention is not None:
                adjusted = intervention.logits(logits, self.candidate_ids)
                logits = logits if adjusted is None else adjusted
        self.counts.prompts += len(batch.rows)
        self.counts.suffix_tokens += int(tokens.lengths.sum())
        texts = [{}] * len(batch.rows)
        if self.generate and decode:
            steps = self._steps(max(len(row.layout) for row in batch.rows))
            with Clock(self.timings, "decode", device):
                generated = lm.decode(prefix, batch.slots, suffix_kv, first, steps, self.model.stop_ids, intervention,
                                      self._finished)
            self.counts.decode_steps += (generated.shape[1] - 1) * len(batch.rows)
            texts = [self._text(row, tokens) for row, tokens in zip(batch.rows, generated.tolist())]
        probes = [None] * len(batch.rows) if image_attention is None else \
            [{"image_attention": layers, "image_attention_heads": heads}  # per layer: heads averaged, and each head
             for layers, heads in zip(image_attention.mean(dim=-1).tolist(), image_attention.tolist())]
        rows = [None] * len(batch.rows) if everything is None else list(everything)
        return [PromptResult(f, dict(zip(self.candidate_ids, row)), probe=probe, vocab_logits=v, **text)
                for f, row, text, probe, v in zip(first.tolist(), logits.tolist(), texts, probes, rows)]

    def _text(self, row: Row, tokens: list[int]) -> dict:
        """PromptResult's text fields: `decoded`, the new tokens up to the first stop token; `texts`, each
        text readout's own prefix of them; `sequence`, for string_parse_with_prompt the prompt and its
        prefix decoded as one.

        Only the new tokens make the text readouts' texts: decoding the prompt too is how published
        InstructBLIP string_parse scores picked up 'yes' from 'Answer yes or no only', which
        string_parse_with_prompt reproduces on purpose."""
        decode = partial(self.model.tokenizer.decode, skip_special_tokens=True)
        continuation = cut(tokens, self.model.stop_ids, self.generation, decode)
        whole = [n for n in self.generation if READOUTS[n].kind == SEQUENCE]
        sequence = None
        if whole:  # the prompt's own ids (image slots are special tokens, skipped when decoded anyway)
            prompt = [t for t in row.layout.ids if t != row.layout.image_token_id]
            sequence = decode(prompt + list(continuation.ids[:continuation.ends[whole[0]]]))
        return {"decoded": continuation.text, "texts": continuation.texts, "sequence": sequence}


def _without_image(layout: PromptLayout, mrope) -> PromptLayout:
    """The layout's own tokens with its image slots removed: a text-only prompt, run whole (M-RoPE's
    three streams are then the plain positions, as for any text)."""
    ids = [t for t in layout.ids if t != layout.image_token_id]
    positions = torch.arange(len(ids)).expand(3, -1) if mrope is not None else None
    return PromptLayout(tuple(ids), layout.image_token_id, (), 0, positions)
