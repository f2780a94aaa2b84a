"""The floor plan, checked on the source itself (../shared/STYLE.md): imports flow one way, a family is
named only in its own room, and no module or function grows past what a reader can hold."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("readout", "engine", "kernels", "bench", "pope_fast")
SOURCES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _registered_families() -> tuple[str, ...]:
    """The model_types of engine/models/__init__.py's FAMILIES, read from its source (a new family is one line
    there, and nothing here)."""
    for node in ast.parse((ROOT / "engine/models/__init__.py").read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "FAMILIES":
            return tuple(key.value for key in node.value.keys)
    raise AssertionError("engine/models/__init__.py has no FAMILIES registry")


FAMILIES = _registered_families()
# Strings equal to a family's model_type that are not about the family: template names (the template
# registry, whose names records carry), the adapter names of ugaa-research's published files, and the
# protocol registry's names (`llava` is LLaVA's own evaluation scripts).
NAMED_ELSEWHERE = {ROOT / "readout/templates.py", ROOT / "readout/ugaa.py", ROOT / "readout/published.py"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _layer(path: Path) -> str:
    """readout, kernels, engine, bench; pope_fast's command line (cli, __main__) is "cli", the rest of it
    (the sweep, torchrun, the eval job) "app"."""
    parts = path.relative_to(ROOT).parts
    if parts[0] != "pope_fast":
        return parts[0]
    return "cli" if parts[-1] in ("cli.py", "__main__.py") else "app"


def _module_layer(dotted: list[str]) -> str:
    """The layer of pope_fast.<dotted...>."""
    if dotted and dotted[0] in PACKAGES:
        return dotted[0]
    return "cli" if dotted and dotted[0] in ("cli", "__main__") else "app"


def _imports(path: Path) -> set[str]:
    """The layers of ours a module imports, other than its own."""
    package = path.relative_to(ROOT).parts[0]
    here = ["pope_fast"] + ([] if package == "pope_fast" else [package])
    here += list(path.relative_to(ROOT / package).parts[:-1])
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                dotted = base + (node.module.split(".") if node.module else [])
            else:
                dotted = (node.module or "").split(".")
            if dotted[0] == "pope_fast":
                targets = [dotted[1:]] if len(dotted) > 1 else [[a.name] for a in node.names]
                found.update(_module_layer(t) for t in targets)
        elif isinstance(node, ast.Import):
            found.update(_module_layer(a.name.split(".")[1:]) for a in node.names if a.name.startswith("pope_fast."))
    return found - {_layer(path)}


ALLOWED = {"readout": set(), "kernels": set(), "engine": {"readout", "kernels"},
           "app": {"readout", "engine", "kernels"}, "bench": {"readout", "engine", "kernels", "app"},
           "cli": {"readout", "engine", "kernels", "app", "bench"}}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
    """readout and kernels import nothing of ours; the engine both; the application (sweep, torchrun, the
    eval job) the engine; bench the application; the command line everything."""
    layer = _layer(path)
    extra = _imports(path) - ALLOWED[layer]
    assert not extra, f"{path.relative_to(ROOT)} ({layer}) imports {extra}"


def test_readout_imports_no_torch():
    for path in (ROOT / "readout").rglob("*.py"):
        names = {a.name.split(".")[0] for n in ast.walk(_tree(path)) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(_tree(path)) if isinstance(n, ast.ImportFrom)}
        assert "torch" not in names, path


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_and_functions_stay_readable(path):
    """At most 400 lines a module, 60 a function (Triton kernel bodies aside), 120 columns a line."""
    text = path.read_text()
    assert text.count("\n") <= 400, f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines"
    long = [i for i, line in enumerate(text.split("\n"), 1) if len(line) > 120]
    assert not long, f"{path.relative_to(ROOT)}: lines {long} are over 120 columns"
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            jitted = any("jit" in ast.unparse(d) for d in node.decorator_list)
            size = node.end_lineno - node.lineno + 1
            assert jitted or size <= 60, f"{path.relative_to(ROOT)}:{node.lineno} {node.name} is {size} lines"


def test_the_cli_is_options_and_one_call():
    assert (ROOT / "pope_fast/cli.py").read_text().count("\n") <= 300


@pytest.mark.parametrize("path", [p for p in SOURCES if "models" not in p.parts and p not in NAMED_ELSEWHERE],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_family_is_named_outside_its_room(path):
    """Nothing outside engine/models/ names a family (a branch on one, a table of their facts): the
    family declares what the rest of the code asks of it. Its room on the synthetic side,
    engine/synthetic/<model_type>.py (its random checkpoints), may name it, and no other."""
    own = path.stem if path.parent == ROOT / "engine/synthetic" else None
    named = [(n.lineno, n.value) for n in ast.walk(_tree(path))
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in FAMILIES and n.value != own]
    assert not named, f"{path.relative_to(ROOT)} names {named}"


def test_every_registered_family_declares_what_the_rest_asks():
    """Each family declares what the engine asks of it, and its synthetic module (found by the model_type)
    the shapes and the writer of its random checkpoints, which the demo, bench and the tests ask for."""
    from pope_fast.engine.models import FAMILIES as REGISTRY, family_class
    from pope_fast.engine.synthetic import family_checkpoints

    assert tuple(REGISTRY) == FAMILIES
    for model_type in REGISTRY:
        cls = family_class(model_type)
        assert cls.family == model_type and cls.name and cls.seed_model and cls.default_template
        own = {name for klass in cls.__mro__[:-2] for name in vars(klass)}  # the family's, not the base's
        assert {"vision_flops", "encode_images", "preprocess", "layout", "preprocess_settings"} <= own, model_type
        checkpoints = family_checkpoints(model_type)
        assert set(checkpoints.SIZES) == {"tiny", "7b"}, model_type
        assert callable(checkpoints.write_checkpoint), model_type
    synthetic = {p.stem for p in (ROOT / "engine/synthetic").glob("*.py")} - {"__init__"}
    assert synthetic == set(FAMILIES), synthetic ^ set(FAMILIES)


def test_setup_installs_every_module(monkeypatch):
    """A plain (non-editable) install holds every module: each source file's package is one setup.py lists."""
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
        assert package in installed, f"{path.relative_to(ROOT)}: its package {package} is not installed by setup.py"
