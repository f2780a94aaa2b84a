"""The README and its docs/ pages hold only commands that run: every python block of docs/api.md
runs as pasted, every `pope-fast` command the pages show names a real command and real options, and
each transcript that needs no real checkpoint (`$ pope-fast ...` followed by its output) prints what
the page shows."""
import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pope_fast.cli import main

pytestmark = pytest.mark.slow  # the pages' commands run on the demo

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
API = ROOT / "docs/api.md"
# Transcripts of commands that read a real checkpoint's throughput are measurements, not checks.
MEASURED = ("bench",)


def _blocks(page: Path, language: str) -> list[str]:
    """The fenced blocks of a page opened with ```language (plain ``` for language "")."""
    blocks, block, opened = [], None, None
    for line in page.read_text().splitlines(keepends=True):
        if block is None and line.startswith("```"):
            block, opened = [], line[3:].strip()
        elif block is not None and line.rstrip() == "```":
            if opened == language:
                blocks.append("".join(block))
            block = None
        elif block is not None:
            block.append(line)
    return blocks


def test_the_pages_are_all_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert len(PAGES) >= 7
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, page.name
    assert "(CONTRIBUTING.md)" in readme
    assert len(readme.splitlines()) <= 300
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), (page.name, target)


def test_the_python_api_page_runs_as_pasted(tmp_path, monkeypatch):
    blocks = _blocks(API, "python")
    assert len(blocks) >= 5  # the engine, a sweep, a method, an intervention, a method of one's own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(API), "exec"), namespace)
    # what the blocks promise in their comments
    assert set(namespace["answers"][0].predictions) >= {"legacy_2tok", "template_aware"}
    assert [r.out_dir.name for r in namespace["results"]] == ["none", "prior"]
    first = namespace["pope"][0]
    assert (first.split, first.dataset, first.label) == ("random", "coco", "yes")
    for run in ("api-demo", "api-blind", "api-prior/none", "api-prior/prior"):
        assert (tmp_path / "runs" / run / "records.jsonl").is_file(), run
    import json

    meta = json.loads((tmp_path / "runs/api-blind/meta.json").read_text())
    assert (meta["method"]["name"] == "intervention"
            and meta["method"]["reference"].endswith("BlindHeads"))



def _commands(block: str) -> list[list[str]]:
    """Each `pope-fast ...` (or `-m pope_fast ...`) command of a shell block, as its words from the
    subcommand on: continuation lines joined, comments dropped, `;` and `&&` separating commands."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        code = "" if line.startswith("#") else line.split(" #")[0]
        for command in re.split(r";|&&", code):
            words = command.split()
            for i, word in enumerate(words):
                if word == "pope-fast" or (word == "pope_fast" and words[i - 1] == "-m"):
                    found.append(words[i + 1:])
                    break
    return found


def _shown_commands() -> list[tuple[str, list[str]]]:
    shown = []
    for page in PAGES:
        blocks = _blocks(page, "bash") + [b.split("\n")[0] for b in _blocks(page, "")
                                          if b.startswith("$ pope-fast")]
        # inline, in the prose and tables
        blocks += re.findall(r"`(pope-fast [^`]+)`", page.read_text())
        shown += [(page.name, words) for block in blocks
                  for words in _commands(block.removeprefix("$ "))]
    return shown


def test_every_command_shown_names_a_real_command_and_options():
    shown = _shown_commands()
    assert len(shown) >= 40
    for page, words in shown:
        if not words or words[0].startswith("-"):  # `pope-fast --help`
            continue
        command = main.commands.get(words[0])
        assert command is not None, (page, words)
        options = {name: p for p in command.params if isinstance(p, click.Option)
                   for name in p.opts + p.secondary_opts}
        options["--help"] = options["-h"] = None
        for i, word in enumerate(words[1:], 1):
            name = word.strip("[]").split("=")[0]
            if not name.startswith("--"):
                continue
            assert name in options, (page, " ".join(words), name)
            option = options[name]
            if option is not None and isinstance(option.type, click.Choice) and i + 1 < len(words):
                for value in words[i + 1].strip("[]").split("|"):
                    if value not in ("...", "NAME") and not value.isupper():
                        assert value in option.type.choices, (page, " ".join(words), name, value)


def _transcripts() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        for block in _blocks(page, ""):
            if block.startswith("$ pope-fast ") and block.split()[2] not in MEASURED:
                command, printed = block.split("\n", 1)
                found.append((page.name, command[len("$ pope-fast "):], printed))
    return found


def _same_output(shown: str, printed: str) -> None:
    """Line by line, but for what a run measures or where it runs: the phases' seconds and the
    library versions; a shown line "  ..." stands for the lines the page leaves out."""
    def masked(line: str) -> str:
        line = re.sub(r"(phases \(s\): \{.*)", lambda m: re.sub(r"\d+\.\d+", "S", m.group(1)), line)
        return re.sub(r"(\d+ tokens); [^)]*\)", r"\1; VERSIONS)", line)

    shown_lines, printed_lines = shown.rstrip("\n").splitlines(), printed.rstrip("\n").splitlines()
    if shown_lines[-1] == "  ...":
        shown_lines, printed_lines = shown_lines[:-1], printed_lines[:len(shown_lines) - 1]
    assert [masked(line) for line in printed_lines] == [masked(line) for line in shown_lines]


@pytest.mark.parametrize("page,command,printed", _transcripts(),
                         ids=[f"{page}-{command.split()[0]}"
                              for page, command, _ in _transcripts()])
def test_each_transcript_prints_what_its_page_shows(page, command, printed, request, tmp_path,
                                                    monkeypatch):
    """The demo runs in a fresh folder; a path into ../shared is this workplace's ../shared (or a
    skip)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    if "../shared/" in command:
        shared = request.getfixturevalue("shared")
        command, printed = (text.replace("../shared/", f"{shared}/") for text in (command, printed))
    result = CliRunner().invoke(main, shlex.split(command))
    assert result.exit_code == 0, result.output
    _same_output(printed, result.stdout)


def test_the_transcripts_are_found():
    commands = [command.split()[0] for _, command, _ in _transcripts()]
    assert (commands.count("eval") == 1 and commands.count("score") == 1
            and commands.count("audit-tokens") == 1)
