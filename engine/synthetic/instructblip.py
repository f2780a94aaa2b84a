"""InstructBLIP's random checkpoints (InstructBLIP-Vicuna-7B's shape and the tiny one) and
the writer."""
from __future__ import annotations

from pathlib import Path

from ..utils.loader import quiet_fallback
from . import (LLAMA_7B, LLAMA_TINY, Weights, builtin_bert_tokenizer, checkpoint_folder,
               save_checkpoint, sized, tokenizer_for, with_vocab)

# InstructBLIP-Vicuna-7B: EVA ViT-g/14 at 224 px (257 tokens), a BERT-base Q-Former with 32
# queries, Vicuna-7B.
SIZES = {
    "7b": dict(vision=dict(hidden_size=1408, intermediate_size=6144, num_hidden_layers=39,
                           num_attention_heads=16, image_size=224, patch_size=14),
               qformer=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                            num_attention_heads=12, encoder_hidden_size=1408),
               text=dict(LLAMA_7B, vocab_size=32001), queries=32),
    "tiny": dict(vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, image_size=224, patch_size=14),
                 qformer=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, encoder_hidden_size=64),
                 text=LLAMA_TINY, queries=32),
}


def write_checkpoint(folder: Path, dims: str | dict = "tiny", *, tokenizer_dir: Path | None = None,
                     qformer_tokenizer_dir: Path | None = None, weights: Weights | None = None,
                     **stream) -> Path:
    """A random-weight InstructBLIP-Vicuna checkpoint; the Q-Former's tokenizer is
    qformer_tokenizer_dir's (bert-base-uncased) or the built-in BERT-like one."""
    with quiet_fallback():  # the processor classes' torchvision notice
        from transformers import (BlipImageProcessor, InstructBlipConfig,
                                  InstructBlipForConditionalGeneration, InstructBlipProcessor,
                                  InstructBlipQFormerConfig, InstructBlipVisionConfig, LlamaConfig)

    dims, folder = sized(SIZES, dims), checkpoint_folder(folder)
    tok = tokenizer_for(folder, tokenizer_dir)
    qformer_tok = tokenizer_for(folder / "qformer_tokenizer", qformer_tokenizer_dir,
                                builtin_bert_tokenizer)
    config = InstructBlipConfig(
        vision_config=InstructBlipVisionConfig(**dims["vision"]).to_dict(),
        qformer_config=InstructBlipQFormerConfig(**dims["qformer"], vocab_size=len(qformer_tok),
                                                 pad_token_id=qformer_tok.pad_token_id).to_dict(),
        text_config=LlamaConfig(**with_vocab(dims["text"], tok), bos_token_id=1,
                                eos_token_id=2).to_dict(),
        num_query_tokens=dims["queries"], image_token_index=tok.convert_tokens_to_ids("<image>"),
        **dims.get("config", {}))
    side = dims["vision"]["image_size"]
    image_processor = BlipImageProcessor(size={"height": side, "width": side})
    processor = InstructBlipProcessor(image_processor=image_processor,
                                      tokenizer=tok, qformer_tokenizer=qformer_tok,
                                      num_query_tokens=dims["queries"])
    return save_checkpoint(folder, config, InstructBlipForConditionalGeneration, processor,
                           weights or Weights(**stream))
