"""The engine: checkpoint loading, the vision-feature cache, prefix reuse and the one-step prefill.

    from pope_fast.engine import Engine, Settings
    engine = Engine.load("llava-1.5-7b-hf", Settings(device="cuda", quant="nf4"))
    answers = engine.score("cat.jpg", ["Is there a cat in the image?"])
"""
from .core import Answer, Engine
from .distributed import RankError, Shard
from .families import FAMILIES, Family, load_model
from .images import ImageError, LoadedImage, check_images, read_image
from .interventions import ImageAttentionAmplification, ImageAttentionTemperature
from .llama import Intervention
from .plan import PromptLayout, PromptResult
from .loader import CheckpointError
from .pope import SweepResult, run_pope, write_summaries
from .settings import Settings
from .stats import Counts, Timings
from .vision_cache import VisionCache

__all__ = ["Answer", "Engine", "RankError", "Shard", "FAMILIES", "Family", "load_model", "ImageError", "LoadedImage", "check_images",
           "read_image", "Intervention", "ImageAttentionAmplification", "ImageAttentionTemperature", "CheckpointError", "PromptLayout", "PromptResult", "SweepResult", "run_pope",
           "write_summaries", "Settings", "Counts", "Timings", "VisionCache"]
