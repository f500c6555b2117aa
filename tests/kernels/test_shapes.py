"""Each kernel's rule on its shapes, read where torch is not imported."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kernels
from kernels.shapes import RULES, check_shape

ROOT = Path(__file__).parents[2]


def test_it_imports_the_standard_library_only():
    tree = ast.parse((ROOT / "kernels" / "shapes.py").read_text())
    imported = {
        (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    done = subprocess.run(
        [sys.executable, "-c", "import kernels.shapes, sys; print('torch' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "False"


def test_every_kernel_has_one_rule_and_the_gathered_one_says_why_it_refuses():
    assert set(RULES) == set(kernels.ADAPTERS)
    assert check_shape("ag_gemm", {"M": 6, "N": 1, "K": 1}, world_size=4) == (
        "M=6 is not a multiple of world_size 4"
    )
    assert check_shape("ag_gemm", {"M": 8, "N": 1, "K": 1}, world_size=4) is None
    assert check_shape("matmul", {"M": 6, "N": 1, "K": 1}, world_size=4) is None
    assert RULES["ag_gemm"].restricts and not RULES["matmul"].restricts
    with pytest.raises(KeyError):
        check_shape("nope", {"M": 1, "N": 1, "K": 1}, world_size=1)
