"""The folders of `pope-fast eval`, proven before anything is written: the output apart from the
question files, the output and cache folders created and writable."""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from .store import remove_unused_folder


def checked_folders(out_dir, cache_dir, question_files=()) -> Path:
    """The folders of `pope-fast eval`, proven before anything is written: the output apart from the
    question files, the output and cache folders created and writable (the checkpoint, a folder or a
    hub id, is resolved next: EvalJob.from_options). Returns the output's."""
    out_path = Path(out_dir).expanduser().resolve()
    for given in question_files:
        path = Path(given).expanduser().resolve()
        # a second run would read the first's records
        if path.is_dir() and out_path.is_relative_to(path):
            raise ValueError(f"--out {out_dir} lies inside --questions {given}, whose files are "
                             "all read as questions (this run's records among them, next time); "
                             "give an --out outside it")
        if path.is_relative_to(out_path):
            raise ValueError(f"--questions {given} lies inside --out {out_dir}, the run's own "
                             "folder; keep question files outside it")
    out = _writable(out_dir, "--out")
    if cache_dir is not None:
        _writable(cache_dir, "--cache-dir")
    return out


@contextmanager
def out_folder(out_dir, cache_dir, question_files=()):
    """checked_folders' output folder, for a run: removed again where the run made it and left it
    empty but for its lock (one refused before it wrote anything leaves no folder behind)."""
    made = not Path(out_dir).exists()
    out = checked_folders(out_dir, cache_dir, question_files)
    try:
        yield out
    finally:
        if made:
            remove_unused_folder(out)


def _writable(path, option: str) -> Path:
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise ValueError(f"{option} {path}: not a writable folder "
                         f"({err.strerror or err})") from None
    return folder
