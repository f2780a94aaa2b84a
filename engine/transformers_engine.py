"""The transformers backend as an Engine: every prompt run whole through transformers' class of the
checkpoint (transformers_model.TransformersModel), in batches of left-padded prompts, no prefix
reuse and no feature cache. What it gives is what the engine gives, in the same PromptResults, so
the sweep, records, readouts, methods, resume and torchrun above it are the engine's own: the answer
position's candidate logits and argmax (the whole vocabulary's for contrastive methods), a
continuation from `generate` (greedy or the tool's beam search, the checkpoint's generation rules
where the settings apply them), VCD's noised pixels, ICD's system prompt, and the image-attention
probe from the class's eager attention weights. Attention edits (PAI) act inside the engine's own
attention, and are refused in one line."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from ..readout.templates import SAMPLE_QUESTION
from .core import Engine, Prepared
from .layers.generation import GreedyRules
from .utils.loader import CheckpointError
from .methods import Method, diffusion_noise, noise_generator
from .inputs.plan import PromptResult
from .transformers_model import TransformersModel, error_reason
from .runner import ImagePrompts, Runner
from .utils.settings import Settings
from .utils.stats import Clock

# settings the backend honours only at these values: what any other asks of the engine's own
# computation whole prompts, image tokens and all, per batch where --batch-size leaves it open (the
# device's question budget counts suffixes of a few tokens each, not prompts of hundreds)
WHOLE_PROMPTS = 16

REFUSED = {
    "generation_config": (("none", "greedy"), "greedy_output gives generate the prompt as "
                                              "inputs_embeds (LLaVA's own generate), and the "
                                              "backend gives it input_ids"),
    "max_length": ((None,), "max_length counts the prompt as inputs_embeds (LAVIS's generate)"),
    "image_mask": (("model",), "a causal image mask replaces the class's own attention mask"),
    "image_aspect": (("processor",), "padding to square replaces the processor's own resizing"),
    "quantize_lm_head": ((False,), "transformers keeps lm_head unquantized under load_in_4bit"),
    "processor_pixels": ((None,), "pixel bounds are the checkpoint processor's"),
    "processor_patches": ((None,), "tile bounds are the checkpoint processor's"),
    "do_sample": ((False,), "generate draws every row from one global generator, not each question "
                            "from its own"),
}


def check_settings(settings: Settings) -> None:
    """ValueError naming the first setting the backend cannot honour, and why."""
    for name, (allowed, why) in REFUSED.items():
        if getattr(settings, name) not in allowed:
            raise ValueError(f"{name} {getattr(settings, name)!r}: the transformers backend cannot "
                             f"run it ({why})")


@dataclass(frozen=True)
class NoisedImage:
    """VCD's noised copy of an image: the processor's pixel_values of the image, noised at `step` by
    the generator of the image's key and the method's seed (methods.noise_generator), as the engine
    noises its family's pixels."""

    image: Image.Image
    step: int
    key: str
    seed: int


