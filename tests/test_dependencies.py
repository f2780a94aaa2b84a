"""The dependency policy (CONTRIBUTING.md, "Dependencies"): constraints.txt, the last green resolve,
pins every package pope-fast and its tests ask for, inside setup.py's tested bounds, and leaves
torch and triton to the machine's torch build; the README's two commands and CI install with it."""
import ast
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LEFT_TO_TORCH = {"torch", "triton"}


def _requirements() -> list[Requirement]:
    """install_requires and every extra of setup.py, read from its source (importing it would run
    setup())."""
    found = []
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.keyword) and node.arg in ("install_requires", "extras_require"):
            value = ast.literal_eval(node.value)
            found += [Requirement(text) for text in
                      (value if isinstance(value, list) else sum(value.values(), []))]
    return found


def _pins() -> dict[str, str]:
    pins = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt:{number}: {line!r} is no NAME==VERSION pin"
            pins[canonicalize_name(name)] = version
    return pins


def test_every_requirement_is_pinned_inside_its_bounds():
    pins, requirements = _pins(), _requirements()
    assert {canonicalize_name(r.name) for r in requirements} >= {"transformers", "tokenizers",
                                                                 "bitsandbytes", "triton",
                                                                 "pytest", "ruff"}
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name in LEFT_TO_TORCH:
            assert name not in pins, \
                f"constraints.txt pins {name}, which the machine's torch build decides"
            continue
        assert name in pins, f"constraints.txt does not pin {requirement.name}"
        assert requirement.specifier.contains(pins[name]), \
            f"{name}=={pins[name]} is outside setup.py's {requirement}"


def test_the_mirrored_packages_are_bounded_at_both_ends():
    for requirement in _requirements():
        if canonicalize_name(requirement.name) in ("transformers", "tokenizers", "bitsandbytes",
                                                   "triton"):
            operators = {spec.operator for spec in requirement.specifier}
            assert operators == {">=", "<"}, \
                f"setup.py: {requirement} needs a tested lower and upper bound"


def test_the_readme_and_ci_install_the_pinned_resolve():
    readme = ((ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
              .splitlines())
    assert len(readme) == 2 and all("pip install torch==2.13.0 && pip install -e " in line
                                    for line in readme)
    assert all("-c constraints.txt" in line for line in readme)
    ci = (ROOT / ".ci/run").read_text()
    assert 'pip install --quiet -e ".[test]" -c constraints.txt' in ci and "pip list" in ci


@pytest.mark.xdist_group("dependencies")
def test_xdist_keeps_a_group_on_one_worker(request):
    """setup.cfg's `--dist loadgroup` sends a group's tests to one worker only if xdist could write
    the group into the test's id (pytest 9.2 stopped reading what xdist 3.8 writes there, and each
    worker built every family's checkpoints and oracles again, unnoticed): under xdist, a grouped
    test's id carries its group."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@dependencies"), request.node.nodeid
