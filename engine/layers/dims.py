"""The shape of a family's language model: every size and switch the decoder (decoder.py) reads,
from the checkpoint's text config and what the family declares (`Family.text_dims`), and the tensors
a checkpoint must hold for it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderDims:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    # a sliding layer's query attends keys fewer than this many tokens back
    sliding_window: int | None = None
    # which layers slide (transformers' layer_types: "sliding_attention"); None: every layer,
    # where a window is set
    layer_sliding: tuple[bool, ...] | None = None
    qkv_bias: bool = False  # q, k and v projections carry biases
    # M-RoPE: rotary frequencies split among 3-D position streams
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False  # M-RoPE: the streams' frequencies interleaved, not in chunks
    qk_norm: bool = False  # an RMSNorm over each head of q and k (q_norm, k_norm) before RoPE
    # DeepStack: image features carry 1 + deepstack blocks of hidden_size along their last axis;
    # block 0 is the input embedding, block i + 1 is added to the image positions' output of
    # layer i.
    deepstack: int = 0
    # per layer (RoPE theta, linear scaling factor)
    layer_rope: tuple[tuple[float, float], ...] | None = None
    embed_scale: float | None = None  # text embeddings times this, in the embedding's dtype
    norm_unit_offset: bool = False  # the final RMSNorm scales by (1 + w), in fp32 before the cast
    # the tokens of one image attend to each other both ways (else causal)
    image_bidirectional: bool = False
    # with image_bidirectional: on full-attention layers too (else sliding ones only)
    image_blocks_full: bool = True
    # per layer, the layer whose K and V it attends with (itself, or an earlier one whose it
    # shares); None: its own
    kv_source: tuple[int, ...] | None = None
    # final_logit_softcapping: logits read as cap * tanh(logits / cap)
    logit_softcap: float | None = None
    # max_position_embeddings: how long a prompt and its continuation may be
    max_positions: int = 4096
    # Mixture of experts (Qwen3-VL-MoE, Qwen3.5-MoE): on the layers `sparse_layers` marks (None:
    # every layer), the MLP is `experts` gated MLPs `expert_size` wide, each token's top
    # `experts_per_token` by the router (moe.py), plus, where shared_expert_size, one gated MLP
    # every token goes through, scaled by a sigmoid gate
    experts: int = 0
    experts_per_token: int = 0
    expert_size: int = 0
    sparse_layers: tuple[bool, ...] | None = None
    shared_expert_size: int = 0
    # the experts stored one tensor each (transformers' save_pretrained), not fused
    experts_split: bool = False
    # RoPE turns the first rotary_dim of each head's dims (partial_rotary_factor)
    partial_rotary: float = 1.0
    # Llama 3.1's RoPE scaling (rope_type "llama3"): factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings (ops.llama3_frequencies)
    rope_llama3: tuple[float, float, float, int] | None = None

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary)

    @classmethod
    def from_config(cls, cfg) -> "DecoderDims":
        """From a transformers text config (LlamaConfig, MistralConfig, Qwen2-VL's), whose defaults
        fill the gaps that llava-hf's abbreviated `text_config` leaves; the switches a family's
        config does not spell are the family's `text_dims` to set."""
        rope = getattr(cfg, "rope_parameters", None) or {}
        if not isinstance(rope, dict):
            rope = {}
        rope_type = rope.get("rope_type", "default")
        legacy = getattr(cfg, "rope_scaling", None)
        legacy_type = None if not isinstance(legacy, dict) else \
            legacy.get("rope_type", legacy.get("type"))
        if legacy_type not in (None, "default"):
            rope_type, rope = legacy_type, {**legacy, **rope}
        if rope_type not in ("default", "llama3"):
            raise NotImplementedError(f"rope type {rope_type} is not supported "
                                      "(default and llama3 RoPE only)")
        llama3 = None if rope_type == "default" else (
            float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
            int(rope["original_max_position_embeddings"]))
        theta = rope.get("rope_theta")
        heads = cfg.num_attention_heads
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) \
            else None
        # Qwen2's: only the layers from max_window_layers on slide
        kinds = getattr(cfg, "layer_types", None)
        # an all-MoE language model's config has no intermediate_size (Qwen3.5-MoE's: every
        # MLP is its experts)
        return cls(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                   intermediate_size=getattr(cfg, "intermediate_size", None) or 0,
                   num_layers=cfg.num_hidden_layers, num_heads=heads,
                   num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                   rms_eps=cfg.rms_norm_eps,
                   rope_theta=float(theta or getattr(cfg, "rope_theta", 10000.0)),
                   sliding_window=window,
                   layer_sliding=tuple(k == "sliding_attention" for k in kinds)
                   if window and kinds else None,
                   qkv_bias=bool(getattr(cfg, "attention_bias", False)),
                   mrope_section=tuple(section) if (section := rope.get("mrope_section")) else None,
                   mrope_interleaved=bool(rope.get("mrope_interleaved", False)),
                   max_positions=getattr(cfg, "max_position_embeddings", None) or 4096,
                   rope_llama3=llama3)

    def slides(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window."""
        return self.sliding_window is not None and (self.layer_sliding is None
                                                    or self.layer_sliding[layer])

    def window(self, layer: int) -> int | None:
        """`layer`'s sliding window (None: it attends to every earlier key)."""
        return self.sliding_window if self.slides(layer) else None

    def bidirectional(self, layer: int) -> bool:
        """Whether the tokens of one image see each other both ways on `layer`."""
        return self.image_bidirectional and (self.image_blocks_full or self.slides(layer))

    def kv_of(self, layer: int) -> int:
        """The layer whose K and V `layer` attends with."""
        return layer if self.kv_source is None else self.kv_source[layer]

    def sparse(self, layer: int) -> bool:
        """Whether `layer`'s MLP is the mixture of experts."""
        return self.experts > 0 and (self.sparse_layers is None or self.sparse_layers[layer])

    @property
    def row_state_bytes(self) -> int:
        """What a question row holds beyond its KV (none here; a hybrid decoder's recurrent
        state)."""
        return 0

    def mlp_width(self, layer: int) -> int:
        """The MLP width one token computes through on `layer` (its experts' together on a sparse
        one)."""
        if not self.sparse(layer):
            return self.intermediate_size
        return self.experts_per_token * self.expert_size + self.shared_expert_size

    def mlp_shapes(self, layer: int) -> dict[str, tuple[int, ...] | list[tuple[int, ...]]]:
        """The MLP's tensors of `layer`. A sparse layer's experts are fused as transformers holds
        them, [experts, 2 x width, hidden] and [experts, hidden, width], or transposed in their last
        two axes as the published checkpoints store them (transformers' conversion_mapping
        transposes those on load): either shape is taken; or one tensor each (experts_split:
        experts.<j>.gate_proj, up_proj, down_proj), as transformers saves Qwen3.5-MoE. The shared
        expert, where there is one, is a gated MLP with its sigmoid gate."""
        h, p = self.hidden_size, f"layers.{layer}.mlp."

        def gated(prefix: str, i: int) -> dict[str, tuple[int, int]]:
            return {prefix + "gate_proj.weight": (i, h), prefix + "up_proj.weight": (i, h),
                    prefix + "down_proj.weight": (h, i)}

        if not self.sparse(layer):
            return gated(p, self.intermediate_size)
        e, w = self.experts, self.expert_size
        shapes = {p + "gate.weight": (e, h)}
        if self.experts_split:
            shapes.update({k: v for j in range(e) for k, v in gated(f"{p}experts.{j}.", w).items()})
        else:
            shapes.update({p + "experts.gate_up_proj": [(e, 2 * w, h), (e, h, 2 * w)],
                           p + "experts.down_proj": [(e, h, w), (e, w, h)]})
        if self.shared_expert_size:
            shapes.update(gated(p + "shared_expert.", self.shared_expert_size))
            shapes[p + "shared_expert_gate.weight"] = (1, h)
        return shapes

    def expected_shapes(self) -> dict[str, tuple[int, ...] | list[tuple[int, ...]]]:
        h, d = self.hidden_size, self.head_dim
        shapes = {"embed_tokens.weight": (self.vocab_size, h), "norm.weight": (h,),
                  "lm_head.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (self.num_heads * d, h),
                p + "self_attn.k_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, self.num_heads * d),
                **self.mlp_shapes(i),
            })
            if self.qk_norm:
                shapes.update({p + "self_attn.q_norm.weight": (d,),
                               p + "self_attn.k_norm.weight": (d,)})
            if self.qkv_bias:
                shapes.update({p + "self_attn.q_proj.bias": (self.num_heads * d,),
                               p + "self_attn.k_proj.bias": (self.num_kv_heads * d,),
                               p + "self_attn.v_proj.bias": (self.num_kv_heads * d,)})
        return shapes
