"""The engine: checkpoint loading, the vision-feature cache, prefix reuse and the one-step prefill.

    from pope_fast.engine import Engine, Settings
    engine = Engine.load("llava-1.5-7b-hf", Settings(device="cuda", quant="nf4"))
    answers = engine.answer("cat.jpg", ["Is there a cat in the image?"])

The sweep over question files and its run folders, and torchrun, are the application's:
`pope_fast.sweep` (run_plain, run_paired, SweepResult, write_summaries) and `pope_fast.distributed`
(Shard, RankError).
"""
from .backend import BACKENDS, load_engine
from .core import Answer, Engine, Prepared
from .inputs.images import ImageError, LoadedImage, check_images, image_file, read_image
from .layers.interventions import (AttentionEdit, ImageAttentionAmplification,
                                   ImageAttentionTemperature, ImageTokenDrop, Intervention,
                                   PAIAttention, VisualAmplification)
from .utils.loader import CheckpointError
from .methods import METHODS, Method, parse_method
from .models import FAMILIES, Family, TextOnlyRefused, load_model
from .inputs.plan import PromptLayout, PromptResult
from .runner import ImagePrompts
from .utils.settings import Settings
from .utils.stats import Counts, Timings
from .inputs.vision_cache import VisionCache

__all__ = ["Answer", "Engine", "load_engine", "BACKENDS", "Prepared", "ImagePrompts", "FAMILIES",
           "Family", "load_model", "ImageError", "LoadedImage", "check_images", "image_file",
           "read_image", "AttentionEdit", "Intervention", "ImageTokenDrop",
           "ImageAttentionAmplification", "ImageAttentionTemperature", "PAIAttention",
           "CheckpointError", "PromptLayout", "PromptResult", "METHODS", "Method", "parse_method",
           "Settings", "Counts", "Timings", "VisionCache", "TextOnlyRefused", "VisualAmplification"]
