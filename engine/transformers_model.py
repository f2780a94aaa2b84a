"""transformers' own model of a checkpoint: the reference the engine is held against (bench's
pipeline, `pope-fast verify`) and the backend that runs every model the engine has no family for
(`TransformersModel`, run by transformers_engine.TransformersEngine): transformers'
image-text-to-text class of its model_type, on the device, NF4 as transformers' bitsandbytes
integration quantizes it; its processor and chat template make the inputs."""
from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from safetensors import SafetensorError

from ..readout.templates import render_chat
from .image_processor import ProcessorError, load_processor
from .layers.generation import rule_fields
from .utils.loader import (INDEX_BUFFERS, CheckpointError, check_stored, generation_config,
                           quiet_fallback, read_config, refuse_names, stop_ids)
from .models import family_of, misfit
from .utils.settings import Settings

# generation_config fields of sampling, which a greedy generate does not read
# (left out, as it warns of them)
SAMPLING = ("do_sample", "temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff",
            "eta_cutoff", "transformers_version")
# The image-token id a config names, under the names transformers' classes use for it.
IMAGE_TOKEN_FIELDS = ("image_token_id", "image_token_index")
# The Auto classes a config.json's auto_map names a model's own code under, the most specific first.
REMOTE_MODEL_CLASSES = ("AutoModelForImageTextToText", "AutoModelForVision2Seq",
                        "AutoModelForCausalLM", "AutoModel")


def transformers_auto_class(folder: Path, config: dict):
    """transformers' image-text-to-text Auto class, where it maps the checkpoint's model_type;
    CheckpointError where it does not."""
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as MAPPED)

    if config.get("model_type") not in MAPPED:
        remote = remote_code(config)
        raise CheckpointError(f"{folder}/config.json: model_type {config.get('model_type')!r} has "
                              "no image-text-to-text class in transformers"
                              + (f"; {remote}" if remote else ""))
    return transformers.AutoModelForImageTextToText


def remote_code(config: dict) -> str | None:
    """Why a checkpoint whose model class is its own code (config.json's auto_map, which
    transformers runs only under trust_remote_code) does not run, in words for one line; None where
    its auto_map names no model class."""
    named = config.get("auto_map") if isinstance(config.get("auto_map"), dict) else {}
    found = next((named[k] for k in REMOTE_MODEL_CLASSES if isinstance(named.get(k), str)), None)
    return None if found is None else ("its model class is the checkpoint's own code "
                                       f"(config.json's auto_map: {found}), which pope-fast does "
                                       "not run (trust_remote_code)")


def load_transformers_model(checkpoint: Path, settings: Settings):
    """The transformers model of a checkpoint, on the device, NF4 as transformers quantizes it;
    refused as the engine's loader refuses it (docs/design.md, "One loading contract"): a stored
    tensor of the wrong dtype or not finite, a tensor the class needs and the checkpoint lacks
    (transformers would fill it at random), one nothing reads, one of another shape."""
    from transformers import BitsAndBytesConfig
    from transformers.utils import logging

    config = read_config(checkpoint)
    # a model_type with no class refused before its files are read
    auto = transformers_auto_class(checkpoint, config)
    check_stored(checkpoint, quantized="quantization_config" in config)
    # a mismatch is reported, not raised, so that it is refused below in the engine's words
    kwargs = {"dtype": settings.torch_dtype, "output_loading_info": True,
              "ignore_mismatched_sizes": True}
    # the probe reads attention weights, which only eager attention returns
    if settings.probe != "none":
        kwargs["attn_implementation"] = "eager"
    if settings.quant == "nf4":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=settings.torch_dtype)
        kwargs["device_map"] = str(settings.torch_device)
    bar = logging.is_progress_bar_enabled()
    # its "Loading weights" bar: `\r` lines in a log, and the CLI has its own
    logging.disable_progress_bar()
    # its LOAD REPORT table, whose every fault is refused below in one line (a filter, not a level:
    # a level of WARNING or above turns on its tensor-parallel plan's warning)
    report = logging.get_logger("transformers.modeling_utils")
    report.addFilter(_no_load_report)
    try:
        with quiet_fallback():  # the PIL image processors' torchvision notice
            model, info = auto.from_pretrained(str(checkpoint), **kwargs)
    # a file transformers cannot read
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as why:
        if isinstance(why, CheckpointError):
            raise
        raise CheckpointError(f"{checkpoint}: transformers' {config.get('model_type')} class does "
                              f"not load it ({type(why).__name__}: {error_reason(why)})") from None
    finally:
        report.removeFilter(_no_load_report)
        if bar:
            logging.enable_progress_bar()
    _refuse_loading_faults(checkpoint, info)
    model.eval()
    return model if settings.quant == "nf4" else model.to(settings.torch_device)


