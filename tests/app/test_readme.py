"""The README's Python API runs as pasted: every python block of its "Python API" section, in order, in one
namespace, on the built-in demo (written under a temporary cache folder), from a temporary directory."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _api_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Python API"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_python_api_section_runs_as_pasted(tmp_path, monkeypatch):
    blocks = _api_blocks()
    assert len(blocks) >= 5  # the engine, a sweep, a method, an intervention, a method of one's own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    # what the blocks promise in their comments
    assert set(namespace["answers"][0].predictions) >= {"legacy_2tok", "template_aware"}
    assert [r.out_dir.name for r in namespace["results"]] == ["none", "prior"]
    for run in ("api-demo", "api-blind", "api-prior/none", "api-prior/prior"):
        assert (tmp_path / "runs" / run / "records.jsonl").is_file(), run
    import json

    meta = json.loads((tmp_path / "runs/api-blind/meta.json").read_text())
    assert meta["method"]["name"] == "intervention" and meta["method"]["reference"].endswith("BlindHeads")
