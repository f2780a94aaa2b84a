"""What a sweep refuses before any folder is touched or any image read: a question whose image is no
file in its folder, a question whose prompt is past the model's positions. Each names the question,
in one line."""
from __future__ import annotations

from pathlib import Path

from .engine import Engine, ImageError, image_file
from .readout import Question


def check_prompt_lengths(engine: Engine, questions: list[Question]) -> None:
    """Refuse, naming it, a question whose prompt is longer than the model's positions before its
    image is even counted (a megabyte of text would otherwise ask for a terabyte of attention
    scores). A character is at most 4 tokens (its UTF-8 bytes, under a byte-level or byte-fallback
    tokenizer), so only a question of a quarter of the positions' length in characters is
    tokenized."""
    limit = engine.model.lm.dims.max_positions
    for q in questions:
        if 4 * len(q.text) < limit:
            continue
        encoded = engine.model.tokenizer(engine.prompt(q.text), add_special_tokens=False)
        tokens = len(encoded["input_ids"])
        if tokens > limit:
            raise ValueError(f"question {q.question_id} of split {q.split}: its prompt is "
                             f"{tokens:,} tokens, past the model's {limit:,} positions "
                             "(max_position_embeddings); shorten it or leave it out")


def check_image_names(questions: list[Question], images_dir: str | Path | None) -> None:
    """Where questions meet their image folder (eval's setup, before the model loads, and every
    sweep): each image a question names is a file inside the folder (engine.image_file), or the run
    stops in one line naming the question, before any file is read or a record written. Images
    embedded in the question file are not files."""
    if images_dir is None:
        return
    # image name -> the first question asking it: each name resolved once (POPE: 500 for 9,000)
    first = {}
    for q in questions:
        if q.image and q.image_data is None:
            first.setdefault(q.image, q)
    for name, q in first.items():
        try:
            image_file(images_dir, name)
        except ImageError as err:
            raise ImageError(f"question {q.question_id} of split {q.split}: {err}") from None