def _no_load_report(record) -> bool:
    return "LOAD REPORT" not in record.getMessage()


def _refuse_loading_faults(checkpoint: Path, info: dict) -> None:
    """from_pretrained's loading info refused in the engine's lines (loader.map_names and
    iter_tensors); its error_msgs it raises itself."""
    mismatched = sorted(info["mismatched_keys"], key=lambda m: m[0])
    if mismatched:
        name, stored, wanted = mismatched[0]
        raise CheckpointError(f"{checkpoint}: tensor {name} has shape {tuple(stored)}, the config "
                              f"implies {tuple(wanted)}")
    missing = sorted(k for k in info["missing_keys"] if not k.endswith(INDEX_BUFFERS))
    refuse_names(checkpoint, missing, sorted(info["unexpected_keys"]))


@dataclass(frozen=True)
class TransformersDims:
    """What the rest of the code reads of a language model's shape (decoder.DecoderDims' names)."""

    num_layers: int
    max_positions: int
    vocab_size: int
    mrope_section: None = None  # the positions are the processor's and the class's own
    sliding_window: None = None
    row_state_bytes: int = 0  # the class runs every prompt whole: a row holds nothing past its call


@dataclass(frozen=True)
class TransformersLM:
    dims: TransformersDims


class TransformersInputs:
    """What a checkpoint's processor makes of prompts about images, as transformers' class takes
    them: a family's reference processor (`--backend transformers` on it), else transformers'
    AutoProcessor; the batch left-padded, on the device, floating tensors in the settings' dtype.
    Bench's reference, `verify`, the backend and the tests' oracles all build their inputs here."""

    def __init__(self, folder: Path, settings: Settings, family=None):
        self.settings = settings
        try:
            with quiet_fallback():  # the PIL image processors' torchvision notice
                self.processor = (family.reference_processor(folder) if family
                                  else _processor(folder))
            self.tokenizer = getattr(self.processor, "tokenizer", None) or _tokenizer(folder)
        except (OSError, ValueError) as why:
            _name_bad_json(folder, why)
            raise
        # a processor object takes a batch; a family's stand-in function (where transformers' own
        # needs torchvision, or a wrapper of it) one prompt and its image, its tokenizer beside it
        self.batched = not inspect.isfunction(self.processor)
        # transformers' AutoProcessor, not a family's reference pipeline
        self.own_processor = family is None
        # the tokenizer's own special tokens, unless set (False: none added)
        self.special_tokens: bool | None = None
        self.tokenizer.padding_side = "left"  # a batch's answer positions all last

    def __call__(self, images: list[Image.Image | None], prompts: list[str]) -> dict:
        """The processor's batch; images all None for text-only prompts."""
        if not self.batched:
            [image], [prompt] = images, prompts
            out = self.processor(images=image, text=prompt, return_tensors="pt")
        else:
            specials = ({} if self.special_tokens is None
                        else {"add_special_tokens": self.special_tokens})
            pixels = ({"images": [[image] for image in images]}
                      if any(image is not None for image in images) else {})
            out = self.processor(**pixels, text=prompts, padding=True, return_tensors="pt",
                                 **specials)
        # labels: PaliGemma's, for a loss not computed here
        out = {k: v for k, v in dict(out).items() if k != "labels"}
        dtype = self.settings.torch_dtype
        return {k: v.to(self.settings.torch_device, dtype if v.is_floating_point() else None)
                for k, v in out.items()}


