"""What a yes/no benchmark declares, so that the rest of the code asks it instead of naming it.

A benchmark is its question data (read into `Question`s, one per question, `dataset` its name,
`split` the group its metric reports: MME's subtask, AMBER's dimension, HallusionBench's category),
the answer rules of each tool that scores it (the benchmark's own code first), each with that tool's
aggregation, and the result files those tools write (read back as answer texts keyed like its
questions). The engine's records hold every readout; `score --benchmark` turns them into each rule's
numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from ..data import Question


@dataclass(frozen=True)
class Answer:
    """One question as a benchmark's metric sees it: its key (the record's question_id), group,
    image and label (yes/no), and the decision read from the model (yes, no, or unknown)."""
    key: str
    split: str
    image: str | None
    label: str
    decision: str
    # the group a tool's own table files it under, as that table's column holds it (VLMEvalKit's
    # HallusionBench l2-category); None: the benchmark's metric names the group itself
    group: str | None = None


@dataclass(frozen=True)
class Rule:
    """A tool's way to score the benchmark: how it reads an answer text (text -> yes/no/unknown),
    how it aggregates the decisions (answers -> its metrics, named as the tool names them, in its
    unit), the metrics a paper quotes (`headline`), the prompt change it makes to the benchmark's
    question (None: the question as the data has it) and the source files and lines it follows."""
    name: str
    read: Callable[[str], str]
    aggregate: Callable[[list[Answer]], dict]
    headline: tuple[str, ...]
    sources: tuple[str, ...]
    prompt: Callable[[str], str] | None = None
    # Where the headline metrics are functions of per-question counts: them under bootstrap weights
    # (answers, [resamples, n] draws per question) -> {headline: [resamples]}, so that `compare` can
    # resample questions as readout/compare.py does; None: it recomputes `aggregate` on resampled
    # units.
    resampled: Callable | None = None
    # The metrics' key holding the tool's own score-file rows (a list of {column: value}, in its
    # columns and row order: VLMEvalKit's HallusionBench split rows), shown beneath the headline;
    # None: the tool writes none.
    rows: str | None = None
    # The full mark of its metrics where the tool reports them in another unit than the benchmark's
    # official one (lmms-eval's HallusionBench fractions beside the official percents); None: the
    # benchmark's `scale`.
    scale: float | None = None


@dataclass(frozen=True)
class Response:
    """An answer text another tool wrote, keyed like the benchmark's questions (`key`, `split`),
    with the label where the file holds one; `line`: where it was read (file:line), for errors."""
    key: str
    split: str
    text: str
    label: str | None
    image: str | None
    line: str
    group: str | None = None  # Answer.group: the table's own grouping column's value


class Benchmark:
    """A benchmark's room: subclasses set the class attributes and implement the three readers."""

    name: ClassVar[str]
    title: ClassVar[str]
    short_name: ClassVar[str]  # as its authors write it, where a line names it (eval's progress)
    data: ClassVar[str]  # where its data and images are published, and under which licence
    # "official" first, then the tools that have it (lmms-eval, vlmevalkit)
    rules: ClassVar[dict[str, Rule]]
    scale: ClassVar[float]  # the official headline's full mark (MME Perception's 2000, or 100 %)
    unit_name: ClassVar[str] = "question"  # what `unit` resamples, in words

    @classmethod
    def detect(cls, path: Path) -> bool:
        """Whether `path` (a file or folder) is this benchmark's question data or a result file."""
        raise NotImplementedError

    @classmethod
    def questions(cls, path: Path) -> list[Question]:
        """Every question of the benchmark's data at `path`; bad input raises records.DataError
        naming the file and line (or row)."""
        raise NotImplementedError

    @classmethod
    def responses(cls, path: Path, questions: list[Question] | None = None) -> list[Response]:
        """The answer texts of a result file another tool wrote; `questions` supply labels and
        groups where the file lacks them. An id the benchmark lacks, a malformed line, a missing
        column: DataError, one line naming the file and line."""
        raise NotImplementedError

    @classmethod
    def checks(cls, answers: list[Answer]) -> list[str]:
        """What keeps these answers' totals from being the tools' numbers (MME's subtasks missing),
        each a line score prints marked '!'; none by default."""
        return []

    @classmethod
    def unit(cls, answer: Answer) -> str:
        """The bootstrap's resampling unit an answer belongs to (compare): the smallest group that
        holds every group any rule's metric takes together, so that a resample keeps each such group
        whole. Per question by default (metrics that are sums over questions: AMBER's)."""
        return answer.key

    @classmethod
    def copy(cls, answer: Answer, draw: int) -> Answer:
        """The answer as the `draw`-th unit of a resample: a unit drawn twice must count as two
        units, so every id a rule groups by is made distinct."""
        return Answer(f"{answer.key}~{draw}", answer.split, answer.image, answer.label,
                      answer.decision)

