"""The README is short, its links resolve and reach every page; the registry example of
the docs runs as written. (tests/docs runs or checks every other block.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def python_block(page: str) -> str:
    """The first ```python block of ``page`` (a file of the repository)."""
    body = (ROOT / page).read_text()
    match = re.search(r"```python\n(.*?)```", body, re.S)
    assert match, f"no python block in {page}"
    return match.group(1)


def test_the_registry_example_runs_as_written_and_hits_the_second_time(tmp_path):
    code = python_block("docs/registry.md") + "\nprint(json.dumps([entry.source, config.meta]))"
    for _ in range(2):  # the first run stores, the second finds it
        done = subprocess.run(
            [sys.executable, "-c", "import json\n" + code],
            cwd=tmp_path,
            env={"PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        source, meta = json.loads(done.stdout.strip().splitlines()[-1])
        assert source == "tuned" and meta["BLOCK_M"] == 128
    stored = list((tmp_path / "demo-volume" / "registry").rglob("K16384_M4096_N6656*.json"))
    assert len(stored) == 1 and '"world": 2' in stored[0].read_text()


def test_the_readme_stays_short_and_says_how_to_start():
    body = (ROOT / "README.md").read_text()
    assert len(body.splitlines()) <= 150
    for command in ("make demo", "make test", "make docs"):
        assert command in body


def test_every_link_of_the_readme_resolves_and_every_page_is_linked():
    body = (ROOT / "README.md").read_text()
    targets = {
        link.split("#")[0]
        for link in re.findall(r"\]\(([^)\s]+)\)", body)
        if "://" not in link and not link.startswith("#")
    }
    missing = sorted(t for t in targets if not (ROOT / t).exists())
    assert not missing, f"README links to files that are not there: {missing}"
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} - {"docs/index.md"}
    assert not pages - targets, f"README links to no {sorted(pages - targets)}"


FIRST_SCREEN = 45  # lines a reader sees before scrolling


def test_the_first_screen_says_what_for_whom_how_much_faster_and_how_it_sits_in_a_pod():
    screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN])
    for who in ("vLLM", "SGLang", "PyTorch servers", "Kubernetes"):
        assert who in screen
    picture = re.search(r"```text\n(.*?)```", screen, re.S)
    assert picture, "no picture of the pod on the first screen"
    for part in ("init container", "native sidecar", "/readyz", "/metrics", "bundle", "Redis"):
        assert part in picture.group(1)
    assert "engine.name: vllm | sglang | torch" in screen and "docs/kubernetes.md" in screen
    assert "make demo" in screen and "make test" in screen
    # it does not lead with this project's own kernel
    lead = screen.split("**What a pod gains**")[0]
    assert "AllGather" not in lead and "ag_gemm" not in lead


def test_every_figure_of_the_first_screen_is_in_the_page_it_cites():
    screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN])
    gains = screen.split("**What a pod gains**")[1].split("```")[0]
    cited = [ROOT / link for link in re.findall(r"\]\((docs/[^)#]+)\)", gains)]
    assert cited, "the figures cite no page"
    pages = "\n".join(page.read_text() for page in cited)
    figures = re.findall(r"(\d+\.\d+) s\b", gains)
    assert len(figures) >= 5
    missing = [figure for figure in figures if figure not in pages]
    assert not missing, f"figures that the cited pages do not show: {missing}"
