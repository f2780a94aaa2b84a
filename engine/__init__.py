"""The engine: checkpoint loading, the vision-feature cache, prefix reuse and the one-step prefill.

    from pope_fast.engine import Engine, Settings
    engine = Engine.load("llava-1.5-7b-hf", Settings(device="cuda", quant="nf4"))
    answers = engine.score("cat.jpg", ["Is there a cat in the image?"])
"""
from .core import FAMILIES, Answer, Engine, Timings, load_model
from .images import ImageError, LoadedImage, check_images, read_image
from .llama import Intervention
from .loader import CheckpointError
from .pope import SweepResult, run_pope, write_summaries
from .settings import Settings
from .vision_cache import VisionCache

__all__ = ["FAMILIES", "Answer", "Engine", "Timings", "load_model", "ImageError", "LoadedImage", "check_images",
           "read_image", "Intervention", "CheckpointError", "SweepResult", "run_pope", "write_summaries", "Settings",
           "VisionCache"]
