"""The built-in demo: a random tiny checkpoint of the demo family, POPE-shaped questions and
synthetic images, so the main job runs on a fresh machine with nothing downloaded. The numbers mean
nothing; the pipeline is the real one."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .readout import Question


def demo_inputs(out_dir: Path, questions: list[Question], images_dir: Path | None, n_questions: int,
                split: str | None, notice: Callable[[str], None] = lambda _: None
                ) -> tuple[Path, list[Question], Path | None]:
    """(checkpoint, questions, image folder) of a run without --model: the checkpoint written under
    out_dir/demo once (`notice` hears of it), the given questions or the built-in ones, and for
    questions that name image files without an image folder, synthetic stand-ins named after
    them."""
    import torch

    # torch: the demo's writers need it, importing builtin not
    from .engine.models import DEMO, family_class
    from .engine.synthetic import builtin_questions, write_checkpoint, write_images

    demo, family = Path(out_dir) / "demo", family_class(DEMO)
    model_dir = demo / f"{DEMO}-tiny"
    if not (model_dir / "config.json").is_file():
        notice(f"demo: writing a random tiny {family.name} checkpoint to {model_dir}")
        write_checkpoint(DEMO, model_dir, "tiny", dtype=torch.float32)
    questions = questions or builtin_questions(n_questions, split or "demo")
    named = [q.image for q in questions if q.image_data is None]
    if images_dir is None and named:
        images_dir = write_images(demo / "images", named)
    return model_dir, questions, images_dir


@dataclass(frozen=True)
class Demo:
    """The built-in demo's inputs on disk: a random tiny checkpoint, synthetic images and
    POPE-shaped questions about them (the questions' `image` names the files in images_dir)."""

    checkpoint: Path
    images_dir: Path
    questions: list[Question]

    @property
    def images(self) -> list[Path]:
        return [self.images_dir / name for name in dict.fromkeys(q.image for q in self.questions)]


def demo(folder: str | Path | None = None, questions: int = 60) -> Demo:
    """The demo's checkpoint, images and questions, written once under `folder` (default:
    $XDG_CACHE_HOME/pope-fast, else ~/.cache/pope-fast) and reused after, for trying the Python
    API."""
    root = Path(folder) if folder is not None else \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pope-fast"
    checkpoint, asked, images_dir = demo_inputs(root, [], None, questions, None)
    return Demo(checkpoint, images_dir, asked)