class TransformersModel:
    """A checkpoint as transformers runs it, declaring what the engine's families declare
    (family.Family's names): its model_type, tokenizer, stop ids, generation config, template, the
    language model's shape. A family's checkpoint keeps the family's templates and processor
    (`--backend transformers` on it); any other renders its chat template (else the question as it
    is) and the processor places the image's tokens: a checkpoint of no family's model_type, or of
    one whose language model or tower the family does not implement (misfit)."""

    backend = "transformers"
    features_per_prompt = False

    def __init__(self, folder: Path, settings: Settings):
        config = read_config(folder)
        self.folder, self.settings, self.config = folder, settings, config
        self.family = config.get("model_type")
        family = family_of(config)
        # why its model_type's family does not run it (it runs as one without), or None
        self.misfit = misfit(config)
        self.name = f"{family.name if family else self.family} (transformers)"
        self.generation_config = generation_config(folder)  # checked before transformers reads it
        # generate applies its rules: their fields of the right types
        if settings.generation_config == "greedy":
            rule_fields(self.generation_config, str(folder / "generation_config.json"))
        self.model = load_transformers_model(folder, settings)
        self.inputs = TransformersInputs(folder, settings, family)
        self.tokenizer = self.inputs.tokenizer
        self.stop_ids = stop_ids(self.generation_config, self.tokenizer)
        self.model.generation_config = self._rules()
        chat = bool(getattr(self.tokenizer, "chat_template", None))
        self.default_template = (family.default_template if family
                                 else "reference_chat" if chat else "reference_plain")
        # else the processor places the image's tokens
        self.image_marker = family.image_marker if family else ""
        text = self.model.config.get_text_config()
        self.lm = TransformersLM(TransformersDims(
            num_layers=text.num_hidden_layers,
            max_positions=getattr(text, "max_position_embeddings", None) or 1 << 20,
            vocab_size=self.model.get_output_embeddings().weight.shape[0]))
        self.image_token_id = next((config[f] for f in IMAGE_TOKEN_FIELDS
                                    if isinstance(config.get(f), int)), None)
        self.text_only_refusal = family.text_only_refusal if family else self._text_only_refusal()
        # never cached: the key names the image alone
        self.feature_fingerprint = f"transformers:{self.family}"

    def _rules(self):
        """The generation config generate reads, as the settings apply the checkpoint's
        (engine.settings' generation_config): under "greedy" the checkpoint's own, sampling off;
        under "none" only its stop and pad ids (generate fills every field a given config leaves
        unset from the model's, so the model's is replaced)."""
        from transformers import GenerationConfig

        own = self.model.generation_config
        pad = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
               else min(self.stop_ids))
        if self.settings.generation_config == "greedy":
            rules = GenerationConfig(**{k: v for k, v in own.to_dict().items()
                                        if k not in SAMPLING})
        else:
            rules = GenerationConfig(bos_token_id=own.bos_token_id)
        rules.update(do_sample=False, eos_token_id=sorted(self.stop_ids), pad_token_id=pad)
        return rules

    def _text_only_refusal(self) -> str | None:
        """Why the class or its processor takes no prompt without an image (BLIP-2's forward
        requires pixel_values, PaliGemma's processor an image), or None."""
        pixels = inspect.signature(self.model.forward).parameters.get("pixel_values")
        if pixels is not None and pixels.default is inspect.Parameter.empty:
            return f"{type(self.model).__name__}.forward requires pixel_values"
        try:
            self.inputs.processor(text=["Is there a dog?"], return_tensors="pt")
        except (ValueError, TypeError) as why:
            return f"its processor takes no prompt without an image ({error_reason(why)})"
        return None

    def preprocess_settings(self) -> dict:
        return {"backend": self.backend}

    def preprocess(self, image: Image.Image) -> Image.Image:
        """The image as the processor takes it: RGB (the processor resizes and
        normalizes it with the prompt)."""
        return image.convert("RGB")

    def answer(self, image: Image.Image, prompt: str,
               max_new_tokens: int) -> tuple[torch.Tensor, list[int]]:
        """One prompt about one image, alone: the answer position's logits (fp32, on the CPU) and
        generate's greedy new tokens (under the settings' generation rules), as a user of the class
        computes them."""
        inputs = self.inputs([image.convert("RGB")], [prompt])
        with torch.inference_mode():
            logits = self.model(**inputs).logits[0, -1].float().cpu()
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return logits, out[0, inputs["input_ids"].shape[1]:].tolist()

    def vision_tokens(self, image: Image.Image) -> int:
        """The image tokens a prompt of this image holds (what torchrun's step costs weigh)."""
        if self.image_marker or not getattr(self.tokenizer, "chat_template", None):
            # a family's marker, or the processor places the image's tokens
            prompt = f"{self.image_marker}?"
        else:
            content = [{"type": "image"}, {"type": "text", "text": "?"}]
            prompt = render_chat(self.tokenizer, [{"role": "user", "content": content}])
        ids = self.inputs([image], [prompt])["input_ids"][0]
        return int((ids == self.image_token_id).sum()) if self.image_token_id is not None else 0

    def matmul_flops(self, counts) -> float:
        """Two FLOPs per parameter per token run (every prompt whole, every decode step), the vision
        side's counted in: an estimate for bench's floor, not a count of the class's kernels."""
        params = sum(p.numel() for p in self.model.parameters())
        return 2.0 * params * (counts.suffix_tokens + counts.decode_steps)


