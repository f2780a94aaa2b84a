"""Idefics3 (transformers `model_type: idefics3`, Idefics3ForConditionalGeneration;
Idefics3-8B-Llama3, and SmolVLM-Instruct and its 256M / 500M, whose checkpoints are this class).

Idefics3ImageProcessor resizes an image (its longest edge to `size`), rounds it up to whole tiles of
the tower's square (`max_image_size`) and cuts it into rows x cols tiles, then adds the whole image
resized to one tile as a global view; an image that fits one tile (or a processor without
splitting) is the global view alone. Each view runs through the SigLIP-like tower
(Idefics3VisionTransformer, transformers' module: its post-layernorm output), and
Idefics3Connector pixel-shuffles its patch grid by `scale_factor` (2 x 2 neighbours into one
feature of 4x the width) and projects it with one bias-free Linear: (side / scale)² tokens a view
(SmolVLM-Instruct: 81 of a 384-px tile; a 640 x 480 COCO image is 4 x 3 tiles + the global view at
its 1,536-px longest edge, 1,053 image tokens).

Idefics3Processor writes the prompt's `<image>` as, per tile,
`<fake_token_around_image><row_r_col_c>` + its image tokens, a newline after each row, then
`\\n<fake_token_around_image><global-img>` + the global view's tokens + `<fake_token_around_image>`
(replace_image_token, the processor's own code; the global view alone without the tiles). The
features keep that grid in their shape, [rows + 1, cols, tokens, hidden]: the tiles row by row, the
global view first in the last row, the rest of that row zeros past the image's tokens (never read:
the prompt's slots take the flattened features in order). The language model is LLaMA's (SmolVLM's
SmolLM2 is too).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError, load_module, no_init
from ..inputs.plan import PromptLayout
from ..inputs.prompts import PromptMemo
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family

IMAGE = "<image>"
NAME_RULES = [
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?text_model\.", "lm."),
    (r"^(?:model\.)?vision_model\.", "vision."),
    (r"^(?:model\.)?connector\.", "connector."),
]


class Idefics3Model(Family):
    """Everything the engine needs from one Idefics3 checkpoint."""

    family = "idefics3"
    name = "Idefics3"
    seed_model = "Idefics3-8B-Llama3"
    inner_types = {"text_config": ("llama",), "vision_config": ("idefics3_vision",)}
    default_template = "idefics3_chat"
    image_marker = IMAGE
    own_aspect = "tiles every image its own way"

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoProcessor

        super().__init__(folder, settings)
        self.config = cfg = self.auto_config()
        # the processor's tokenizer: Idefics3Processor registers its image tokens as specials on it,
        # as the reference pipeline's does
        self.processor = self.shared(
            AutoProcessor, "processor files (processor_config.json and the tokenizer)")
        self.tokenizer, self.image_processor = (self.processor.tokenizer,
                                                self.processor.image_processor)
        self.image_token_id = cfg.image_token_id
        if self.tokenizer.encode(IMAGE, add_special_tokens=False) != [self.image_token_id]:
            raise CheckpointError(f"{folder}: the tokenizer has no {IMAGE} token with id "
                                  f"{self.image_token_id}")
        vc, self.scale = cfg.vision_config, cfg.scale_factor
        self.side = vc.image_size // vc.patch_size  # patches per view side
        if self.side % self.scale:
            raise CheckpointError(f"{folder}/config.json: a {self.side} x {self.side} patch grid "
                                  f"does not pixel-shuffle by scale_factor {self.scale}")
        self.per_view = (self.side // self.scale) ** 2
        if self.processor.image_seq_len != self.per_view:
            raise CheckpointError(f"{folder}: the processor writes {self.processor.image_seq_len} "
                                  f"image tokens a view (image_seq_len), the model makes "
                                  f"{self.per_view}")
        dims = DecoderDims.from_config(cfg.text_config)
        parts = self._load(dims)
        self.feature_fingerprint = self.fingerprint(
            {f"{group}.{k}": v for group in ("vision", "connector")
             for k, v in parts.get(group, {}).items()},
            scale_factor=self.scale)
        load_module(self.vision, parts.get("vision", {}), folder, "vision tower")
        load_module(self.connector, parts.get("connector", {}), folder, "connector")
        self.vision, self.connector = self.borrowed(self.vision), self.borrowed(self.connector)
        self.lm = self.language_model(dims, parts["lm"])
        self._ids = PromptMemo(self._expanded_ids)

    def _load(self, dims: DecoderDims) -> dict[str, dict[str, torch.Tensor]]:
        """Every tensor, grouped lm / vision / connector."""
        from transformers.models.idefics3.modeling_idefics3 import (Idefics3Connector,
                                                                    Idefics3VisionTransformer)

        with no_init():
            self.vision = Idefics3VisionTransformer(self.config.vision_config)
            self.connector = Idefics3Connector(self.config)
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        expected.update({f"vision.{k}": tuple(v.shape)
                         for k, v in self.vision.state_dict().items()})
        expected.update({f"connector.{k}": tuple(v.shape)
                         for k, v in self.connector.state_dict().items()})
        return self.load_parts(NAME_RULES, expected)

    def tied(self) -> bool:
        """The config's tie_word_embeddings (false where absent), unless an lm_head is stored all
        the same, which transformers 5 then keeps untied."""
        stored = self.stores_lm_head(NAME_RULES)
        return super().tied() and not stored

    # --- pixels and features ----------------------------------------------------------------------

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(),
                "backend": type(self.image_processor).__name__, "alpha": "over white"}

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, int, int]:
        """One image → its views [rows * cols + 1, 3, S, S] (the tiles row by row, then the global
        view; the global view alone where rows = cols = 0) and the grid, as Idefics3Processor has
        its image processor make them (NumPy: Family.preprocess)."""
        out = self.image_processor(images=image, return_row_col_info=True, return_tensors="np")
        # one image's views are whole squares: no padding to mask
        if not np.all(out["pixel_attention_mask"]):
            raise ValueError("the image processor padded one image's views; the engine runs whole "
                             "views only")
        return np.asarray(out["pixel_values"][0]), int(out["rows"][0][0]), int(out["cols"][0][0])

    def vision_tokens(self, pixels) -> int:
        return pixels[0].shape[0] * self.side**2

    @torch.inference_mode()
    def encode_images(self, pixels: list[tuple[np.ndarray, int, int]]) -> list[torch.Tensor]:
        """preprocess() outputs → per image its features [rows + 1, cols, tokens, hidden] (the
        module docstring); every view of every image in one tower call
        (Idefics3Model.get_image_features)."""
        views = torch.from_numpy(np.concatenate([p[0] for p in pixels])).to(self.device,
                                                                             self.dtype)
        features = self.connector(self.vision(pixel_values=views).last_hidden_state)
        return [self._grid(f, rows, cols) for f, (_, rows, cols) in
                zip(features.split([p[0].shape[0] for p in pixels]), pixels)]

    @staticmethod
    def _grid(features: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """[rows * cols + 1, tokens, hidden] → [rows + 1, cols, tokens, hidden] ([1, 1, ...]: the
        global view alone)."""
        if rows == 0:
            return features[:1, None]
        pad = features.new_zeros(cols - 1, *features.shape[1:])
        return torch.cat([features, pad]).view(rows + 1, cols, *features.shape[1:])

    @staticmethod
    def grid(features: torch.Tensor) -> tuple[int, int]:
        """The (rows, cols) of the tiles that made features ((0, 0): the global view alone)."""
        rows = features.shape[0] - 1
        return (rows, features.shape[1]) if rows else (0, 0)

    def image_tokens(self, features: torch.Tensor) -> int:
        rows, cols = self.grid(features)
        return (rows * cols + 1) * features.shape[2]

    # --- the prompt -------------------------------------------------------------------------------

    def _expanded_ids(self, key: tuple[str, int, int]) -> list[int]:
        prompt, rows, cols = key
        expanded = self.processor.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)
        text = prompt.replace(IMAGE, expanded)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, prompt: str, rows: int, cols: int) -> list[int]:
        """The prompt's ids as Idefics3Processor makes them for an image of that grid, tokenized
        without added special tokens: a chat template writes its BOS itself (Idefics3-8B's
        <|begin_of_text|>; SmolVLM's tokenizer adds none either way), as the transformers backend
        tokenized it."""
        if prompt.count(IMAGE) != 1:
            raise ValueError(f"prompt must hold exactly one {IMAGE}: {prompt!r}")
        return self._ids((prompt, rows, cols))

    def text_ids(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        """Every prompt of an image shares the tokens up to the global view's last image token."""
        return PromptLayout.of(self.prompt_ids(prompt, *self.grid(features)), self.image_token_id)

    def vision_flops(self, counts: Counts) -> float:
        """The tower's layers and patch embedding over every patch, then the connector's projection
        over the shuffled features (a scale² of them, scale² times as wide)."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d = vc.hidden_size
        per_patch = (2 * vc.num_hidden_layers * (4 * d * d + 2 * d * vc.intermediate_size)
                     + 2 * 3 * vc.patch_size**2 * d)
        return (per_patch + 2 * d * h) * counts.vision_tokens

    @classmethod
    def reference_processor(cls, checkpoint: Path):
        """Idefics3Processor, tokenizing without added special tokens, as the engine does
        (prompt_ids)."""
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(checkpoint))

        def process(images, text: str, return_tensors: str):
            return processor(images=images, text=text, return_tensors=return_tensors,
                             add_special_tokens=False)

        process.tokenizer = processor.tokenizer
        return process
