"""Engine settings: one small validated dataclass. Model facts never live here; they come from the
checkpoint's own config."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

import torch

from ...readout.tool_steps import ANSWER_CUTS
from ...readout.thinking import ThinkingMode
from . import budget

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PROBES = ("none", "image-attention", "image-attention:heads")
REENCODINGS = ("none", "rgb", "load_image", "jpeg85")
# none | qwen_vl_utils:F[:MIN:MAX]: F the factor (2 x the patch size), MIN and MAX pixel bounds
# (else its defaults)
# a tool's steps (readout/tool_steps.py TOOL_STEPS)
RECORDED_WHERE_SET = ("image_reencode", "image_resize", "processor_pixels", "processor_patches",
                      "min_new_tokens", "answer_cut", "image_mask", "generation_config",
                      "repetition_penalty", "num_beams", "length_penalty", "max_length",
                      "do_sample", "temperature", "top_k", "top_p")
GENERATION_CONFIGS = ("none", "greedy", "greedy_output")
IMAGE_MASKS = ("model", "causal")
RESIZE = re.compile(r"none|qwen_vl_utils:(\d+)(?::(\d+):(\d+))?")
# what decides an image's pixels besides its bytes and its processor's own settings (feature-cache
# keys hold them)
PIXEL_SETTINGS = ("image_aspect", "image_reencode", "image_resize", "processor_pixels",
                  "processor_patches")


def check_sampling(temperature, top_k, top_p) -> None:
    """ValueError naming a sampling warper's setting that generate(do_sample=True) refuses (each
    changes nothing at its default: temperature 1.0, top_k 0, top_p 1.0)."""
    if not temperature > 0:  # TemperatureLogitsWarper refuses 0 (greedy is do_sample=False)
        raise ValueError(f"temperature must be a positive number, not {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer (0: no top-k), not {top_k!r}")
    if not 0 <= top_p <= 1:
        raise ValueError(f"top_p must be a number from 0 to 1, not {top_p!r}")


@dataclass(frozen=True)
class Settings:
    device: str = "cpu"
    dtype: str | None = None  # None: fp32 on CPU, fp16 on CUDA
    # none | nf4 (bitsandbytes NF4, blocksize 64, double quant, as the paper ran it)
    quant: str = "none"
    quantize_lm_head: bool = False  # transformers keeps lm_head in fp16 under load_in_4bit
    nf4_weights: str = "dequantized"  # dequantized: dequantize once at load (same values) | packed
    # question suffixes per prefill batch; None: sized to the device's memory (question_rows,
    # engine/utils/budget.py)
    batch_size: int | None = None
    # images whose vision calls, prefixes and questions form one step (7B: ~0.3 GB KV each); None:
    # sized to the device's memory (step_images)
    image_batch: int | None = None
    # None: each text readout's reference length; N: every one N tokens
    max_new_tokens: int | None = None
    image_aspect: str = "processor"  # processor (resize + center-crop) | pad (original LLaVA)
    # none: the image as read | rgb: PIL's convert('RGB') first, as lmms-eval's POPE task and most
    # VLMEvalKit classes open it | load_image: transformers' load_image (EXIF orientation, then
    # RGB), as a processor opens a path | jpeg85: re-encoded as a JPEG of quality 85 first, as
    # lmms-eval hands its Qwen2-VL and Gemma 3 classes every image (RGB, PIL's encoder, then decoded
    # by the processor)
    image_reencode: str = "none"
    # 0 | 1: with 1, a continuation's first token is never a stop id (the best other token where the
    # argmax is one), as generate(min_new_tokens=1) masks the eos ids at the first step
    # (VLMEvalKit's mPLUG-Owl2); the readouts of the answer position's logits are unchanged
    min_new_tokens: int = 0
    # none: a continuation is the argmax at every step, ended by the checkpoint's eos ids | greedy:
    # what transformers' generate applies at greedy decoding from the checkpoint's
    # generation_config.json (its repetition penalty, n-gram ban, minimum lengths, suppressed
    # tokens: engine/layers/generation.py), as every tool that calls generate gets it |
    # greedy_output: the same rules given the prompt as inputs_embeds alone (LLaVA's and
    # LLaVA-NeXT's own generate), so the penalty and n-gram ban read the output only; min_new_tokens
    # and repetition_penalty, where set, are the tool's own arguments over it
    generation_config: str = "none"
    # None: the generation config's, where applied (else none)
    repetition_penalty: float | None = None
    # 1: greedy | N: a beam search of N beams, as generate runs one (engine/layers/beam.py), with
    # its length penalty (LAVIS's InstructBLIP: 5 beams, length_penalty 1, repetition_penalty 1.5)
    num_beams: int = 1
    length_penalty: float = 1.0
    # None | N: generate's max_length given the prompt as inputs_embeds, N less the prompt's length
    # new tokens at most (LAVIS's 256), besides the readouts' own lengths
    max_length: int | None = None
    # False: a continuation is greedy | True: drawn as generate(do_sample=True) draws it, under the
    # warpers temperature, top_k (0: none) and top_p (engine/layers/sampling.py), each question from
    # a generator of its own seeded by `seed` and the question (VCD's sampled baseline); the answer
    # position's logit readouts are unchanged
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0  # recorded in meta.json where do_sample
    # none: a text readout reads the new tokens up to the stop token, decoded without special tokens
    # | a name in readout/tool_steps.py ANSWER_CUTS: the tool's rule reads the tool's answer, made
    # from generate's whole output (prompt, new tokens and the stop token, decoded as the tool
    # decodes them): VLMEvalKit's LLaVA_Next, lmms-eval's instructblip
    answer_cut: str = "none"
    # model: the image tokens attend as the model's own mask says (Gemma 3's: each image's tokens
    # both ways) | causal: like text, each token only to those before it, as an attention that drops
    # the model's image mask computes it (flash attention 2, with which VLMEvalKit loads Gemma 3); a
    # causal model is the same either way
    image_mask: str = "model"
    # none | qwen_vl_utils:F[:MIN:MAX]: each image first resized as qwen_vl_utils' fetch_image
    # resizes it (F: 2 x the patch size; MIN and MAX the pixel bounds a message gives it, else its
    # defaults; PIL's bicubic), as lmms-eval's Qwen-VL classes do
    image_resize: str = "none"
    # None: the checkpoint processor's pixel bounds | "MIN:MAX": the processor made with min_pixels
    # and max_pixels (AutoProcessor.from_pretrained(..., min_pixels=, max_pixels=), as lmms-eval's
    # Qwen classes)
    processor_pixels: str | None = None
    # None: the checkpoint processor's tile bounds | "MIN:MAX": its min_patches and max_patches, as
    # lmms-eval's internvl_hf class passes them (InternVL3)
    processor_patches: str | None = None
    kernels: str = "auto"  # auto: Triton on CUDA, torch references elsewhere | triton | torch
    prefix_reuse: bool = True  # False: every question prefilled whole (the reference path)
    # none | image-attention: per layer, the answer position's attention mass on image tokens (heads
    # averaged) | image-attention:heads: records keep every head too
    probe: str = "none"
    # True: each record also holds `logsumexp`, the answer position's log-sum-exp over the whole
    # vocabulary (every lm_head row once more per question), so that the probability mass outside
    # the candidates can be told; False: the candidate rows alone are gathered
    record_mass: bool = False
    # None: a thinking checkpoint's default mode (decode, readout/thinking.py) | off |
    # decode[:max_tokens=N]
    thinking: str | None = None

    def __post_init__(self):
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be cpu or cuda[:N], not {self.device!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.quant not in ("none", "nf4"):
            raise ValueError(f"quant must be none or nf4, not {self.quant!r}")
        if self.nf4_weights not in ("dequantized", "packed"):
            raise ValueError(f"nf4_weights must be dequantized or packed, not {self.nf4_weights!r}")
        if self.image_aspect not in ("processor", "pad"):
            raise ValueError(f"image_aspect must be processor or pad, not {self.image_aspect!r}")
        if self.image_reencode not in REENCODINGS:
            raise ValueError(f"image_reencode must be one of {', '.join(REENCODINGS)}, not "
                             f"{self.image_reencode!r}")
        if self.kernels not in ("auto", "triton", "torch"):
            raise ValueError(f"kernels must be auto, triton or torch, not {self.kernels!r}")
        if not RESIZE.fullmatch(self.image_resize):
            raise ValueError("image_resize must be none or qwen_vl_utils:FACTOR[:MIN:MAX], not "
                             f"{self.image_resize!r}")
        for name, unit in (("processor_pixels", "pixel"), ("processor_patches", "tile")):
            value = getattr(self, name)
            bounds = [] if value is None else value.split(":")
            if value is not None and (len(bounds) != 2 or not all(b.isdigit() for b in bounds)
                                      or not 0 < int(bounds[0]) <= int(bounds[1])):
                raise ValueError(f"{name} must be MIN:MAX, two {unit} counts with 0 < MIN <= MAX, "
                                 f"not {value!r}")
        if self.answer_cut != "none" and self.answer_cut not in ANSWER_CUTS:
            raise ValueError(f"answer_cut must be none or one of {', '.join(ANSWER_CUTS)}, not "
                             f"{self.answer_cut!r}")
        if self.image_mask not in IMAGE_MASKS:
            raise ValueError(f"image_mask must be one of {', '.join(IMAGE_MASKS)}, not "
                             f"{self.image_mask!r}")
        if self.min_new_tokens not in (0, 1):
            raise ValueError(f"min_new_tokens must be 0 or 1, not {self.min_new_tokens!r}")
        if self.generation_config not in GENERATION_CONFIGS:
            raise ValueError(f"generation_config must be one of {', '.join(GENERATION_CONFIGS)}, "
                             f"not {self.generation_config!r}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise ValueError("repetition_penalty must be a positive number, not "
                             f"{self.repetition_penalty!r}")
        if not -100 <= self.length_penalty <= 100:
            # a finite exponent (generate divides by length ** it)
            raise ValueError("length_penalty must be a number between -100 and 100, not "
                             f"{self.length_penalty!r}")
        for name in ("batch_size", "image_batch", "max_new_tokens", "num_beams", "max_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.do_sample and self.num_beams > 1:
            raise ValueError("do_sample with num_beams > 1 (a beam-search multinomial sampling) is "
                             "not computed here")
        if self.probe not in PROBES:
            raise ValueError(f"probe must be one of {', '.join(PROBES)}, not {self.probe!r}")
        if self.quant == "nf4" and self.dtype == "fp32":
            raise ValueError("NF4 computes in fp16 or bf16 (the paper: fp16); choose --dtype fp16 "
                             "or bf16")
        if self.thinking is not None:
            ThinkingMode.parse(self.thinking)
        self._check_runnable()

    def _check_runnable(self) -> None:
        """Refuse, up front, a device or kernel choice this machine cannot run (not deep in a
        load)."""
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"device must be cpu or cuda[:N], not {self.device!r}") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {self.device!r}: torch sees no CUDA device here (torch "
                                 f"{torch.__version__}, built for CUDA "
                                 f"{torch.version.cuda or 'none'}); use --device cpu")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ValueError(f"device {self.device!r}: only {torch.cuda.device_count()} CUDA "
                                 "device(s) here")
        if self.kernels == "triton":
            from ...kernels import resolve_backend  # triton: only when its kernels are asked for

            try:
                resolve_backend("triton", device)
            except RuntimeError as err:
                raise ValueError(f"kernels 'triton': {err}; use --kernels auto or torch") from None

    def processor_bounds(self, name: str = "processor_pixels") -> tuple[int, int] | None:
        """processor_pixels (or processor_patches) as (MIN, MAX), or None: the checkpoint
        processor's own."""
        value = getattr(self, name)
        return None if value is None else tuple(map(int, value.split(":")))

    @property
    def question_rows(self) -> int:
        """Question suffixes per prefill batch: batch_size, else the device's budget."""
        return self.rows_for(0)

    def rows_for(self, row_bytes: int) -> int:
        """question_rows for a model whose question rows each hold row_bytes beyond their KV
        (budget.question_rows)."""
        return self.batch_size or budget.question_rows(budget.device_memory(self.torch_device),
                                                       row_bytes)

    @property
    def step_images(self) -> int:
        """Images per step: image_batch, else the device's budget."""
        device = self.torch_device
        return self.image_batch or budget.step_images(budget.device_memory(device),
                                                      device.type == "cuda")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return DTYPES[self.dtype]
        if self.quant == "nf4" or self.torch_device.type == "cuda":
            return torch.float16
        return torch.float32

    def feature_settings(self) -> dict:
        """The settings, besides the weights, that decide cached vision features (part of their
        key)."""
        return {"dtype": str(self.torch_dtype), "quant": self.quant,
                "nf4_weights": self.nf4_weights,
                "kernels": self.kernels, "device": self.torch_device.type}

    def pixel_settings(self) -> dict:
        """The settings that decide an image's pixels (part of the key of its cached features)."""
        return {name: getattr(self, name) for name in PIXEL_SETTINGS}

    def to_json(self) -> dict:
        out = asdict(self)
        for f in fields(self):
            # recorded where set: a run's meta from before them reads as their defaults
            if f.name in RECORDED_WHERE_SET and out[f.name] == f.default:
                del out[f.name]
        if not self.do_sample:
            del out["seed"]
        if not self.record_mass:  # recorded where set: without it a run's meta.json is as it was
            del out["record_mass"]
        if self.thinking is None:
            # recorded where set: a run's meta from before it reads as the default
            del out["thinking"]
        out["resolved_dtype"] = str(self.torch_dtype).removeprefix("torch.")
        # what ran, chosen or sized
        out["batch_size"], out["image_batch"] = self.question_rows, self.step_images
        return out
