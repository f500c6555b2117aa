"""The tune task contract's shared parts: defaults, the reference check, dropping inputs."""

from dataclasses import dataclass, field

import pytest
import torch

from kernels.task import ProductTask, Task, check_contract, relative_error_reason
from registry import KernelConfig
from tests.warmup.tuning.fakes import FakeTask


def test_a_plain_task_has_no_baseline_accepts_any_config_and_holds_nothing():
    task = Task()
    config = KernelConfig.make({"BLOCK": 16})
    assert task.baseline() is None and task.accepts(config)
    assert task.drop_inputs() is None and task.remake_inputs() is None


@dataclass
class Product(ProductTask):
    a: torch.Tensor
    b: torch.Tensor
    inputs: object = None
    out: object = None
    _expected: object = None
    references: list[int] = field(default_factory=list)

    def reference(self):
        self.references.append(1)
        return self.a.double() @ self.b.double()


def make():
    torch.manual_seed(0)
    return torch.randn(8, 4), torch.randn(4, 8)


def test_a_product_is_checked_against_its_reference_within_the_dtype_tolerance():
    task = Product(*make())
    right = task.a @ task.b
    assert task.verify(right) is None
    assert "relative error" in task.verify(right * 1.1)
    assert "NaN" in task.verify(torch.full_like(right, float("nan")))
    assert task.references == [1]  # made once, on the first check


def test_inputs_are_dropped_while_waiting_and_made_again_with_their_reference():
    task = Product(*make(), inputs=make)
    task.verify(task.a @ task.b)
    task.drop_inputs()
    assert task.a.is_meta and task.b.is_meta and task._expected is None
    assert task.a.shape == (8, 4)  # the key still reads the shapes
    task.remake_inputs()
    assert not task.a.is_meta and task.verify(task.a @ task.b) is None
    held = Product(*make())  # the caller's tensors: never dropped
    held.drop_inputs()
    assert not held.a.is_meta


def test_a_collective_reference_is_never_made_inside_a_check():
    class Gathered(Product):
        collective_reference = True

    task = Gathered(*make(), inputs=make)
    with pytest.raises(RuntimeError, match="no reference"):
        task.verify(task.a @ task.b)
    task.drop_inputs()
    task.remake_inputs()  # made with the inputs, on every rank together
    assert task.references == [1] and task.verify(task.a @ task.b) is None


def test_relative_error_is_measured_in_at_least_fp32():
    exact = torch.ones(4, 4, dtype=torch.float64)
    assert relative_error_reason(exact.to(torch.bfloat16), exact, 2e-2) is None


def test_a_task_without_the_whole_contract_is_refused_by_name():
    class Bare:  # written before the contract: no baseline, accepts, drop or remake
        kernel, kernel_hash = "bare", "0" * 64

        def key(self):
            return {}

        candidates = run = verify = warmup = key

    with pytest.raises(TypeError, match="no baseline, accepts, drop_inputs, remake_inputs"):
        check_contract(Bare())
    check_contract(FakeTask({16: 1.0}))  # a Task with the required parts has them all
