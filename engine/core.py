"""The engine: load a checkpoint once, then answer yes/no questions about images under every readout.

Per image: projected features (cached by content) → the shared prompt prefix prefilled once → the
question suffixes prefilled in batches against it → candidate logits and the argmax at each answer
position → (only for string readouts) a short greedy continuation.
"""
from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Protocol
from pathlib import Path

import torch
from PIL import Image

from ..readout import READOUTS, Template, TokenSets, derive_token_sets, get_template, parse_readouts
from ..readout.templates import SAMPLE_QUESTION
from ..readout.protocols import FIRST_TOKEN, LOGIT, TEXT
from ..readout.tokens import outside_vocabulary, tokenizer_info
from .fingerprint import checkpoint_digests
from .images import DECODE_ERRORS, ImageError, LoadedImage, read_image, to_rgb
from .llama import Intervention, LlamaLM
from .llava import LlavaModel
from .instructblip import InstructBlipModel
from .llava_next import LlavaNextModel
from .qwen2_vl import Qwen2VLModel
from .loader import CheckpointError, read_config
from .settings import Settings
from .vision_cache import VisionCache, feature_key

class Family(Protocol):
    """What the engine asks of a model family file (llava.py, llava_next.py, instructblip.py,
    qwen2_vl.py): built from a checkpoint folder and Settings, it owns the checkpoint's tokenizer,
    processor, vision side and language model (a LlamaLM), and turns images into the features that
    stand in for the prompt's image tokens."""

    family: str  # the checkpoint's config.json model_type
    folder: Path
    default_template: str
    image_marker: str  # where the image goes in a rendered prompt ("" when it enters otherwise)
    features_per_prompt: bool  # True when the image tokens depend on the prompt (InstructBLIP)
    tokenizer: object
    lm: LlamaLM
    image_token_id: int
    stop_ids: set[int]
    feature_fingerprint: str  # everything besides the pixels that the cached features depend on

    def preprocess_settings(self) -> dict: ...  # what decides the pixels (part of the cache key)
    def preprocess(self, image: Image.Image) -> object: ...  # NumPy only: runs in worker threads
    def vision_tokens(self, pixels: object) -> int: ...  # tokens through the tower, for FLOP counts
    def encode_images(self, pixels: list) -> list[torch.Tensor]: ...  # cached per image
    def image_tokens(self, features: torch.Tensor) -> int: ...
    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]: ...
    # Optional: prompt_features(items) when features_per_prompt; positions(ids, features) -> [3, L]
    # when the language model uses M-RoPE (lm.dims.mrope_section).


# Modes a PNG holds as they are; any other in-memory image is converted first, as preprocessing
# converts it when the same image comes from a file.
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")

FAMILIES: dict[str, type[Family]] = {m.family: m for m in (LlavaModel, LlavaNextModel, InstructBlipModel,
                                                           Qwen2VLModel)}


@dataclass
class Answer:
    """One question's raw outputs at the answer position, and its decisions."""

    question: str
    first_token_id: int
    candidate_logits: dict[int, float]
    decoded: str | None
    predictions: dict[str, str]


@dataclass
class Timings:
    """Seconds per phase, summed over calls (for the benchmark's phase table)."""

    image_encode: float = 0.0
    prefix_prefill: float = 0.0
    question_prefill: float = 0.0
    decode: float = 0.0

    def to_json(self) -> dict:
        return {k: round(v, 4) for k, v in vars(self).items()}


@dataclass
class Counts:
    """Work done, summed over calls: what the benchmark turns into FLOPs."""

    images_encoded: int = 0
    vision_tokens: int = 0  # tokens through the vision tower (LLaVA: 577 per crop; Qwen2-VL: patches)
    prompts: int = 0
    prefix_tokens: int = 0
    suffix_tokens: int = 0
    decode_steps: int = 0


