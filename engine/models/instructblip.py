"""InstructBLIP (transformers `model_type: instructblip`; InstructBLIP-Vicuna-7B).

An EVA ViT-g reads the image; a Q-Former reads the ViT output *and the instruction text* through 32
learned queries; a linear projection turns the 32 query outputs into the language model's first 32
input embeddings, before the BOS token and the prompt. Because the Q-Former reads the question, the
image tokens differ per question: only the ViT output is cached per image, the Q-Former runs per
prompt (batched), and there is no per-image language-model prefix to share: each prompt (its 32
image tokens, BOS and the text) runs whole. The language model is LLaMA (Vicuna).

The ViT and the Q-Former are transformers' own modules (loaded with our weights); the projection
and the language model are ours.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..layers.decoder import DecoderDims
from ..utils.loader import CheckpointError, load_grouped, load_module, no_init
from ..inputs.plan import PromptLayout
from ..utils.settings import Settings
from ..utils.stats import Counts
from .base import Family

NAME_RULES = [
    (r"^(?:model\.)?language_model\.lm_head\.", "lm.lm_head."),
    (r"^lm_head\.", "lm.lm_head."),
    (r"^(?:model\.)?language_model\.(?:model\.)?", "lm."),
    (r"^(?:model\.)?vision_model\.", "vision."),
    (r"^(?:model\.)?qformer\.", "qformer."),
    (r"^(?:model\.)?query_tokens$", "extra.query_tokens"),
    (r"^(?:model\.)?language_projection\.", "projector."),
]


class InstructBlipModel(Family):
    """Everything the engine needs from one InstructBLIP checkpoint."""

    family = "instructblip"
    name = "InstructBLIP"
    seed_model = "InstructBLIP-Vicuna-7B"
    # Vicuna
    inner_types = {"text_config": ("llama",), "vision_config": ("instructblip_vision_model",)}
    default_template = "instructblip"
    image_marker = ""  # the image enters through the Q-Former, ahead of the text
    features_per_prompt = True
    text_only_refusal = ("its language model reads the image through the Q-Former's query tokens, "
                         "and InstructBlipForConditionalGeneration requires pixel_values")
    own_aspect = "resizes every image to a square"

    def __init__(self, folder: Path, settings: Settings):
        from transformers import AutoProcessor

        super().__init__(folder, settings)
        self.config = cfg = self.auto_config()
        self.image_token_id = cfg.image_token_id
        self.num_queries = cfg.num_query_tokens
        processor = self.shared(AutoProcessor,
                                "processor files (tokenizer, qformer_tokenizer/, image processor)")
        self.tokenizer, self.qformer_tokenizer = processor.tokenizer, processor.qformer_tokenizer
        self.image_processor = processor.image_processor
        if self.tokenizer.convert_tokens_to_ids("<image>") != self.image_token_id:
            raise CheckpointError(f"{folder}: the tokenizer has no <image> token with id "
                                  f"{self.image_token_id}")
        dims = DecoderDims.from_config(cfg.text_config)
        parts, vision, qformer = self._load(dims)
        # The cached ViT output depends on the tower's weights only; the Q-Former runs per prompt.
        self.feature_fingerprint = self.fingerprint({f"vision.{k}": v
                                                     for k, v in parts["vision"].items()})
        load_module(vision, parts["vision"], folder, "vision tower")
        load_module(qformer, parts["qformer"], folder, "Q-Former")
        self.vision, self.qformer = self.borrowed(vision), self.borrowed(qformer)
        # transformers keeps query_tokens in fp32 (_keep_in_fp32_modules) and casts where it
        # is used.
        self.query_tokens = parts["extra"]["query_tokens"].to(device=self.device,
                                                              dtype=torch.float32)
        self.projector = self.linear(parts["projector"]["weight"], parts["projector"]["bias"])
        self.lm = self.language_model(dims, parts["lm"])

    def _load(self, dims: DecoderDims):
        """The checkpoint's tensors grouped (lm, vision, qformer, extra, projector), and the empty
        transformers ViT and Q-Former they go into."""
        from transformers import InstructBlipQFormerModel, InstructBlipVisionModel

        cfg = self.config
        with no_init():
            vision = InstructBlipVisionModel(cfg.vision_config)
            qformer = InstructBlipQFormerModel(cfg.qformer_config)
        expected = {f"lm.{k}": s for k, s in dims.expected_shapes().items()}
        expected.update({f"vision.{k}": tuple(v.shape) for k, v in vision.state_dict().items()})
        expected.update({f"qformer.{k}": tuple(v.shape) for k, v in qformer.state_dict().items()})
        q_hidden = cfg.qformer_config.hidden_size
        expected.update({"extra.query_tokens": (1, self.num_queries, q_hidden),
                         "projector.weight": (dims.hidden_size, q_hidden),
                         "projector.bias": (dims.hidden_size,)})
        return load_grouped(self.folder, NAME_RULES, expected), vision, qformer

    def preprocess_settings(self) -> dict:
        return {"processor": self.image_processor.to_dict(),
                "backend": type(self.image_processor).__name__}

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """One image → pixel values [3, H, W] as the checkpoint's processor makes them."""
        out = self.image_processor(images=image, return_tensors="np")
        return np.asarray(out["pixel_values"][0])

    def vision_tokens(self, pixels: np.ndarray) -> int:
        vision = self.config.vision_config
        return (vision.image_size // vision.patch_size) ** 2 + 1

    @torch.inference_mode()
    def encode_images(self, pixels: list[np.ndarray]) -> list[torch.Tensor]:
        """preprocess() outputs → the ViT's last hidden state [patches + 1, vision hidden] per
        image, what the Q-Former cross-attends to."""
        batch = torch.from_numpy(np.stack(pixels)).to(self.settings.torch_device,
                                                      self.settings.torch_dtype)
        return list(self.vision(pixel_values=batch).last_hidden_state)

    @torch.inference_mode()
    def prompt_features(self, items: list) -> list[list[torch.Tensor]]:
        """(ViT output, prompts) per image → per image, per prompt, the 32 projected query outputs
        [32, hidden] that stand in the prompt's image tokens; every prompt of every image in one
        Q-Former batch."""
        prompts = [p for item in items for p in item.prompts]
        if not prompts:
            return [[] for _ in items]
        device = self.settings.torch_device
        text = self.qformer_tokenizer(prompts, padding=True, return_tensors="pt").to(device)
        image = torch.stack([item.features for item in items for _ in item.prompts])
        # fp32, as transformers passes them
        queries = self.query_tokens.expand(len(prompts), -1, -1)
        mask = torch.cat([torch.ones(queries.shape[:2], dtype=text["attention_mask"].dtype,
                                     device=device),
                          text["attention_mask"]], dim=1)
        out = self.qformer(input_ids=text["input_ids"], attention_mask=mask, query_embeds=queries,
                           encoder_hidden_states=image,
                           encoder_attention_mask=torch.ones(image.shape[:2], dtype=torch.long,
                                                             device=device))
        query_output = out.last_hidden_state[:, : self.num_queries].to(self.settings.torch_dtype)
        features = list(self.projector(query_output))
        grouped, at = [], 0
        for ps in (item.prompts for item in items):
            grouped.append(features[at:at + len(ps)])
            at += len(ps)
        return grouped

    def prompt_ids(self, prompt: str, num_image_tokens: int) -> list[int]:
        """As InstructBlipProcessor builds them: the image tokens first, then the tokenized prompt
        with its BOS."""
        return [self.image_token_id] * num_image_tokens + list(self.tokenizer(prompt)["input_ids"])

    def layout(self, prompt: str, features: torch.Tensor) -> PromptLayout:
        """The image tokens read the question, so no two prompts share a prefix: each runs whole."""
        return PromptLayout.of(self.prompt_ids(prompt, self.image_tokens(features)),
                               self.image_token_id, share_prefix=False)

    def vision_flops(self, counts: Counts) -> float:
        """The ViT over every token, and the projection of the 32 queries per prompt (the Q-Former
        itself, ~2% at 7B dims, is left out)."""
        vc, h = self.config.vision_config, self.lm.dims.hidden_size
        d, layers = vc.hidden_size, len(self.vision.encoder.layers)
        per_token = (2 * layers * (4 * d * d + 2 * d * vc.intermediate_size)
                     + 2 * 3 * vc.patch_size**2 * d)
        return (per_token * counts.vision_tokens + 2 * counts.prompts * self.num_queries
                * self.config.qformer_config.hidden_size * h)


