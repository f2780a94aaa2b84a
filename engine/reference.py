"""transformers' own model of a checkpoint, the reference the engine is held against (bench's pipeline,
`pope-fast verify`): the class its config names through AutoModelForImageTextToText, on the device, NF4 as
transformers' bitsandbytes integration quantizes it."""
from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from .settings import Settings


def load_reference(checkpoint: Path, settings: Settings):
    """The transformers model of a checkpoint, on the device, NF4 as transformers quantizes it."""
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig

    kwargs = {"dtype": settings.torch_dtype}
    if settings.quant == "nf4":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=settings.torch_dtype)
        kwargs["device_map"] = str(settings.torch_device)
    model = AutoModelForImageTextToText.from_pretrained(str(checkpoint), **kwargs).eval()
    return model if settings.quant == "nf4" else model.to(settings.torch_device)


def reference_answer(model, processor, image: Path, prompt: str, settings: Settings, max_new_tokens: int
                     ) -> tuple[torch.Tensor, list[int]]:
    """transformers' answer-position logits (fp32, on the CPU) and its greedy new tokens (generate, which applies
    the checkpoint's generation_config.json) for one prompt about one image."""
    inputs = processor(images=Image.open(image).convert("RGB"), text=prompt, return_tensors="pt")
    inputs = {k: v.to(settings.torch_device) for k, v in inputs.items()}
    inputs["pixel_values"] = inputs["pixel_values"].to(settings.torch_dtype)
    with torch.inference_mode():
        logits = model(**inputs).logits[0, -1].float().cpu()
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return logits, out[0, inputs["input_ids"].shape[1]:].tolist()
