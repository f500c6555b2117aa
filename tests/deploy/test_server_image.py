"""docs/kubernetes.md's RUN line that installs the package into the server's image: it
installs what the package needs at run time, never torch or Triton (the server's stay),
the package itself at this version, and hadolint passes it."""

import re
import shlex
import subprocess

import pytest

from tests.deploy.test_constraints import canonical, requirement_name
from tests.deploy.test_dockerfile import ROOT, hadolint, instructions
from tests.docs.blocks import blocks

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PAGE = ROOT / "docs" / "kubernetes.md"
# What the server's image brings: its torch and Triton, and numpy, which Triton imports.
FROM_THE_SERVER = {"torch", "triton", "numpy"}


def dockerfile() -> str:
    (block,) = [b for b in blocks(PAGE) if b.lang == "dockerfile"]
    return block.text


def pip_installs(text: str) -> list[list[str]]:
    """The arguments after ``pip install`` of every pip command the RUN lines run."""
    found = []
    for keyword, args in instructions(text):
        for command in args.split("&&") if keyword == "RUN" else []:
            words = shlex.split(command)
            if "pip" in words and words[words.index("pip") + 1] == "install":
                found.append(words[words.index("pip") + 2 :])
    return found


def requirements(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("-")]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_dependencies_installed_are_the_runtimes_but_torch_and_triton():
    deps, _ = pip_installs(dockerfile())
    sidecar = (ROOT / "deploy" / "requirements-sidecar.txt").read_text().splitlines()
    wanted = {line.strip() for line in sidecar if line.strip() and not line.startswith("#")}
    assert "--no-deps" not in deps and set(requirements(deps)) == wanted
    names = {requirement_name(spec) for spec in requirements(deps)}
    declared = {requirement_name(spec) for spec in project()["dependencies"]}
    assert declared - FROM_THE_SERVER <= names, "a runtime dependency the line leaves out"
    assert not names & FROM_THE_SERVER, "the server's torch and Triton must stay as they are"


def test_the_package_goes_in_without_its_dependencies_at_this_version():
    _, package = pip_installs(dockerfile())
    assert "--no-deps" in package
    (spec,) = requirements(package)
    name, _, version = spec.partition("==")
    assert canonical(name) == canonical(project()["name"]) and version == project()["version"]
    assert re.search(r"&& triton-warmup doctor --only compiler$", dockerfile(), re.M)


def test_hadolint_passes_the_line_and_would_catch_an_unpinned_package(tmp_path):
    text = dockerfile()
    for name, body in (("shown", text), ("unpinned", re.sub(r"==\d[\w.]*", "", text))):
        (tmp_path / name).write_text(body)
        done = subprocess.run(
            [hadolint(), "--failure-threshold", "info", name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert (done.returncode == 0) == (name == "shown"), done.stdout + done.stderr
