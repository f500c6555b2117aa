"""Every command or Python block of the documentation runs here as written, or is marked
(``tests/docs/blocks.py`` says how); every manifest it shows validates."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.blocks import (
    COMMANDS,
    ROOT,
    Block,
    all_blocks,
    matches,
    pages,
    stray_marks,
    transcript,
)

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.lang in COMMANDS and b.mark is None]


def is_manifest(block: Block) -> bool:
    """A YAML block whose top level has a ``version`` is a manifest."""
    if block.lang != "yaml":
        return False
    data = yaml.safe_load(block.text)
    return isinstance(data, dict) and "version" in data


MANIFESTS = [b for b in BLOCKS if is_manifest(b)]
BIN = Path(sys.executable).parent  # the venv's: python and triton-warmup
SEPARATOR = "\n@@ end of command @@\n"


def test_every_command_block_is_run_here_or_marked():
    commands = [b for b in BLOCKS if b.lang in COMMANDS]
    neither = [b.name for b in commands if b not in RUN and b.mark is None]
    assert not neither
    marked = [b for b in commands if b.mark is not None]
    assert len(RUN) + len(marked) == len(commands)
    assert len(RUN) >= 5 and len(marked) >= 15 and len(MANIFESTS) >= 3  # the parser finds them


def test_every_fence_names_its_language():
    bare = [b.name for b in BLOCKS if not b.lang]
    assert not bare, f"name the language (text for output, sh for commands): {bare}"


def test_every_mark_is_well_formed_and_right_before_a_fence():
    stray = [mark for path in pages() for mark in stray_marks(path)]
    assert not stray, f"a mark must be one line right before a fence: {stray}"
    on_others = [b.name for b in BLOCKS if b.mark and b.lang not in COMMANDS]
    assert not on_others, f"only command and Python blocks are marked: {on_others}"


def test_a_block_not_run_says_why():
    vague = [b.name for b in BLOCKS if b.mark == "not-runnable" and len(b.note.split()) < 4]
    assert not vague, f"say what the block needs, or why running it proves nothing: {vague}"


def test_a_block_tested_elsewhere_names_a_test_that_reads_its_page():
    for block in (b for b in BLOCKS if b.mark == "tested-by"):
        path, _, name = block.note.partition("::")
        test_file = ROOT / path
        assert test_file.is_file(), f"{block.name}: no test file {path}"
        source = test_file.read_text()
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{block.name}: no {name}"
        assert block.page in source, f"{block.name}: {path} does not read {block.page}"


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A scratch folder that sees the repository's examples, and a clean environment
    (no TRITON_WARMUP_* of the caller's) whose PATH has the venv's commands."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    server = tmp_path / "my_server"  # the server module the pages' manifests name
    server.mkdir()
    (server / "__init__.py").write_text("")
    (server / "model.py").write_text("def build(*, device):\n    return None\n")
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
        "PYTHONUNBUFFERED": "1",
        "TRITON_INTERPRET": "1",
        "NO_COLOR": "1",
    }
    return tmp_path, env


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.lang == "console":
        check_transcript(block, cwd, env)
        return
    command = [str(BIN / "python"), "-"] if block.lang == "python" else ["bash", "-euo", "pipefail"]
    done = subprocess.run(
        command, input=block.text, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{done.stderr[-3000:]}"


def check_transcript(block: Block, cwd: Path, env: dict[str, str]) -> None:
    """Run a console block's commands in one shell, in order, and compare what each
    printed with what the page shows."""
    steps = transcript(block.text)
    script = "exec 2>&1\n" + "".join(
        f"{command}\n__rc=$?; printf '{SEPARATOR}'; (exit $__rc)\n" for command, _ in steps
    )
    done = subprocess.run(
        ["bash"], input=script, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    outputs = done.stdout.split(SEPARATOR)
    assert len(outputs) == len(steps) + 1, f"{block.name}: the shell stopped early:\n{done.stdout}"
    for (command, expected), actual in zip(steps, outputs[:-1], strict=True):
        assert matches(expected, actual), (
            f"{block.name}: `{command}` printed\n{actual}\nwhere the page shows\n{expected}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.name)
def test_the_block_runs_as_written(block: Block, workspace: tuple[Path, dict[str, str]]):
    run_block(block, *workspace)


@pytest.mark.slow
@pytest.mark.parametrize("block", MANIFESTS, ids=lambda b: b.name)
def test_the_manifest_shown_validates(block: Block, workspace: tuple[Path, dict[str, str]]):
    cwd, env = workspace
    (cwd / "manifest.yaml").write_text(block.text)
    done = subprocess.run(
        [str(BIN / "triton-warmup"), "validate", "manifest.yaml"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{block.name}: {done.stderr[-3000:]}"
