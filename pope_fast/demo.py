"""The built-in demo: a random tiny checkpoint of the demo family, POPE-shaped questions and synthetic
images, so the main job runs on a fresh machine with nothing downloaded. The numbers mean nothing; the
pipeline is the real one."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .readout import Question


def demo_inputs(out_dir: Path, questions: list[Question], images_dir: Path | None, n_questions: int,
                split: str | None, notice: Callable[[str], None] = lambda _: None
                ) -> tuple[Path, list[Question], Path | None]:
    """(checkpoint, questions, image folder) of a run without --model: the checkpoint written under
    out_dir/demo once (`notice` hears of it), the given questions or the built-in ones, and for
    questions that name image files without an image folder, synthetic stand-ins named after them."""
    import torch

    from .engine.models import DEMO, family_class
    from .engine.synthetic import builtin_questions, write_images

    demo, family = Path(out_dir) / "demo", family_class(DEMO)
    model_dir = demo / f"{DEMO}-tiny"
    if not (model_dir / "config.json").is_file():
        notice(f"demo: writing a random tiny {family.name} checkpoint to {model_dir}")
        family.write_checkpoint(model_dir, "tiny", dtype=torch.float32)
    questions = questions or builtin_questions(n_questions, split or "demo")
    named = [q.image for q in questions if q.image_data is None]
    if images_dir is None and named:
        images_dir = write_images(demo / "images", named)
    return model_dir, questions, images_dir
