"""LLaVA-1.5 (llava-hf `model_type: llava`): CLIP vision tower, two-layer projector, LLaMA
language model.

The vision tower is transformers' own CLIP module (it runs once per image, and its output is
cached); the projector and the language model are ours. Checkpoint names come in three spellings:
llava-hf's original (`language_model.model.*`, `language_model.lm_head`,
`vision_tower.vision_model.*`), the transformers 5 save format (`vision_tower.*` without
`vision_model`), and the refactored one (`model.language_model.*`, `model.vision_tower.*`,
`lm_head`); all map to the same parameters.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..inputs.coded_pixels import CodedPixels, pixels_on_device
from ..inputs.images import ClipPixels, checked_fast_path
from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError, load_module, no_init
from ..inputs.plan import PromptLayout
from ..inputs.prompts import ExpandedPromptIds
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family

# checkpoint name → our name; first match wins.
NAME_RULES = [
    (r"^(?:model\.)?language_model\.lm_head\.", "lm.lm_head."),
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?language_model\.(?:model\.)?", "lm."),
    (r"^(?:model\.)?vision_tower\.(?:vision_model\.)?", "vision."),
    (r"^(?:model\.)?multi_modal_projector\.", "projector."),
]


def _activation(name: str):
    acts = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
            "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu,
            "silu": F.silu}
    if name not in acts:
        raise CheckpointError(f"projector_hidden_act {name!r} is not supported")
    return acts[name]


class LlavaModel(Family):
    """Everything the engine needs from one LLaVA-1.5 checkpoint."""

    family = "llava"
    name = "LLaVA-1.5"
    seed_model = "LLaVA-1.5-7B"
    # Vicuna, CLIP
    inner_types = {"text_config": ("llama",), "vision_config": ("clip_vision_model",)}
    default_template = "llava_plain"
    image_marker = "<image>"
    own_aspect = None  # original LLaVA pads to square: Settings.image_aspect "pad" reproduces it
    name_rules = NAME_RULES
    # the transformers vision tower the checkpoint's config builds
    tower_class: ClassVar[str] = "CLIPVisionModel"

    def extra_shapes(self, hidden_size: int) -> dict[str, tuple[int, ...]]:
        """Tensors outside the language model, vision tower and projector (named as
        after renaming)."""
        return {}

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoImageProcessor, AutoTokenizer

        super().__init__(folder, settings)
        self.config = cfg = self.auto_config()
        self.feature_layer = cfg.vision_feature_layer
        self.select_strategy = cfg.vision_feature_select_strategy
        self.image_token_id = cfg.image_token_id
        if self.select_strategy not in ("default", "full"):
            raise CheckpointError(f"{folder}/config.json: vision_feature_select_strategy "
                                  f"{self.select_strategy!r} is not supported")
        self.tokenizer = self.shared(AutoTokenizer, "tokenizer files")
        marker_ids = self.tokenizer.encode(self.image_marker, add_special_tokens=False)
        if marker_ids != [self.image_token_id]:
            raise CheckpointError(f"{folder}: the tokenizer has no {self.image_marker} token with "
                                  f"id {self.image_token_id} (it encodes {self.image_marker!r} as "
                                  f"{marker_ids})")
        self.image_processor = self.pretrained(
            AutoImageProcessor,
            "image processor config (preprocessor_config.json or processor_config.json)",
            **self.image_processor_kwargs())
        dims = self.text_dims(cfg.text_config)
        parts = self._load(dims)
        proj, extra = parts.get("projector", {}), parts.get("extra", {})
        # The cached image features depend on exactly these weights (and the dtype
        # and quantization).
        self.feature_fingerprint = self.fingerprint(
            {f"{group}.{k}": v for group in ("vision", "projector", "extra")
             for k, v in parts.get(group, {}).items()},
            feature_layer=self.feature_layer, select_strategy=self.select_strategy,
            grid_pinpoints=getattr(cfg, "image_grid_pinpoints", None))  # LLaVA-NeXT's packing
        self._vision_tower(parts.get("vision", {}))
        self.projector = (self.linear(proj["linear_1.weight"], proj.get("linear_1.bias")),
                          _activation(cfg.projector_hidden_act),
                          self.linear(proj["linear_2.weight"], proj.get("linear_2.bias")))
        self.extra = {k: v.to(device=self.device, dtype=self.dtype) for k, v in extra.items()}
        self.lm = self.language_model(dims, parts.get("lm", {}))
        self._fast_pixels = self._checked_fast_pixels(self._fast_pixel_path())
        self._expand = ExpandedPromptIds(self.tokenizer, self.image_marker, self.image_token_id)

    def text_dims(self, text_config) -> DecoderDims:
        return DecoderDims.from_config(text_config)

    def _load(self, dims: DecoderDims) -> dict[str, dict[str, torch.Tensor]]:
        """Every tensor of the checkpoint, grouped: lm, vision, projector, extra; a tied checkpoint
        reads its logits off the embedding matrix."""
        import transformers

        cfg = self.config
        with no_init():
            self.vision = getattr(transformers, self.tower_class)(cfg.vision_config)
        vision_shapes = {f"vision.{k}": tuple(v.shape) for k, v in self.vision.state_dict().items()}
        n_layers = 1 if isinstance(self.feature_layer, int) else len(self.feature_layer)
        proj_in, h = cfg.vision_config.hidden_size * n_layers, dims.hidden_size
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        expected.update(vision_shapes)
        expected.update({"projector.linear_1.weight": (h, proj_in),
                         "projector.linear_2.weight": (h, h)})
        expected.update({f"extra.{k}": v for k, v in self.extra_shapes(h).items()})
        if cfg.multimodal_projector_bias:
            expected.update({"projector.linear_1.bias": (h,), "projector.linear_2.bias": (h,)})
        return self.load_parts(self.name_rules, expected)

    def _vision_tower(self, weights: dict[str, torch.Tensor]) -> None:
        """The CLIP tower with its weights, cut after the last layer LLaVA reads: hidden_states[0]
        is the embedding output, [i] the output of layer i, and LLaVA reads layer -2, so the tower's
        last layer never reaches the model."""
        load_module(self.vision, weights, self.folder, "vision tower")
        total = self.config.vision_config.num_hidden_layers
        layers = ([self.feature_layer] if isinstance(self.feature_layer, int)
                  else list(self.feature_layer))
        self.feature_states = [i if i >= 0 else total + 1 + i for i in layers]
        if not all(0 <= i <= total for i in self.feature_states):
            raise CheckpointError(f"{self.folder}/config.json: vision_feature_layer "
                                  f"{self.feature_layer} lies outside the tower's {total} layers")
        del self.vision.encoder.layers[max(self.feature_states):]
        self.vision = self.borrowed(self.vision)

    def preprocess_settings(self) -> dict:
        """What decides the pixels, for the vision cache key."""
        # to_dict() names the PIL and torchvision backends alike; their pixels differ, so the class
        # counts. Images with alpha reach the processor as they are (it composites them over white).
        return {"processor": self.image_processor.to_dict(),
                "backend": type(self.image_processor).__name__,
                "image_aspect": self.settings.image_aspect, "alpha": "over white"}

    def preprocess(self, image: Image.Image) -> np.ndarray | CodedPixels:
        """One image → pixel values [3, H, W] as the checkpoint's processor makes them (on the
        fast path as uint8 codes and their table, normalized on the device); `pad` first converts
        to RGB and pads to a square with the mean colour, as original LLaVA does.

        NumPy (Family.preprocess)."""
        if self.settings.image_aspect == "pad":
            image = image.convert("RGB")
            # LLaVA's expand2square truncates
            mean = tuple(int(c * 255) for c in self.image_processor.image_mean)
            side = max(image.size)
            square = Image.new("RGB", (side, side), mean)
            square.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
            image = square
        if self._fast_pixels is None:
            return self._processor_pixels(image)
        return CodedPixels(self._fast_pixels.codes(image), self._fast_pixels.table)

    def _fast_pixel_path(self):
        return ClipPixels.for_processor(self.image_processor)

    def _checked_fast_pixels(self, fast):
        """The fast path if it gives the processor's values bit for bit (checked once, at load)."""
        return checked_fast_path(fast, self._processor_pixels)

    def _processor_pixels(self, image: Image.Image) -> np.ndarray:
        out = self.image_processor(images=image, return_tensors="np")
        return np.asarray(out["pixel_values"][0])

    def vision_tokens(self, pixels) -> int:
        """Tokens one preprocess() output sends through the vision tower (patches + CLS
        per crop)."""
        vision = self.config.vision_config
        return self.crops(pixels) * ((vision.image_size // vision.patch_size) ** 2 + 1)

    def crops(self, pixels) -> int:
        return 1

    @torch.inference_mode()
    def encode_images(self, pixels: list[np.ndarray | CodedPixels]) -> list[torch.Tensor]:
        """preprocess() outputs of N images → projected image features [T, hidden] per image, in
        the model dtype; the images run as one vision batch."""
        return list(self.project(pixels_on_device(pixels, self.settings.torch_device,
                                                  self.settings.torch_dtype)))

    @torch.inference_mode()
    def project(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, H, W] → the projected features of the layer(s) LLaVA reads [N,
        T, hidden]."""
        out = self.vision(pixels.to(self.settings.torch_device, self.settings.torch_dtype),
                          output_hidden_states=True)
        picked = [out.hidden_states[i] for i in self.feature_states]
        if self.select_strategy == "default":  # drop CLS
            picked = [h[:, 1:] for h in picked]
        x = torch.cat(picked, dim=-1)
        lin1, act, lin2 = self.projector
        return lin2(act(lin1(x)))

    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]:
        """The prompt's token ids with the image marker expanded, as LlavaProcessor makes them."""
        return self._expand(prompt, num_image_tokens)

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        """Every prompt of an image shares the tokens up to its last image token."""
        return PromptLayout.of(self.prompt_ids(prompt, self.image_tokens(features)),
                               self.image_token_id)

    def vision_flops(self, counts: Counts) -> float:
        """The CLIP layers that run over every token they read, the patch embedding, the
        two-layer projector."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d, layers = vc.hidden_size, len(self.vision.encoder.layers)
        per_token = (2 * layers * (4 * d * d + 2 * d * vc.intermediate_size)
                     + 2 * 3 * vc.patch_size**2 * d)

        return (per_token + 2 * (d * h + h * h)) * counts.vision_tokens

