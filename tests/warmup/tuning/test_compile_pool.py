"""The worker side of the parallel compile: a captured specialisation, rebuilt in a forked
process, lands in the compile cache under the key Triton's own compile looks up."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import env_without_interpreter

ROOT = Path(__file__).parents[3]
pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, sys
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels import matmul
from warmup.tuning import compile_pool

cache = Path(os.environ["TRITON_CACHE_DIR"])
target = GPUTarget("cuda", 90, 32)
signature = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32",
             "K": "i32", "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "i32",
             "stride_bn": "constexpr", "stride_cm": "i32", "stride_cn": "constexpr",
             "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
             "GROUP_M": "constexpr"}
specs = []
for block_n in (64, 128):
    constants = {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, "BLOCK_M": 64,
                 "BLOCK_N": block_n, "BLOCK_K": 32, "GROUP_M": 8}
    names = list(signature)
    specs.append(json.dumps({
        "name": "kernels.matmul._matmul_kernel", "signature": signature,
        "constant_keys": [[names.index(k)] for k in constants],
        "constant_vals": list(constants.values()),
        "attrs_keys": [[0], [1], [2]], "attrs_vals": [[["tt.divisibility", 16]]] * 3,
        "options": {"num_warps": 4, "num_stages": 3}, "key": "k"}))
report = compile_pool.compile_all(specs + ["{not json"], workers=2, target=target)
before = compile_pool.cache_files(cache)
# what the JIT does next: the same ASTSource, compiled in this process
for spec in specs:
    s = json.loads(spec)
    names = list(signature)
    constexprs = {(names.index(k),): v for k, v in
                  zip([names[c[0]] for c in s["constant_keys"]], s["constant_vals"])}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    triton.compile(ASTSource(matmul._matmul_kernel, signature, constexprs, attrs),
                   target=target, options=s["options"])
print(json.dumps({"compiled": report.compiled, "failed": report.failed, "workers": report.workers,
                  "added_after": compile_pool.cache_files(cache) - before, "files": before}))
"""


def test_forked_workers_fill_the_cache_the_in_process_compile_hits(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env_without_interpreter(TRITON_CACHE_DIR=str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["compiled"] == 2 and result["workers"] == 2
    assert len(result["failed"]) == 1 and "JSONDecodeError" in result["failed"][0]
    assert result["files"] > 0 and result["added_after"] == 0  # the in-process compile hit