class TransformersRunner(Runner):
    """Runs prompts whole through transformers' class: the Runner's readout plan,
    allowances, counts and timings."""

    def __init__(self, model: TransformersModel, settings: Settings, readout, on_decode=None):
        super().__init__(model, settings, readout, on_decode)
        self._keep = "logits_to_keep" in inspect.signature(model.model.forward).parameters

    def _rules(self) -> GreedyRules:
        """None of the engine's: generate applies the checkpoint's rules itself, every one of them
        (TransformersModel._rules), which the engine's GreedyRules would refuse some of."""
        return GreedyRules()

    def run_items(self, items: list[ImagePrompts], *, vocab: bool,
                  decode: bool) -> list[list[PromptResult]]:
        """Per image, per prompt, its PromptResult: consecutive prompts batched (batch_size, or one
        at a time where the processor takes one), prompts with and without an image apart, a noised
        image's one at a time (its noise is drawn over its own pixels, not a batch's padding)."""
        rows = [(i, j, item.features, prompt) for i, item in enumerate(items)
                for j, prompt in enumerate(item.prompts)]
        size = (self.settings.batch_size or WHOLE_PROMPTS) if self.model.inputs.batched else 1
        batches: list[list] = []
        for row in rows:
            kind = _kind(row[2])
            if batches and kind != "noised" and _kind(batches[-1][0][2]) == kind \
                    and len(batches[-1]) < size:
                batches[-1].append(row)
            else:
                batches.append([row])
        out = [[None] * len(item.prompts) for item in items]
        for batch in batches:
            results = self.run_batch_rows(batch, vocab=vocab, decode=decode)
            for (i, j, _, _), result in zip(batch, results):
                out[i][j] = result
        return out

    def run_batch_rows(self, batch: list, *, vocab: bool, decode: bool) -> list[PromptResult]:
        model, device = self.model, self.settings.torch_device
        ids = list(self.readout.candidate_ids)
        images = [row[2].image if isinstance(row[2], NoisedImage) else row[2] for row in batch]
        # the processor: pixels and the prompt's image tokens
        with Clock(self.timings, "image_encode", device):
            inputs = model.inputs(images, [row[3] for row in batch])
            if isinstance(batch[0][2], NoisedImage):
                inputs["pixel_values"] = _noised(inputs["pixel_values"], batch[0][2])
        probing = self.settings.probe != "none"
        with Clock(self.timings, "question_prefill", device), torch.inference_mode():
            out = model.model(**inputs, **({"logits_to_keep": 1} if self._keep else {}),
                              **({"output_attentions": True} if probing else {}))
            logits = out.logits[:, -1].float()
            first = logits.argmax(dim=-1)
            probes = _probes(out, inputs, model.image_token_id) if probing else [None] * len(batch)
        lengths = inputs["attention_mask"].sum(dim=1).tolist()
        self.counts.prompts += len(batch)
        self.counts.suffix_tokens += int(sum(lengths))
        texts = [{}] * len(batch)
        if self.readout.generates and decode:
            texts = self._generated(inputs, lengths)
        everything = list(logits) if vocab else [None] * len(batch)
        mass = (logits.logsumexp(dim=-1).tolist() if self.settings.record_mass
                else [None] * len(batch))
        return [PromptResult(first_token_id=f, candidate_logits=dict(zip(ids, row)), probe=probe,
                             vocab_logits=v, logsumexp=m, **text)
                for f, row, text, probe, v, m in zip(first.tolist(), logits[:, ids].tolist(), texts,
                                                     probes, everything, mass)]

    def _generated(self, inputs: dict, lengths: list[int]) -> list[dict]:
        """Each row's continuation from `generate` (to the longest row's allowance),
        as its text readouts read it."""
        s, device = self.settings, self.settings.torch_device
        allowed = [self._steps(n) for n in lengths]
        tool = {"min_new_tokens": s.min_new_tokens} if s.min_new_tokens else {}
        if s.repetition_penalty is not None:
            tool |= {"repetition_penalty": float(s.repetition_penalty)}
        with Clock(self.timings, "decode", device), torch.inference_mode():
            sequences = self.model.model.generate(**inputs, max_new_tokens=max(allowed),
                                                  do_sample=False, num_beams=s.num_beams,
                                                  length_penalty=s.length_penalty, **tool)
        width = inputs["input_ids"].shape[1]
        new = sequences[:, width:].tolist()
        self.counts.decode_steps += sum(max(0, len(row) - 1) for row in new)
        image_token = self.model.image_token_id
        prompts = [[t for t, keep in zip(ids, mask) if keep and t != image_token]
                   for ids, mask in zip(inputs["input_ids"].tolist(),
                                        inputs["attention_mask"].tolist())]
        return [self.readout.texts(tokens[:steps], self.model.stop_ids, self._decode, prompt,
                                   self._decode_special)
                for tokens, steps, prompt in zip(new, allowed, prompts)]


def _kind(image) -> str:
    """What a row's batch must share: an image, no image (text-only), or a noised
    image (alone in its batch)."""
    return "noised" if isinstance(image, NoisedImage) else "text" if image is None else "image"


def _probes(out, inputs: dict, image_token: int | None) -> list[dict | None]:
    """The image-attention probe of each row (the engine's: per layer of the language model, per
    head, how much of the answer position's attention falls on the prompt's image tokens; heads
    averaged per layer beside), from the class's eager attention weights; None for a row without
    image tokens. Refused in one line where a layer attends to anything but the sequence
    (Llama-3.2-Vision's cross-attention reads the image's features apart)."""
    attentions = getattr(out, "attentions", None)
    if attentions is None:  # BLIP-2's output keeps its language model's apart
        attentions = getattr(getattr(out, "language_model_outputs", None), "attentions", None)
    width = inputs["input_ids"].shape[1]
    if not attentions or any(a.shape[-1] != width for a in attentions):
        raise ValueError("the image-attention probe weighs image tokens of the prompt, and this "
                         "class reads the image otherwise (cross-attention layers, or no attention "
                         "weights returned)")
    mask = (inputs["input_ids"] == image_token).float()  # [B, T]; pads take no attention
    heads = torch.stack([(a[:, :, -1, :].float() * mask[:, None, :]).sum(dim=-1)
                         for a in attentions], dim=1)
    return [None if not row.any()
            else {"image_attention": h.mean(dim=-1).tolist(), "image_attention_heads": h.tolist()}
            for row, h in zip(mask.bool(), heads)]  # h: [L, H]


def _noised(pixels: torch.Tensor, noised: NoisedImage) -> torch.Tensor:
    values = diffusion_noise(pixels.float().cpu().numpy(), noised.step,
                             noise_generator(noised.key, noised.seed))
    return torch.from_numpy(values).to(pixels.device, pixels.dtype)


