"""Benchmarks and the built-in synthetic models and data they (and the demo) run on."""
from .synthetic import (builtin_questions, write_images, write_instructblip_checkpoint, write_llava_checkpoint,
                        write_llava_next_checkpoint, write_qwen2_vl_checkpoint, write_question_file)
from .throughput import SEED_FAMILIES, BenchConfig, format_report, run_bench

__all__ = ["builtin_questions", "write_images", "write_instructblip_checkpoint", "write_llava_checkpoint",
           "write_llava_next_checkpoint", "write_qwen2_vl_checkpoint", "write_question_file", "SEED_FAMILIES",
           "BenchConfig", "format_report", "run_bench"]
