"""constraints.txt pins the whole dependency set: every install the project runs (make,
deploy/install.sh, so the Dockerfile) goes through it, and no dependency is left out."""

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = PIN.match(line)
            assert match, f"not an exact pin: {line!r}"
            found[canonical(match.group(1))] = match.group(2)
    return found


def requirement_name(spec: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec.strip())
    assert match, spec
    return canonical(match.group())


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    sidecar = (ROOT / "deploy" / "requirements-sidecar.txt").read_text().splitlines()
    specs += [line for line in sidecar if line.strip() and not line.startswith("#")]
    return {requirement_name(spec) for spec in specs}


def test_every_declared_dependency_is_pinned_exactly():
    missing = declared() - pins().keys()
    assert not missing, f"not in constraints.txt (run `make lock`): {sorted(missing)}"


def test_torch_is_pinned_to_the_cpu_build_on_disk():
    assert pins()["torch"] == "2.13.0"  # any other spec downloads GBs of CUDA packages


def test_every_install_goes_through_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "$(PY) -m pip install" in line]
    assert installs and all("-c $(CONSTRAINTS)" in line for line in installs), installs
    assert "$(STAMP): pyproject.toml $(CONSTRAINTS)" in makefile  # a new lock reinstalls
    script = (ROOT / "deploy" / "install.sh").read_text()
    script_installs = [line for line in script.splitlines() if '"$pip" install' in line]
    assert script_installs and all('-c "$pins"' in line for line in script_installs)
    assert "constraints.txt" in (ROOT / "Dockerfile").read_text()