class TransformersEngine(Engine):
    """The Engine over transformers' class: its readout plan, prompts, methods' passes, decisions
    and meta are the Engine's; images are the processor's to prepare, and every pass runs through
    TransformersRunner."""

    runner_class = TransformersRunner

    def __init__(self, model: TransformersModel, settings: Settings, template=None, readouts=None,
                 cache=None, lengths: dict[str, int] | None = None):
        super().__init__(model, settings, template, readouts, cache, lengths)
        # A prompt its chat template rendered holds the template's own BOS (Llama 3's writes
        # <|begin_of_text|>): tokenized without added special tokens, as
        # apply_chat_template(tokenize=True) and lmms-eval tokenize one. A family's processor
        # (--backend transformers on it) tokenizes as the family's reference does.
        if model.inputs.own_processor and self.template.chat:
            model.inputs.special_tokens = False
        if model.inputs.own_processor and not self.template.chat:
            self._check_plain_prompt()

    def _check_plain_prompt(self) -> None:
        """A prompt no chat template rendered (reference_plain: the question alone; a tool's own
        string) leaves the image's place to the processor: BLIP-2's and PaliGemma's put its tokens
        before the text themselves, Idefics3's looks for its `<image>` in the text. Tried once with
        an image at load: a processor that finds no place is refused in one line naming the
        template, and the checkpoint's missing chat template where it has none (the run would
        otherwise stop at its first image on the processor's own count of image tokens)."""
        try:
            self.model.inputs([Image.new("RGB", (224, 224))], [self.prompt(SAMPLE_QUESTION)])
        except ValueError as why:
            processor = type(self.model.inputs.processor).__name__
            missing = "" if getattr(self.model.tokenizer, "chat_template", None) else (
                "; the checkpoint has no chat template (tokenizer_config.json's chat_template, "
                "chat_template.json or chat_template.jinja) to render the prompt with")
            raise CheckpointError(f"{self.model.folder}: {processor} finds no place for the image "
                                  f"in template {self.template.name}'s prompt "
                                  f"({error_reason(why)}){missing}") from None

    @classmethod
    def load(cls, folder, settings: Settings | None = None, *, template: str | None = None,
             readouts=None, cache_dir=None,
             lengths: dict[str, int] | None = None) -> "TransformersEngine":
        """Engine.load's, on transformers' class (no feature cache: `cache_dir` is not read)."""
        settings = settings or Settings()
        check_settings(settings)
        return cls(TransformersModel(Path(folder), settings), settings, template, readouts, None,
                   lengths)

    def encode(self, prepared: list[Prepared | None]) -> list[Image.Image | None]:
        """The images as the processor takes them (no features: the class
        runs its own tower per prompt)."""
        out = [None if p is None else self._pixels(p) for p in prepared]
        self.counts.images_encoded += sum(p is not None for p in prepared)
        return out

    def noised_features(self, prepared: list[Prepared], step: int, seed: int) -> list[NoisedImage]:
        return [NoisedImage(self._pixels(p), step, p.key, seed) for p in prepared]

    def warmup(self, images: int | None = None, prompts: int | None = None,
               decode_tokens: int | None = None) -> None:
        """One prompt through every step a sweep takes, so one-time costs land before the first
        timed batch (its continuations `decode_tokens` long at most, where given: Engine.warmup)."""
        self.cap_decoding(decode_tokens)
        gray = Image.new("RGB", (640, 480), (124, 116, 104))
        self.run_images([ImagePrompts(gray, [self.prompt(SAMPLE_QUESTION)])])
        self.reset()

    def run_passes(self, items: list[ImagePrompts], interventions: list, *, vocab: bool = False,
                   decode: list[bool] | None = None,
                   residuals: bool = False) -> list[list[list[PromptResult]]]:
        if any(i is not None for i in interventions):
            raise ValueError("the transformers backend cannot edit attention (an Intervention acts "
                             "inside the engine's own attention and hidden states)")
        decode = decode or [True] * len(interventions)
        return [self.runner.run_items(items, vocab=vocab, decode=d) for d in decode]

    def check_method(self, method: Method) -> None:
        """ValueError where a method needs what the backend does not compute (an attention edit, the
        prompt's own tokens without its image's)."""
        super().check_method(method)
        passes = method.passes(self.model.lm.dims.num_layers).values()
        if any(p.edit is not None for p in passes):
            raise ValueError(f"method {method.name}: the transformers backend cannot edit "
                             "attention or MLP outputs (its passes act inside the engine's own "
                             "layers); run it on a model the engine has a family for")
        if any(p.image == "none" for p in passes):
            raise ValueError(f"method {method.name}: the transformers backend cannot run its "
                             "text-only pass (the prompt's tokens with its image's removed, from "
                             "the engine's own prompt layout); run it on a model the engine has a "
                             "family for")