def error_reason(why: BaseException) -> str:
    """An exception's message for a one-line error: its first sentence of text (transformers' import
    errors start with a newline and run to lines of install advice) and, for a package that is not
    installed, its name."""
    text = next((line.strip() for line in str(why).splitlines() if line.strip()),
                type(why).__name__)
    text = re.split(r"(?<=\.) ", text, maxsplit=1)[0]
    # ModuleNotFoundError names the module; transformers' requires_backends says
    # "requires the Torchvision library"
    required = re.findall(r"requires the (\w+) library", text)
    named = getattr(why, "name", None) or next(iter(required), None)
    named = named if isinstance(why, ImportError) else None
    # the Auto classes' ValueError names it in a later sentence ("Missing optional
    # dependencies: torchvision.")
    listed = re.findall(r"Missing optional dependencies: ([\w, -]+)", str(why))
    named = named or next(iter(listed), None)
    return f"{text.rstrip('.')}; missing package: {named.lower()}" if named else text


def _processor(folder: Path):
    try:
        return load_processor(folder)
    except ProcessorError as why:
        # a file of the checkpoint that is no JSON: named with its line
        for cause in (why.whole, why.half):
            if cause is not None:
                _name_bad_json(folder, cause)
        whole, half = error_reason(why.whole), why.half and error_reason(why.half)
        tried = "" if half is None else ("; nor without its video processor"
                                         + ("" if half == whole else f": {half}"))
        raise CheckpointError(f"{folder}: transformers' processor does not load "
                              f"({whole}{tried})") from None


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _name_bad_json(folder: Path, why: BaseException) -> None:
    """A CheckpointError naming the folder's file that `why` (or the error it replaced) failed to
    parse as JSON, as the engine's loader names one: transformers reads the processor's and
    tokenizer's files without saying which."""
    bad = next((e for e in (why, why.__context__) if isinstance(e, json.JSONDecodeError)), None)
    path = bad and next((p for p in sorted(folder.glob("*.json"))
                         if p.read_text(encoding="utf-8", errors="replace") == bad.doc), None)
    if path is not None:
        raise CheckpointError(f"{path}:{bad.lineno}: malformed JSON: {bad.msg}") from None