class _Clock:
    """Adds elapsed wall time to one Timings field; synchronises CUDA so the phase is honest."""

    def __init__(self, timings: Timings, field: str, device: torch.device):
        self.timings, self.field, self.device = timings, field, device

    def __enter__(self):
        self._sync()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self._sync()
        setattr(self.timings, self.field, getattr(self.timings, self.field) + time.perf_counter() - self.start)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def load_model(folder: str | Path, settings: Settings) -> Family:
    """The family object for a local checkpoint folder (never the hub)."""
    folder = Path(folder).expanduser().resolve()
    config = read_config(folder)
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{folder}/config.json: model_type {model_type!r} is not supported "
                              f"(supported: {', '.join(FAMILIES)})")
    return FAMILIES[model_type](folder, settings)


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
        self.generate = any(READOUTS[n].kind == TEXT for n in self.readouts)
        self.timings = Timings()
        self.counts = Counts()
        self._preprocess = model.preprocess_settings()  # part of every feature-cache key
        text_config = getattr(getattr(model, "config", None), "text_config", None)
        positions = getattr(text_config, "max_position_embeddings", None)
        if self.generate and positions and settings.max_new_tokens >= positions:
            raise ValueError(f"max_new_tokens {settings.max_new_tokens} leaves no room for a prompt in the model's "
                             f"{positions} positions (max_position_embeddings)")

    @classmethod
    def load(cls, folder: str | Path, settings: Settings | None = None, *, template: str | None = None,
             readouts: str | list[str] | None = None, cache_dir: str | Path | None = None) -> "Engine":
        settings = settings or Settings()
        return cls(load_model(folder, settings), settings, template, readouts, VisionCache(cache_dir))

    def warmup(self) -> None:
        """One untimed image batch through every step a sweep takes (preprocessing, vision, prefixes,
        a full question batch, and decoding when a string readout asks for it), so one-time costs land
        here rather than in the first batch: Triton compiles, CUDA and oneDNN setup for these shapes,
        allocator growth (on the CPU machine a cold first sweep of 60 built-in questions took 0.16 s, a
        warm one 0.13 s). Nothing is cached; timings and counts restart."""
        image = Image.new("RGB", (640, 480), (124, 116, 104))
        pixels = [self.model.preprocess(image)] * self.settings.image_batch
        prompts = [self.prompt(SAMPLE_QUESTION)] * max(1, self.settings.batch_size // self.settings.image_batch)
        self.run_images([(features, prompts) for features in self.model.encode_images(pixels)])
        if self.settings.torch_device.type == "cuda":
            torch.cuda.synchronize(self.settings.torch_device)
        self.timings, self.counts = Timings(), Counts()

    def meta(self) -> dict:
        if getattr(self, "_file_digests", None) is None:  # hashed once per engine, not per call
            self._file_digests = checkpoint_digests(self.model.folder)
        return {
            "model": {"path": str(self.model.folder), "family": self.model.family, "files": self._file_digests},
            "template": self.template.name,
            "prompt_example": self.template.render(SAMPLE_QUESTION, self.model.tokenizer),
            "readouts": self.readouts,
            "token_sets": {n: s.to_json() for n, s in self.token_sets.items()},
            "candidate_ids": self.candidate_ids,
            "tokenizer": tokenizer_info(self.model.tokenizer),
            "settings": self.settings.to_json(),
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
        if todo:
            with _Clock(self.timings, "image_encode", self.settings.torch_device):
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

    def prompt(self, question: str) -> str:
        return self.template.render(question, self.model.tokenizer)

    def decide(self, candidate_logits: dict[int, float], first_token_id: int | None,
               decoded: str | None) -> dict[str, str]:
        """Every requested readout's decision from one answer position's outputs; text readouts are
        left out when there is no decoded text (adjusted logits, say)."""
        out = {}
        for name in self.readouts:
            readout = READOUTS[name]
            if readout.kind == TEXT and decoded is None:
                continue
            sets = self.token_sets.get(name) if readout.kind in (LOGIT, FIRST_TOKEN) else None
            out[name] = readout(sets, candidate_logits, first_token_id, decoded)
        return out

    def score(self, image, questions: list[str], intervention: Intervention | None = None) -> list[Answer]:
        """Answer questions about one image (a path, a PIL image or a LoadedImage)."""
        raw = self.run_images([(self.features(image), [self.prompt(q) for q in questions])], intervention)[0]
        return [Answer(q, first, logits, text, self.decide(logits, first, text))
                for q, (first, logits, text) in zip(questions, raw)]

    def run_images(self, items: list[tuple[torch.Tensor, list[str]]], intervention: Intervention | None = None
                   ) -> list[list[tuple[int, dict[int, float], str | None]]]:
        """items: (image features [T, hidden], prompts) per image → per image, per prompt, (first token id,
        candidate logits, decoded text or None).

        Each image's prompt prefix (up to its last image token) is prefilled once, the prefixes of all
        images in one batch per prefix length; question suffixes then run in batches of batch_size
        rows, grouped by the prefix they continue.
        """
        if self.model.features_per_prompt:
            # InstructBLIP: each prompt's image tokens come from a Q-Former that reads the prompt, so
            # every prompt becomes an item of its own (and runs whole: see _run_items).
            with _Clock(self.timings, "image_encode", self.settings.torch_device):
                per_prompt = self.model.prompt_features(items)
            flat = self._run_items([(f, [p]) for (_, prompts), fs in zip(items, per_prompt)
                                    for p, f in zip(prompts, fs)], intervention)
            out, at = [], 0
            for _, prompts in items:
                out.append([row[0] for row in flat[at:at + len(prompts)]])
                at += len(prompts)
            return out
        return self._run_items(items, intervention)

    def _run_items(self, items: list[tuple[torch.Tensor, list[str]]], intervention: Intervention | None
                   ) -> list[list[tuple[int, dict[int, float], str | None]]]:
        model, lm, device = self.model, self.model.lm, self.settings.torch_device
        results = [[None] * len(prompts) for _, prompts in items]
        # Work rows (image, prompt, prefix ids, suffix ids), grouped by prefix length; -1 = no prefix.
        by_length: dict[int, list[tuple[int, int, tuple[int, ...], list[int]]]] = {}
        mrope = lm.dims.mrope_section is not None
        # InstructBLIP: no prefix is shared (each prompt has its own image tokens), so each prompt runs
        # whole, in one pass instead of a prefix pass and a suffix pass.
        reuse = self.settings.prefix_reuse and not model.features_per_prompt
        streams: dict[tuple[int, int], torch.Tensor] = {}  # M-RoPE: (image, prompt) → positions [3, L]
        for it, (features, prompts) in enumerate(items):
            for pi, prompt in enumerate(prompts):
                ids = model.prompt_ids(prompt, model.image_tokens(features))
                if mrope:
                    streams[it, pi] = model.positions(ids, features)
                window = lm.dims.sliding_window
                longest = len(ids) + (self.settings.max_new_tokens - 1 if self.generate else 0)
                if window is not None and longest > window:  # shorter sequences attend exactly as without one
                    raise NotImplementedError(f"a {longest}-token sequence exceeds the model's sliding window of "
                                              f"{window} tokens, which the engine does not implement")
                cut = _prefix_length(ids, model.image_token_id) if reuse else 0
                by_length.setdefault(cut or -1, []).append((it, pi, tuple(ids[:cut]), ids[cut:]))
        for length, rows in by_length.items():
            prefix, slot_of = None, {}
            if length > 0:
                first_row = {}
                for it, pi, pre, _ in rows:
                    slot_of.setdefault((it, pre), len(slot_of))
                    first_row.setdefault((it, pre), pi)
                with _Clock(self.timings, "prefix_prefill", device):
                    embeds = torch.stack([lm.embed(torch.tensor(pre, device=device), model.image_token_id,
                                                   items[it][0]) for it, pre in slot_of])
                    positions = torch.stack([streams[it, first_row[it, pre]][:, :length] for it, pre in slot_of],
                                            dim=1) if mrope else None  # [3, G, P]
                    prefix = lm.prefill_prefix(embeds, intervention, positions)
                self.counts.prefix_tokens += length * len(slot_of)
                rows.sort(key=lambda r: slot_of[r[0], r[2]])
            for start in range(0, len(rows), self.settings.batch_size):
                batch = rows[start:start + self.settings.batch_size]
                slots = [slot_of[it, pre] for it, _, pre, _ in batch] if prefix is not None else None
                self.counts.prompts += len(batch)
                self.counts.suffix_tokens += sum(len(r[3]) for r in batch)
                with _Clock(self.timings, "question_prefill", device):
                    embeds, lengths = self._embed_suffixes([(items[it][0], suf) for it, _, _, suf in batch])
                    positions = None
                    if mrope and prefix is None:  # whole prompts: their own streams, right-padded
                        positions = torch.nn.utils.rnn.pad_sequence(
                            [streams[it, pi].T for it, pi, _, _ in batch], batch_first=True).permute(2, 0, 1)
                    last, suffix_kv = lm.prefill_suffix(prefix, slots, embeds, lengths, intervention, positions)
                    logits, first = lm.answer(last, self.candidate_ids)
                    if intervention is not None:
                        adjusted = intervention.logits(logits, self.candidate_ids)
                        logits = logits if adjusted is None else adjusted
                texts = [None] * len(batch)
                if self.generate:
                    with _Clock(self.timings, "decode", device):
                        tokens = lm.decode(prefix, slots, suffix_kv, first, self.settings.max_new_tokens,
                                           model.stop_ids)
                    self.counts.decode_steps += (tokens.shape[1] - 1) * len(batch)
                    texts = [self._text(row) for row in tokens.tolist()]
                logits_rows, first_ids = logits.tolist(), first.tolist()
                for j, (it, pi, _, _) in enumerate(batch):
                    results[it][pi] = (first_ids[j], dict(zip(self.candidate_ids, logits_rows[j])), texts[j])
        return results

    def _embed_suffixes(self, suffixes: list[tuple[torch.Tensor, list[int]]]):
        """(image features, suffix ids) per row → right-padded [B, S, hidden] embeddings and lengths [B];
        a suffix holding the image (no prefix reuse) gets its image's features spliced in."""
        device = self.settings.torch_device
        width = max(len(s) for _, s in suffixes)
        lengths = torch.tensor([len(s) for _, s in suffixes], device=device)
        padded = torch.tensor([s + [s[-1]] * (width - len(s)) for _, s in suffixes], device=device)  # pads unread
        lm, image_token = self.model.lm, self.model.image_token_id
        embeds = lm.embed(padded)
        for row, (features, s) in enumerate(suffixes):
            if image_token in s:
                embeds[row, : len(s)] = lm.embed(padded[row, : len(s)], image_token, features)
        return embeds, lengths

    def _text(self, tokens: list[int]) -> str:
        """Decode only the new tokens, up to the first stop token: decoding the prompt too is how
        published InstructBLIP string_parse scores picked up 'yes' from 'Answer yes or no only'."""
        cut = next((k for k, t in enumerate(tokens) if t in self.model.stop_ids), len(tokens))
        return self.model.tokenizer.decode(tokens[:cut], skip_special_tokens=True)


def _prefix_length(ids: list[int], image_token_id: int) -> int:
    """Tokens up to and including the last image token (0 when the prompt holds no image), leaving
    at least one token to read the answer from."""
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == image_token_id:
            return min(i + 1, len(ids) - 1)
    return 0
