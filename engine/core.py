"""The engine: load a checkpoint once, then answer yes/no questions about images under each readout.

Per call: projected features per image (cached by content) → the prompts of each image run through
the one-step prefill (`runner.Runner`) → one PromptResult per prompt, and its decisions from the
readout plan (`readout.readout_plan.ReadoutPlan`). Mitigation methods are passes of that same step
whose answer-position logits they combine (`run_methods`, paired.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from PIL import Image

from ..readout.readout_plan import ReadoutPlan
from ..readout.templates import SAMPLE_QUESTION, Template
from ..readout.tool_steps import ANSWER_CUTS
from ..readout.tokens import token_strings, tokenizer_info
from .inputs.fingerprint import checkpoint_digests
from .layers.generation import greedy_fields
from .inputs.images import DECODE_ERRORS, LoadedImage, as_loaded, reencoded, resized, undecodable
from .layers.interventions import Intervention, changes_prefix
from .methods import METHODS, Method, diffusion_noise, noise_generator
from .models import Family, load_model
from .models.base import refusal
from .inputs.plan import PromptResult
from .paired import MethodRuns
from .runner import ImagePrompts, Runner
from .thinking import METHOD_REFUSED, Thinking, warming
from .utils.settings import Settings
from .utils.stats import Clock
from .inputs.vision_cache import VisionCache, feature_key, noised_key

@dataclass(frozen=True)
class Prepared:
    """An image ready for the vision pass: its feature-cache key, its bytes, and its family's
    preprocess() output (None when its features were cached when it was prepared)."""

    key: str
    image: LoadedImage
    pixels: object | None


@dataclass(kw_only=True)
class Answer(PromptResult):
    """One question's raw outputs at the answer position (a PromptResult), the
    question, and its decisions."""

    question: str = ""
    predictions: dict[str, str] = field(default_factory=dict)


class Engine(MethodRuns):
    runner_class = Runner  # what runs a call's prompts (the transformers backend's runs them whole)

    def __init__(self, model: Family, settings: Settings, template: Template | str | None = None,
                 readouts: str | list[str] | None = None, cache: VisionCache | None = None,
                 lengths: dict[str, int] | None = None):
        self.model, self.settings = model, settings
        # the template, rendered as its mode asks
        self.thinking = Thinking.of(model, template, settings.thinking)
        self.template, dims = self.thinking.template, model.lm.dims
        self.readout = ReadoutPlan.make(model.tokenizer, self.thinking.answer_template, readouts,
                                        vocab_size=dims.vocab_size,
                                        max_new_tokens=settings.max_new_tokens,
                                        positions=dims.max_positions, lengths=lengths,
                                        answer_cut=ANSWER_CUTS.get(settings.answer_cut))
        self.cache = cache or VisionCache()
        self._on_decode = None
        self.runner = self.runner_class(model, settings, self.readout)
        self._processor = model.preprocess_settings()  # part of every feature-cache key
        # the checkpoint's sha256s, hashed on first meta()
        self._file_digests: dict[str, str] | None = None
        # text-only prompts (PAI), by token ids
        self._text_logits: dict[tuple[int, ...], PromptResult] = {}

    @classmethod
    def load(cls, folder: str | Path, settings: Settings | None = None, *,
             template: str | None = None, readouts: str | list[str] | None = None,
             cache_dir: str | Path | None = None,
             lengths: dict[str, int] | None = None) -> "Engine":
        """`lengths`: new tokens per text readout where they are not its
        reference's (a protocol's tool's)."""
        settings = settings or Settings()
        return cls(load_model(folder, settings), settings, template, readouts,
                   VisionCache(cache_dir), lengths)

    @property
    def timings(self):
        """Seconds per phase since the last reset (stats.Timings)."""
        return self.runner.timings

    @property
    def counts(self):
        """Work done since the last reset (stats.Counts)."""
        return self.runner.counts

    def warmup(self, images: int | None = None, prompts: int | None = None,
               decode_tokens: int | None = None) -> None:
        """One untimed image batch through every step a sweep takes (preprocessing, vision,
        prefixes, a full question batch, and decoding when a text readout asks for it), so one-time
        costs land here rather than in the first batch: Triton compiles, CUDA and oneDNN setup for
        these shapes, allocator growth. Nothing is cached; timings and counts restart. `images` and
        `prompts` (per image): the data's own counts, which bound the batch, so a batch size past
        the data allocates only for the data. `decode_tokens`: the most new tokens a text readout
        decodes here (None: its own length, every decode step a timed run takes; eval, timing
        nothing, caps it: a protocol's 128 tokens cost seconds of CPU)."""
        self.cap_decoding(decode_tokens)
        rows, step = self.runner.question_rows, self.settings.step_images
        per_image = max(1, rows // step)
        per_image = per_image if prompts is None else max(1, min(prompts, per_image))
        count = step if images is None else max(1, min(images, step))
        pixels = self.model.preprocess(Image.new("RGB", (640, 480), (124, 116, 104)))
        # one image per vision call, as every sweep runs it
        features = self.model.encode_images([pixels])[0]
        with warming(self):  # a reasoning's first steps, not its cap
            questions = [self.prompt(SAMPLE_QUESTION)] * per_image
            self.run_images([ImagePrompts(features, questions)] * count)
        if self.settings.torch_device.type == "cuda":
            torch.cuda.synchronize(self.settings.torch_device)
        self.reset()

    def cap_decoding(self, new_tokens: int | None) -> None:
        """Until the next reset(), each text readout decodes at most `new_tokens`
        (a warm-up's; None: its own)."""
        if new_tokens is not None:
            self.runner = self.runner_class(self.model, self.settings,
                                            self.readout.capped(new_tokens), self._on_decode)

    def reset(self, clear_cache: bool = False, *, timed: bool = False) -> None:
        """Timings and counts restart; with clear_cache, cached image features and text-only logits
        are forgotten too (an empty in-memory cache replaces the engine's), so the next sweep runs
        cold. With timed, each phase synchronises the device at its start and end (stats.Timings):
        bench's phases."""
        self.runner = self.runner_class(self.model, self.settings, self.readout, self._on_decode)
        self.runner.timings.synchronize = timed
        if clear_cache:
            self.cache = VisionCache()
            self._text_logits = {}

    @property
    def on_decode(self) -> Callable[[int, int, int], None] | None:
        """Told (new tokens so far, the most a row may take, rows) every 32 new tokens of a greedy
        continuation (eval's display); it stays set across reset() and warmup()."""
        return self._on_decode

    @on_decode.setter
    def on_decode(self, listener: Callable[[int, int, int], None] | None) -> None:
        self._on_decode = self.runner.on_decode = listener

    def readout_of(self, method: Method) -> ReadoutPlan:
        """What a method's records hold: a contrastive one's are read at the answer position (logit
        and first-token readouts), since its text readouts would need it inside a decode loop."""
        return self.readout.at_answer_position() if method.contrastive else self.readout

    def meta(self, method: Method | None = None) -> dict:
        """What a run folder's meta.json says of this engine and the method its records come from
        (the baseline unless given)."""
        method = method or METHODS["none"]()
        if self._file_digests is None:  # hashed once per engine, not per call
            self._file_digests = checkpoint_digests(self.model.folder)
        plan = self.readout_of(method).to_meta()
        return {
            "model": {"path": str(self.model.folder), "family": self.model.family,
                      "backend": self.model.backend, "files": self._file_digests},
            "template": self.template.name,
            "prompt_example": self.template.render(SAMPLE_QUESTION, self.model.tokenizer),
            "readouts": plan["readouts"], "token_sets": plan["token_sets"],
            "candidate_ids": plan["candidate_ids"],
            # for the report's labels
            "token_strings": token_strings(self.model.tokenizer, plan["candidate_ids"]),
            "tokenizer": tokenizer_info(self.model.tokenizer),
            # what ran
            "settings": {**self.settings.to_json(), "batch_size": self.runner.question_rows},
            "generation": plan["generation"],  # each text readout's length
            # what a greedy generate applies from the checkpoint's generation
            # config, whether or not this run did
            "generation_config": greedy_fields(self.model.generation_config),
            "method": method.to_json(self.model.lm.dims.num_layers), **self.thinking.to_meta(),
        }

    def check_method(self, method: Method) -> None:
        """ValueError where a method's settings do not fit the model (a layer range past its layers,
        say), or where it needs passes of its own under thinking decode (thinking.METHOD_REFUSED):
        before a sweep touches a folder."""
        method.check_model(self.model.lm)
        if self.thinking.decodes and method.name != "none":
            raise ValueError(f"method {method.name}: {METHOD_REFUSED}")

    def prepare(self, images: list) -> list[Prepared]:
        """Each image (a path, a PIL image or a LoadedImage) ready for the vision pass: the CPU half
        of it, which a sweep runs in background threads while the model works."""
        prepared = []
        for image in images:
            image = as_loaded(image)
            key = feature_key(image.data, self._processor, self.settings,
                              self.model.feature_fingerprint)
            pixels = None
            if not self.cache.contains(key):
                try:
                    decoded = image.open()
                except DECODE_ERRORS as err:  # a file that passed the check, not the decoder
                    raise undecodable(image.path, err) from None
                pixels = self._preprocessed(decoded)
            prepared.append(Prepared(key, image, pixels))
        return prepared

    def _preprocessed(self, decoded: Image.Image):
        """A decoded image's pixels: re-encoded, then resized, first where the settings ask
        (image_reencode, image_resize: lmms-eval's Qwen2-VL class does both, in this order)."""
        return self.model.preprocess(resized(reencoded(decoded, self.settings.image_reencode),
                                             self.settings.image_resize))

    def _pixels(self, item: Prepared):
        """item's pixels: an entry seen as cached while preparing may have
        left the in-memory cache since."""
        return item.pixels if item.pixels is not None else self._preprocessed(item.image.open())

    def encode(self, prepared: list[Prepared | None]) -> list[torch.Tensor | None]:
        """Projected features [T, hidden] per prepared image, from the cache or the vision tower;
        None for None (a text-only question's place: the cache is not asked)."""
        out = [self.cache.get(p.key, self.settings.torch_device)
               if p is not None and p.pixels is None else None for p in prepared]
        return self._encode_into(out, [(i, p.key, self._pixels(p)) for i, p in enumerate(prepared)
                                       if p is not None and out[i] is None])

    def _encode_into(self, out: list[torch.Tensor | None],
                     todo: list[tuple[int, str, object]]) -> list[torch.Tensor]:
        """out with each (index, cache key, pixels) of todo encoded and cached. Each image is its
        own vision call: a tower's rounding depends on its batch's shape (a CPU's matmul rounds a
        batch of 2 and one of 8 differently), so features computed with others would depend on which
        images happened to be uncached; one image alone gives the same bits in any run, cached or
        not (the cost: bench/RESULTS.md)."""
        if todo:
            with Clock(self.timings, "image_encode", self.settings.torch_device):
                features = [self.model.encode_images([p])[0] for _, _, p in todo]
            for (i, key, _), f in zip(todo, features):
                self.cache.put(key, f)
                out[i] = f
            self.counts.images_encoded += len(todo)
            self.counts.vision_tokens += sum(self.model.vision_tokens(p) for _, _, p in todo)
        return out

    def features(self, image: LoadedImage | Image.Image | str | Path) -> torch.Tensor:
        """Projected features [T, hidden] of one image, from the cache when its content was seen."""
        return self.encode(self.prepare([image]))[0]

    def noised_features(self, prepared: list[Prepared], step: int, seed: int) -> list[torch.Tensor]:
        """Features of VCD's noised copy of each prepared image (methods.diffusion_noise at `step`),
        the noise drawn per image from `seed` and the image's content, so a rerun, another batch or
        another device draws the same; cached beside the image's own features under their own
        key."""
        keys = [noised_key(p.key, step, seed) for p in prepared]
        out = [self.cache.get(key, self.settings.torch_device) for key in keys]
        todo = [(i, keys[i], diffusion_noise(self._pixels(p), step, noise_generator(p.key, seed)))
                for i, p in enumerate(prepared) if out[i] is None]
        return self._encode_into(out, todo)

    def text_only_refusal(self, method: Method | None = None) -> str | None:
        """Why this engine's family (or `method`, when given) cannot answer a question asked without
        an image, as one line; None where it can."""
        if method is not None:
            if not method.text_only_refusal:
                return None
            return refusal(f"method {method.name}", method.text_only_refusal)
        why = self.model.text_only_refusal
        return refusal(self.model.name, why) if why else None

    def prompt(self, question: str, system: str | None = None, image: bool = True) -> str:
        """The template's prompt for a question; `system` replaces its system text (ICD); without
        image, the prompt of a question asked with no image (no image marker)."""
        return self.template.render(question, self.model.tokenizer, system, image)

    def answer(self, image, questions: list[str],
               intervention: Intervention | None = None) -> list[Answer]:
        """Answer questions about one image (a path, a PIL image or a LoadedImage), or with image
        None questions asked without one (text-only prompts, TextOnlyRefused where the family
        cannot)."""
        if isinstance(questions, str) or not all(isinstance(q, str) for q in questions):
            raise TypeError("questions must be a list of question strings (one string is not a "
                            "list of them)")
        prepared = None if image is None else self.prepare([image])[0]
        features = None if prepared is None else self.encode([prepared])[0]
        prompts = [self.prompt(q, image=image is not None) for q in questions]
        key = "" if prepared is None else prepared.key
        results = self.run_images([ImagePrompts(features, prompts, key)], intervention)[0]
        return [Answer(**vars(r), question=q, predictions=self.readout.decide(r))
                for q, r in zip(questions, results)]

    def run_images(self, items: list[ImagePrompts], intervention: Intervention | None = None
                   ) -> list[list[PromptResult]]:
        """Per image, per prompt, its PromptResult: each image's distinct prefixes prefilled once,
        then its prompts' suffixes in batches against them."""
        if not all(isinstance(item, ImagePrompts) for item in items):
            raise TypeError("items must be a list of ImagePrompts(features, prompts), one per "
                            "image")
        return self.run_passes(items, [intervention])[0]

    def run_passes(self, items: list[ImagePrompts], interventions: list[Intervention | None], *,
                   vocab: bool = False, decode: list[bool] | None = None, residuals: bool = False
                   ) -> list[list[list[PromptResult]]]:
        """run_images under each intervention in turn, each prefix prefilled once for all of them
        when none of them changes the prefix (attention edits never do: they act after the image; a
        hidden hook may; a whole_prompt one runs every prompt whole, on its own). With vocab, each
        PromptResult also holds the answer position's logits over the whole vocabulary
        (`vocab_logits`), with residuals every layer's output there (`residuals`); decode[k] False
        skips intervention k's continuation."""
        decode = decode or [True] * len(interventions)
        # no image prefix shared
        whole = any(i is not None and i.whole_prompt for i in interventions)
        if len(interventions) > 1 and (whole or any(changes_prefix(i) for i in interventions)):
            return [self.run_passes(items, [i], vocab=vocab, decode=[d], residuals=residuals)[0]
                    for i, d in zip(interventions, decode)]
        runner = self.runner
        rows, unanswered = self.thinking.reasoned(runner, runner.rows(items), interventions, vocab)
        results: list[dict[tuple[int, int], PromptResult]] = [dict(unanswered)
                                                              for _ in interventions]
        launched = []  # (pass, batch) in launch order: each read back once the next is launched
        for stage in runner.plan(rows, prefix_reuse=False if whole else None):
            prefix = (runner.prefill_prefix(stage.prefix, interventions[0])
                      if stage.prefix is not None else None)
            for batch in stage.batches:
                for k, intervention in enumerate(interventions):
                    launched.append((k, runner.launch(prefix, batch, intervention, vocab=vocab,
                                                      decode=decode[k], residuals=residuals)))
                    if len(launched) > 1:
                        _collect(results, runner, *launched.pop(0))
        for k, batch in launched:
            _collect(results, runner, k, batch)
        return [[[done[i, p] for p in range(len(item.prompts))] for i, item in enumerate(items)]
                for done in results]


def _collect(results: list[dict[tuple[int, int], PromptResult]], runner: Runner, k: int,
             launched) -> None:
    for row, result in zip(launched.rows, runner.results(launched)):
        results[k][row.item, row.prompt] = result
