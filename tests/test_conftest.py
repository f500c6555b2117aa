"""The test session's own fixtures: a session leaves nothing in the temp folder."""

import os
import secrets

from tests.conftest import ROOT, run_python

INNER = """
import subprocess, sys, tempfile
from pathlib import Path

def test_writes_to_the_temp_folder(tmp_path):
    (tmp_path / "kept-by-pytest-on-failure").write_text("x")
    (Path(tempfile.gettempdir()) / "torchinductor_someone").mkdir()
    code = "import tempfile, pathlib; pathlib.Path(tempfile.mkdtemp(), 'x.so').write_text('x')"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def test_a_session_and_its_subprocesses_leave_nothing_in_the_temp_folder(tmp_path):
    # A temp folder of this test's own and a user name of its own: what a session leaves
    # is found there, or under /tmp by its name, whatever other users leave beside it.
    system_tmp, user = tmp_path / "system-tmp", f"tw-session-{secrets.token_hex(4)}"
    system_tmp.mkdir()
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path),
        "TMPDIR": str(system_tmp),
        "USER": user,
        "LOGNAME": user,
    }
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
    done = run_python(*args, *config, str(tmp_path / "test_inner.py"), env=env, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(system_tmp.iterdir()) == []
    assert [name for name in os.listdir("/tmp") if user in name] == []
