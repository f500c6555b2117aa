"""The documentation's code runs as written."""

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
