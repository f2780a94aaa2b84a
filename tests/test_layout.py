"""The floor plan, checked on the source itself (../shared/STYLE.md): imports flow one way, with no
circle (imports inside functions included) and no private name reached across modules; a family is
named only in its own room, and no module or function grows past what a reader can hold."""
import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("readout", "engine", "kernels", "bench", "pope_fast")
SOURCES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _registered_families() -> tuple[str, ...]:
    """The model_types of engine/models/__init__.py's FAMILIES, read from its source (a new family
    is one line there, and nothing here)."""
    for node in ast.parse((ROOT / "engine/models/__init__.py").read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "FAMILIES":
            return tuple(key.value for key in node.value.keys)
    raise AssertionError("engine/models/__init__.py has no FAMILIES registry")


FAMILIES = _registered_families()
# Strings equal to a family's model_type outside the family's rooms: template names (whose names
# records carry), the adapter names of ugaa-research's published files, and the protocols' rooms,
# where `llava` is also LLaVA's own evaluation scripts and each tool's coverage of the families is
# keyed by their model_type (how a tool runs a family is the tool's fact, held beside its prompts
# and sources).
NAMED_ELSEWHERE = {ROOT / "readout/templates.py", ROOT / "readout/benchmarks/pope/ugaa.py",
                   *(ROOT / "readout/protocols").glob("*.py")}


@functools.cache  # one tree a file: the checks below tell its nodes apart by identity
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


# The engine's own strata (docs/design.md, "Data flow"): its runtime at engine/'s root, then these
# folders. Seen from outside the engine they are all "engine"; inside it each is a layer of the
# drawing.
ENGINE_STRATA = ("synthetic", "models", "layers", "inputs", "utils")
# readout's strata the same way: its core at readout/'s root (questions, readouts, token sets,
# records, scores), then these folders above it. Its face, readout/__init__.py (the names most
# callers need), stands above them all: it is what the rest of the code sees as readout, it imports
# every stratum, and no module inside readout imports it.
READOUT_STRATA = ("formats", "protocols", "benchmarks", "report")
READOUT_FACE = ROOT / "readout/__init__.py"
# what a module inside readout that imported the face would import
FACE = "readout/__init__ (its face)"
STRATA = {"engine": ENGINE_STRATA, "readout": READOUT_STRATA}


def _layer(path: Path) -> str:
    """readout (its core at readout/'s root, and its face) and readout/<stratum>, kernels, engine
    (the runtime at engine/'s root) and engine/<stratum>, bench; pope_fast's command line (cli,
    __main__) is "cli", the rest of it (the sweep, torchrun, the eval job) "app"."""
    parts = path.relative_to(ROOT).parts
    if parts[0] in ("engine", "readout") and len(parts) > 2 and parts[1] in STRATA[parts[0]]:
        return f"{parts[0]}/{parts[1]}"
    if parts[0] != "pope_fast":
        return parts[0]
    return "cli" if parts[-1] in ("cli.py", "__main__.py") else "app"


def _module(path: Path) -> str:
    """pope_fast.<...> of a source file (a package's __init__.py is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "pope_fast" else ["pope_fast", *parts])


MODULES = {_module(p): p for p in SOURCES}


def _imported(path: Path):
    """(node, module, names) of each import of ours in a module, inside functions too: `module` the
    dotted module imported from (a `from package import submodule` counts as importing the
    submodule)."""
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            dotted = ".".join(base + (node.module.split(".") if node.module else []))
            if dotted.split(".")[0] != "pope_fast":
                continue
            subs = [f"{dotted}.{a.name}" for a in node.names if f"{dotted}.{a.name}" in MODULES]
            yield node, dotted, [a.name for a in node.names if f"{dotted}.{a.name}" not in subs]
            for sub in subs:
                yield node, sub, []
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pope_fast":
                    yield node, alias.name, []


def _module_layer(dotted: list[str], importer: str) -> str:
    """The layer of pope_fast.<dotted...>, as a module of layer `importer` sees it: the engine's and
    readout's strata from inside them, and readout's face (the package itself) from inside
    readout."""
    inside = importer.split("/")[0]
    if inside in STRATA and dotted[:1] == [inside] and len(dotted) > 1 \
            and dotted[1] in STRATA[inside]:
        return f"{inside}/{dotted[1]}"
    if inside == "readout" and dotted == ["readout"]:
        return FACE
    if dotted and dotted[0] in PACKAGES:
        return dotted[0]
    return "cli" if dotted and dotted[0] in ("cli", "__main__") else "app"


def _imports(path: Path) -> set[str]:
    """The layers of ours a module imports, other than its own (readout's face as the code outside
    sees it)."""
    package = path.relative_to(ROOT).parts[0]
    here = ["pope_fast"] + ([] if package == "pope_fast" else [package])
    here += list(path.relative_to(ROOT / package).parts[:-1])
    found, layer = set(), _layer(path)
    seen_as = "outside" if path == READOUT_FACE else layer
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                dotted = base + (node.module.split(".") if node.module else [])
            else:
                dotted = (node.module or "").split(".")
            if dotted[0] == "pope_fast":  # `from package import module` imports the module
                subs = [[*dotted[1:], a.name] for a in node.names
                        if ".".join([*dotted, a.name]) in MODULES]
                rest = [dotted[1:]] if len(subs) < len(node.names) else []
                targets = [[a.name] for a in node.names] if len(dotted) == 1 else subs + rest
                found.update(_module_layer(t, seen_as) for t in targets)
        elif isinstance(node, ast.Import):
            found.update(_module_layer(a.name.split(".")[1:], seen_as) for a in node.names
                         if a.name.startswith("pope_fast."))
    return found - {layer}


def _drawn() -> dict[str, set[str]]:
    """The data-flow drawing of docs/design.md: each line `layer → others` (or `→ nothing`) of its
    text block."""
    page = (ROOT / "docs/design.md").read_text()
    block = page[page.index("## Data flow"):].split("```text\n", 1)[1].split("```", 1)[0]
    drawn = {}
    for line in block.splitlines():
        layer, _, rest = line.partition("→")
        # two spaces end the list; what follows says what the layer holds
        targets = rest.split("  ")[0].strip()
        drawn[layer.strip()] = (set() if targets == "nothing"
                                else {t.strip() for t in targets.split(",")})
    return drawn


ALLOWED = _drawn()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
    """Each module imports only the layers docs/design.md's drawing gives its layer: readout and
    kernels nothing of ours, the engine both, the application the engine, bench the application, the
    command line the rest."""
    layer = _layer(path)
    extra = _imports(path) - ALLOWED[layer]
    assert not extra, \
        f"{path.relative_to(ROOT)} ({layer}) imports {extra}, which docs/design.md does not draw"


def test_the_drawing_is_the_imports_and_goes_one_way():
    """Every arrow drawn is an import that exists (a drawing of what could be is not the code's),
    every layer is drawn, and no arrow comes back: the layers in an order where each imports only
    layers after it."""
    used: dict[str, set[str]] = {layer: set() for layer in ALLOWED}
    for path in SOURCES:
        used[_layer(path)] |= _imports(path)
    assert used == ALLOWED, f"imports {used} but docs/design.md draws {ALLOWED}"
    left, order = dict(ALLOWED), []
    while left:
        sinks = [layer for layer, targets in left.items() if targets <= set(order)]
        assert sinks, f"the drawing has a circle among {sorted(left)}"
        order += sorted(sinks)
        left = {layer: targets for layer, targets in left.items() if layer not in sinks}
    assert set(_layer(path) for path in SOURCES) == set(ALLOWED)


def test_readout_strata_and_its_face_are_told_apart():
    """The layers the checks above see inside readout: a module in a sub-folder is its stratum's, an
    import of another stratum is that stratum's, and the package itself imported from inside readout
    is its face, which no line of the drawing gives; seen from outside, readout is one layer."""
    assert _layer(ROOT / "readout/benchmarks/pope/ugaa.py") == "readout/benchmarks"
    assert _layer(READOUT_FACE) == _layer(ROOT / "readout/records.py") == "readout"
    assert _module_layer(["readout", "report", "tables"], "readout/benchmarks") == "readout/report"
    assert _module_layer(["readout", "report", "tables"], "app") == "readout"
    assert _module_layer(["readout"], "readout/formats") == FACE \
        and FACE not in set().union(*ALLOWED.values())


def test_the_engine_asks_readouts_core_only():
    """The engine reads readout's core (templates, readouts, token sets, the readout plan, the
    tools' steps), never a tool's room, a benchmark, the report or the face that gathers them: a
    tool's prompt reaches it as a Template object its caller looked up, so adding a tool or a
    benchmark cannot change what the engine imports."""
    core = {_module(p) for p in (ROOT / "readout").glob("*.py") if p.name != "__init__.py"}
    wrong = [f"{path.relative_to(ROOT)}:{node.lineno} {dotted}" for path in SOURCES
             if path.relative_to(ROOT).parts[0] == "engine" for node, dotted, _ in _imported(path)
             if dotted.startswith("pope_fast.readout") and dotted not in core]
    assert not wrong, "the engine imports readout beyond its core: " + ", ".join(wrong)


def test_readout_imports_no_torch():
    for path in (ROOT / "readout").rglob("*.py"):
        names = {a.name.split(".")[0] for n in ast.walk(_tree(path)) if isinstance(n, ast.Import)
                 for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(_tree(path))
                  if isinstance(n, ast.ImportFrom)}
        assert "torch" not in names, path


# The anchors' width (nano-vllm's, gpt-fast's lines: issue 51), the sources' and the tests' alike
WIDTH = 100
TEST_FILES = sorted((ROOT / "tests").rglob("*.py"))


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_test_files_stay_narrow(path):
    long = [i for i, line in enumerate(path.read_text().split("\n"), 1) if len(line) > WIDTH]
    assert not long, f"{path.relative_to(ROOT)}: lines {long} are over {WIDTH} columns"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_and_functions_stay_readable(path):
    """At most 400 lines a module, 60 a function (Triton kernel bodies aside), WIDTH columns a
    line."""
    text = path.read_text()
    assert text.count("\n") <= 400, f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines"
    long = [i for i, line in enumerate(text.split("\n"), 1) if len(line) > WIDTH]
    assert not long, f"{path.relative_to(ROOT)}: lines {long} are over {WIDTH} columns"
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            jitted = any("jit" in ast.unparse(d) for d in node.decorator_list)
            size = node.end_lineno - node.lineno + 1
            assert jitted or size <= 60, \
                f"{path.relative_to(ROOT)}:{node.lineno} {node.name} is {size} lines"


def test_the_cli_is_options_and_one_call():
    assert (ROOT / "pope_fast/cli.py").read_text().count("\n") <= 300


@pytest.mark.parametrize("path", [p for p in SOURCES
                                  if "models" not in p.parts and p not in NAMED_ELSEWHERE],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_family_is_named_outside_its_room(path):
    """Nothing outside engine/models/ names a family (a branch on one, a table of their facts): the
    family declares what the rest of the code asks of it. Its room on the synthetic side,
    engine/synthetic/<model_type>.py (its random checkpoints), may name it, and no other."""
    own = path.stem if path.parent == ROOT / "engine/synthetic" else None
    named = [(n.lineno, n.value) for n in ast.walk(_tree(path))
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in FAMILIES
             and n.value != own]
    assert not named, f"{path.relative_to(ROOT)} names {named}"


def test_every_registered_family_declares_what_the_rest_asks():
    """Each family declares what the engine asks of it, and its synthetic module (found by the
    model_type) the shapes and the writer of its random checkpoints, which the demo, bench and the
    tests ask for."""
    from pope_fast.engine.models import FAMILIES as REGISTRY, family_class
    from pope_fast.engine.synthetic import family_checkpoints

    assert tuple(REGISTRY) == FAMILIES
    for model_type in REGISTRY:
        cls = family_class(model_type)
        assert cls.family == model_type and cls.name and cls.seed_model and cls.default_template
        # the family's, not the base's
        own = {name for klass in cls.__mro__[:-2] for name in vars(klass)}
        assert {"vision_flops", "encode_images", "preprocess", "layout",
                "preprocess_settings"} <= own, model_type
        checkpoints = family_checkpoints(model_type)
        assert set(checkpoints.SIZES) == {"tiny", "7b"}, model_type
        assert callable(checkpoints.write_checkpoint), model_type
    # the transformers backend's random checkpoints
    from pope_fast.engine.synthetic import REFERENCE_ONLY

    for name in REFERENCE_ONLY:
        checkpoints = family_checkpoints(name)
        assert "tiny" in checkpoints.SIZES and callable(checkpoints.write_checkpoint), name
    synthetic = {p.stem for p in (ROOT / "engine/synthetic").glob("*.py")} - {"__init__"}
    assert synthetic == set(FAMILIES) | set(REFERENCE_ONLY), \
        synthetic ^ (set(FAMILIES) | set(REFERENCE_ONLY))


def test_setup_installs_every_module(monkeypatch):
    """A plain (non-editable) install holds every module: each source file's package is one setup.py
    lists."""
    import runpy

    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    installed = set(captured["packages"])
    for path in SOURCES:
        parts = path.relative_to(ROOT).parts[:-1]
        package = ".".join(parts) if parts[0] == "pope_fast" else ".".join(("pope_fast", *parts))
        assert package in installed, \
            f"{path.relative_to(ROOT)}: its package {package} is not installed by setup.py"


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports, at the top or inside a function. Importing
    pope_fast.a.b runs the package pope_fast.a first: an edge to it too, unless it is a package of
    the importer's own (Python has begun that one already); names imported from a package itself
    (`from . import x`) are an edge to it."""
    graph = {}
    for module, path in MODULES.items():
        targets = set()
        for _, dotted, _ in _imported(path):
            parts = dotted.split(".")
            targets |= {".".join(parts[:i]) for i in range(2, len(parts))} & set(MODULES)
            targets -= {t for t in targets if module.startswith(t + ".")}
            if dotted in MODULES:
                targets.add(dotted)
        graph[module] = targets - {module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circles_even_inside_functions():
    """A function-level import is no way round a circle: every module can be imported only after
    what it needs, so the modules read in one order, bottom up."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    graph = _import_graph()
    # the graph sees our imports
    assert "pope_fast.readout.records" in graph["pope_fast.readout.benchmarks.reading"]
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_crosses_modules(path):
    """A name another module needs is public where it is defined: no `from x import _name`, no
    `x._name` of a module of ours (dunders such as __version__ are public)."""
    found = [(node.lineno, name) for node, _, names in _imported(path) for name in names
             if _private(name)]
    modules = {alias.asname or alias.name for node, dotted, names in _imported(path) if not names
               for alias in node.names}
    found += [(node.lineno, f"{node.value.id}.{node.attr}") for node in ast.walk(_tree(path))
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in modules and _private(node.attr)]
    assert not found, f"{path.relative_to(ROOT)} reaches private names of other modules: {found}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_function_level_import_says_why(path):
    """An import of ours inside a function is there for a reason the top of the module cannot serve
    (torch or matplotlib only when a command needs them, a lazy registry): a comment on its line, or
    on the line above, says which. (A circle is no reason:
    test_no_import_circles_even_inside_functions.) A comment above a block of such imports speaks
    for the block."""
    lines = path.read_text().split("\n")
    top = {id(node) for node in _tree(path).body}

    # a comment on the import, or on the imports and comment lines just above it
    def explained(node) -> bool:
        first = node.lineno - 1
        while first > 0 and lines[first - 1].strip().startswith(("from ", "import ", "#")):
            first -= 1
        return "#" in "".join(lines[first:node.end_lineno])

    unexplained = [node.lineno for node, _, _ in _imported(path)
                   if id(node) not in top and not explained(node)]
    assert not unexplained, f"{path.relative_to(ROOT)}: imports inside functions at lines " \
                            f"{sorted(set(unexplained))} say not why"
