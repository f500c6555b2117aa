"""The site builds as `make docs` builds it: strict, so a broken link or anchor, or a page
left out of the nav, fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRITON_WARMUP_VOLUME" in (site / "settings" / "index.html").read_text()
    assert "triton-warmup registry bundle install" in (site / "cli" / "index.html").read_text()
    assert "triton_warmup_ready" in (site / "metrics" / "index.html").read_text()
    assert not (site / "hooks").exists()
