"""Images ahead of the model: file reads, decoding and the processor are CPU work that releases the
GIL, so worker threads run them image by image while the model works, a model step of images at a
time."""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

from .engine import Engine, ImageError, read_image
from .engine.core import Prepared
from .engine.inputs.images import embedded_path
from .readout import Question


def embedded_images(questions: list[Question]) -> dict[str, bytes]:
    """Image name → the bytes the questions embed; a name cannot be both embedded and a file."""
    embedded = {q.image: q.image_data for q in questions if q.image_data is not None}
    named = {q.image for q in questions if q.image_data is None} & set(embedded)
    if named:
        raise ValueError(f"image {sorted(named)[0]} is embedded in one question file and a file "
                         "name in another; evaluate the two sources in separate runs")
    return embedded


def prepared_steps(engine: Engine, images_dir: Path | None, steps: list[list[str]], workers: int,
                   embedded: dict[str, bytes]) -> Iterator[list[tuple[str, Prepared | ImageError]]]:
    """Per step, (image name, the image prepared or the ImageError that stopped it) per image, in
    order (None for the empty name: questions asked without an image, nothing to prepare); `workers`
    threads run ahead of the model by at most one step plus one image per worker, so memory stays
    bounded. Whole steps, not a ramp of 1, 2, 4, ... images that would start the model sooner: the
    small first steps cost more than the wait (bench/RESULTS.md)."""
    def prepare(name):
        if not name:
            return None
        data = embedded.get(name)
        path = images_dir / name if data is None else embedded_path(name)
        try:
            return engine.prepare([read_image(path, verify=False, data=data)])[0]
        # missing since the check, passed it but not the decoder, refused by the model
        except ImageError as err:
            return err if str(err).startswith(str(path)) else ImageError(f"{path}: {err}")
        except Exception as err:  # a preprocessing failure is not the file's fault: stop, naming it
            raise ValueError(f"{path}: preprocessing failed ({err!r})") from err

    ahead = max((len(step) for step in steps), default=0) + workers
    pending: deque = deque()
    queue = iter(name for step in steps for name in step)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for step in steps:
            while len(pending) < len(step) + ahead and (name := next(queue, None)) is not None:
                pending.append((name, pool.submit(prepare, name)))
            yield [(name, future.result()) for name, future in (pending.popleft() for _ in step)]


def default_workers() -> int:
    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    return max(1, min(8, cpus))
