"""The engine: checkpoint loading, the vision-feature cache, prefix reuse and the one-step prefill.

    from pope_fast.engine import Engine, Settings
    engine = Engine.load("llava-1.5-7b-hf", Settings(device="cuda", quant="nf4"))
    answers = engine.score("cat.jpg", ["Is there a cat in the image?"])
"""
from .core import Answer, Engine
from .distributed import RankError, Shard
from .models import FAMILIES, Family, load_model
from .images import ImageError, LoadedImage, check_images, read_image
from .interventions import (AttentionEdit, ImageAttentionAmplification, ImageAttentionTemperature, Intervention,
                            PAIAttention)
from .plan import PromptLayout, PromptResult
from .loader import CheckpointError
from .methods import METHODS, Method, parse_method
from .pope import SweepResult, run_paired, run_pope, write_summaries
from .settings import Settings
from .stats import Counts, Timings
from .vision_cache import VisionCache

__all__ = ["Answer", "Engine", "FAMILIES", "Family", "load_model", "ImageError", "LoadedImage", "check_images",
           "read_image", "AttentionEdit", "Intervention", "ImageAttentionAmplification", "ImageAttentionTemperature",
           "PAIAttention", "CheckpointError", "PromptLayout", "PromptResult", "SweepResult", "run_pope",
           "write_summaries", "METHODS", "Method", "parse_method", "run_paired", "RankError", "Shard", "Settings", "Counts", "Timings",
           "VisionCache"]
