"""Every failure of a command as one line: what it says of an error the command expects, of an
OSError (naming its file, and after a full disk what to do), and under torchrun of any error at all
(named with its type and its rank, and left where torchrun's summary shows it, so torchrun stops the
other ranks)."""
from __future__ import annotations

import errno
from contextlib import contextmanager

import click

from .readout import Unavailable

# DataError, CheckpointError, ImageError, FolderBusy and RankError are ValueErrors; Unavailable is a
# readout a record set cannot supply; NotImplementedError a model feature the engine lacks.
EXPECTED = (ValueError, Unavailable, NotImplementedError)


def os_message(err: OSError) -> str:
    """One line naming the file an OSError is about, and what to do after a full disk."""
    where = f"{err.filename}: " if err.filename else ""
    hint = ("; free some space and run the same command again: it resumes from the records "
            "written so far"
            if err.errno in (errno.ENOSPC, errno.EDQUOT) else "")
    return f"{where}{err.strerror or err}{hint}"


def one_line(err: Exception, shard=None,
             expected: tuple[type[Exception], ...] = EXPECTED) -> str | None:
    """The line a command ends with for `err`, or None for an unexpected error outside torchrun (a
    bug: its traceback is what helps)."""
    if isinstance(err, expected):
        message = str(err)
    elif isinstance(err, OSError):
        message = os_message(err)
    elif shard is not None:
        message = f"{type(err).__name__}: {err}"
    else:
        return None
    # one line whatever it quotes: a file or image name holding a line break is shown escaped, as
    # repr shows it
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    if shard is None:
        return message
    if not message.startswith("rank "):
        message = f"{shard.name}: {message}"
    shard.record_failure(message)
    return message


@contextmanager
def failures(shard=None, expected: tuple[type[Exception], ...] = EXPECTED):
    """A command's errors as click's one-line error (one_line); an unexpected one outside torchrun
    as it is."""
    try:
        yield
    except click.ClickException:
        raise
    except Exception as err:
        message = one_line(err, shard, expected)
        if message is None:
            raise
        raise click.ClickException(message) from None
