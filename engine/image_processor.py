"""A checkpoint's processor as transformers builds it, or its image half where its video half needs
torchvision.

The newest families' processors (GLM-4.1V, LLaVA-OneVision-1.5, Ovis2.5, InternVL3.5-hf, Qwen3.5)
hold a video processor beside the image processor and the tokenizer, and transformers builds video
processors only with torchvision, which pope-fast does not install (docs/design.md, "The image half
of a processor"). Where that is all that stops AutoProcessor, the checkpoint's own processor class
is built from its image processor, tokenizer, chat template and processor_config.json fields with no
video processor: a prompt about an image runs the class's own code, as it does with torchvision
installed."""
from __future__ import annotations

import inspect
import json
from functools import lru_cache
from pathlib import Path

# the files AutoProcessor reads processor_class from, in its order
CLASS_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")


class ProcessorError(Exception):
    """The checkpoint's processor does not load: AutoProcessor's error, and its
    image half's where it was tried."""

    def __init__(self, whole: BaseException, half: BaseException | None = None):
        super().__init__(whole, half)
        self.whole, self.half = whole, half


def load_processor(folder: Path):
    """AutoProcessor's processor of the checkpoint, else (it needs torchvision) its image half;
    ProcessorError where neither loads."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(str(folder))
    # AutoVideoProcessor says torchvision is missing in a ValueError
    except (ImportError, OSError, ValueError) as why:
        if "torchvision" not in str(why).lower():
            raise ProcessorError(why) from None
        whole = why
    try:
        return image_half(folder)
    except (ImportError, OSError, ValueError, TypeError, AttributeError) as why:
        raise ProcessorError(whole, why) from None


def image_half(folder: Path):
    """The checkpoint's processor class with its image processor, tokenizer, chat template and
    processor_config.json fields, and no video processor."""
    from transformers import AutoImageProcessor, AutoTokenizer

    cls = processor_class(folder)
    videos = [name for name in cls.get_attributes() if "video" in name]
    if not videos:
        raise ImportError(f"{cls.__name__} does not load without torchvision (it holds no video "
                          "processor to leave out)")
    fields, _ = cls.get_processor_dict(str(folder))
    takes = set(inspect.signature(cls.__init__).parameters) - set(cls.get_attributes())
    fields = {k: v for k, v in fields.items() if k in takes}
    parts = dict.fromkeys(videos)
    for name in cls.get_attributes():
        if name in videos:
            continue
        loader = (AutoTokenizer if "tokenizer" in name
                  else AutoImageProcessor if "image" in name else None)
        if loader is None:  # an audio or other sub-processor: not an image model's processor
            raise ImportError(f"{cls.__name__}'s {name} is not loaded without its video processor")
        parts[name] = loader.from_pretrained(str(folder))
    return without_video(cls)(**parts, **fields)


def processor_class(folder: Path):
    """The processor class AutoProcessor picks: the processor_class its files
    name, else its model_type's."""
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import (PROCESSOR_MAPPING,
                                                          processor_class_from_name)

    for name in CLASS_FILES:
        try:
            named = json.loads((folder / name).read_text(encoding="utf-8")).get("processor_class")
        except (OSError, ValueError, AttributeError):
            continue
        if named:
            found = processor_class_from_name(named)
            if found is None:
                raise ValueError(f"{name}'s processor_class {named!r} is not a transformers class")
            return found
    config = AutoConfig.from_pretrained(str(folder))
    if type(config) not in PROCESSOR_MAPPING:
        raise ValueError("transformers has no processor class for model_type "
                         f"{config.model_type!r}")
    return PROCESSOR_MAPPING[type(config)]


@lru_cache(maxsize=None)
def without_video(cls):
    """cls, taking None for its video processor: transformers checks each sub-processor's class, and
    without torchvision even finding the video processors' base class fails."""

    class ImageHalf(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument is None and "video" in argument_name:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImageHalf.__name__ = ImageHalf.__qualname__ = cls.__name__
    return ImageHalf
