import pytest
import torch

from kernels import matmul
from registry import KernelConfig
from tests.conftest import env_without_interpreter

SMALL = KernelConfig.make({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2})


@pytest.mark.parametrize("m,n,k", [(37, 29, 23), (64, 64, 64), (1, 50, 17)])
def test_matches_the_float64_reference_at_odd_shapes(m, n, k):
    torch.manual_seed(m * n * k)
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.full((m, n), float("nan"))
    matmul.matmul(a, b, SMALL, out=out)
    torch.testing.assert_close(out, matmul.reference(a, b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "a,b,message",
    [
        (torch.randn(4, 5), torch.randn(6, 7), "do not chain"),
        (torch.randn(4, 5), torch.randn(5, 7, dtype=torch.float64), "dtypes"),
        (torch.randn(4, 5, 2), torch.randn(5, 7), "do not chain"),
    ],
)
def test_bad_input_is_a_value_error(a, b, message):
    with pytest.raises(ValueError, match=message):
        matmul.matmul(a, b, SMALL)


def test_space_is_the_benchmarks_sixteen_configs():
    space = matmul.space()
    assert len(space) == len(set(space)) == 16
    assert {(c.num_stages, c.num_warps) for c in space} == {(3, 8), (4, 4)}


def test_key_names_size_and_dtype():
    a, b = torch.randn(8, 4, dtype=torch.bfloat16), torch.randn(4, 2, dtype=torch.bfloat16)
    assert matmul.key(a, b) == {"M": 8, "N": 2, "K": 4, "dtype": "bf16"}


def test_a_task_that_dropped_its_inputs_holds_none_and_remakes_the_same_ones():
    (task,) = matmul.ADAPTER.tasks(
        [{"M": 24, "N": 32, "K": 16}], dtype="fp32", group=None, device="cpu"
    )
    a, b, key = task.a.clone(), task.b.clone(), task.key()
    assert task.verify(task.run(SMALL)) is None
    task.drop_inputs()
    assert task.a.is_meta and task.b.is_meta and task.out is None and task._expected is None
    assert task.key() == key  # still answers for its shape while it waits
    task.remake_inputs()
    assert torch.equal(task.a, a) and torch.equal(task.b, b)
    assert task.verify(task.run(SMALL)) is None
    given = matmul.MatmulTask(a, b)  # the caller's inputs: never dropped
    given.drop_inputs()
    assert given.a is a


@pytest.mark.slow
def test_compiles_ahead_for_sm90_without_a_gpu(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "from kernels import matmul; from triton.backends.compiler import GPUTarget; "
        "k = matmul.compile_ahead(matmul.space()[0], 'bf16', GPUTarget('cuda', 90, 32)); "
        "print(len(k.asm['cubin']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parents[2],
        env=env_without_interpreter(TRITON_CACHE_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert int(out.stdout.strip().splitlines()[-1]) > 1000
    assert list(tmp_path.glob("*/*.cubin"))


def test_a_launch_passes_every_launch_option_of_its_config():
    config = KernelConfig.make(
        {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1},
        num_warps=4,
        num_stages=2,
        num_ctas=1,
        maxnreg=128,
    )
    a, b, out = torch.empty(8, 16), torch.empty(16, 16), torch.empty(8, 16)
    options = matmul.launch_plan(a, b, out, config).options
    assert options["num_ctas"] == 1 and options["maxnreg"] == 128 and options["num_warps"] == 4
