import importlib.util
import inspect
import json
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest

from registry import Fingerprint, MatchPolicy, RegistryError, cpu_fingerprint, detect
from registry import kernel_source_hash as source_hash
from tests.conftest import gpu_fingerprint

KERNEL = """
import triton
import triton.language as tl


@triton.jit
def helper(x):
    return x * 2


@triton.jit
def add_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # one block per program
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, helper(tl.load(x_ptr + offs, mask=mask)), mask=mask)
"""


def _load(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_source_hash_survives_moving_lines_and_comments(tmp_path):
    base = _load(tmp_path, "k_base", KERNEL)
    moved = _load(
        tmp_path,
        "k_moved",
        "\n\n\n# a new header comment\n"
        + KERNEL.replace("  # one block per program", "  # reworded comment"),
    )
    assert source_hash(base.add_kernel) == source_hash(moved.add_kernel)
    # The kernel really moved (Triton's own key includes the line; ours must not).
    assert (
        inspect.getsourcelines(base.add_kernel.fn)[1]
        != inspect.getsourcelines(moved.add_kernel.fn)[1]
    )


def test_source_hash_changes_with_code_and_with_a_called_helper(tmp_path):
    base = _load(tmp_path, "k_base2", KERNEL)
    body = _load(
        tmp_path, "k_body", KERNEL.replace("mask=mask)), mask=mask)", "mask=mask)) + 1, mask=mask)")
    )
    helper = _load(tmp_path, "k_helper", KERNEL.replace("return x * 2", "return x * 3"))
    hashes = {source_hash(m.add_kernel) for m in (base, body, helper)}
    assert len(hashes) == 3


def test_source_hash_of_plain_function_and_bad_input():
    def f(a):
        return a + 1

    assert len(source_hash(f)) == 64
    with pytest.raises(RegistryError):
        source_hash(42)


def test_json_round_trip_and_stable_digest():
    fp = gpu_fingerprint()
    again = Fingerprint.from_json(json.loads(json.dumps(fp.to_json())))
    assert again == fp and again.digest() == fp.digest()
    assert fp.with_kernel("other").digest() != fp.digest()


def test_exact_policy_reports_each_differing_field():
    h200, h100 = gpu_fingerprint(), gpu_fingerprint("NVIDIA H100 80GB HBM3", sms=132)
    h100 = replace(h100, hardware=replace(h100.hardware, memory_gib=80))
    assert h200.mismatches(h100, MatchPolicy.EXACT) == {
        "hardware.gpu_name": ("NVIDIA H200", "NVIDIA H100 80GB HBM3"),
        "hardware.memory_gib": (141, 80),
    }


def test_same_arch_forgives_the_gpu_model_but_not_arch_software_or_kernel():
    h200, h100 = gpu_fingerprint(), gpu_fingerprint("NVIDIA H100", sms=114)
    assert h200.mismatches(h100, MatchPolicy.SAME_ARCH) == {}
    a100 = gpu_fingerprint("NVIDIA A100", cc="8.0", sms=108)
    assert set(h200.mismatches(a100, MatchPolicy.SAME_ARCH)) == {"hardware.compute_capability"}
    new_triton = gpu_fingerprint("NVIDIA H100", triton="3.7.0")
    assert set(h200.mismatches(new_triton, MatchPolicy.SAME_ARCH)) == {"software.triton"}
    assert set(h200.mismatches(h200.with_kernel("x"), MatchPolicy.SAME_ARCH)) == {"kernel_hash"}


def test_any_policy_matches_everything():
    assert gpu_fingerprint().mismatches(cpu_fingerprint(), MatchPolicy.ANY) == {}


def test_detect_on_this_machine_gives_the_cpu_fingerprint():
    fp = detect("abc")
    assert fp.hardware.compute_capability == "cpu" and fp.kernel_hash == "abc"
    assert fp.software.torch.startswith("2.") and fp.software.triton.startswith("3.")
    assert fp.gpu_slug() == "cpu"


def test_from_json_names_what_is_wrong():
    with pytest.raises(RegistryError, match="'hardware' is missing the field 'compute_capability'"):
        Fingerprint.from_json({"hardware": {"gpu_name": "x"}, "software": {}})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("compute_capability", 9, r"'hardware.compute_capability' has value 9; not str"),
        ("sm_count", True, r"'hardware.sm_count' has value True; not int"),
        ("sm_count", "132", r"'hardware.sm_count' has value '132'; not int"),
        ("nvlink_full_mesh", 1, r"'hardware.nvlink_full_mesh' has value 1; not bool or NoneType"),
        ("extra", "x", r"'hardware' has an unknown field 'extra'"),
    ],
)
def test_from_json_refuses_a_wrong_typed_field(field, value, message):
    data = gpu_fingerprint().to_json()
    data["hardware"][field] = value
    with pytest.raises(RegistryError, match=message):
        Fingerprint.from_json(data)


@pytest.mark.parametrize("data", [None, [], "x", {"hardware": [], "software": {}}])
def test_from_json_refuses_what_is_not_an_object(data):
    with pytest.raises(RegistryError, match="not an object"):
        Fingerprint.from_json(data)


def test_a_detection_in_the_background_is_the_one_a_later_call_takes(monkeypatch):
    import threading
    import time

    from registry.core import fingerprint

    calls = []
    started = threading.Event()

    def slow_detect(*, device):
        calls.append(device)
        started.set()
        time.sleep(0.3)
        return gpu_fingerprint()

    monkeypatch.setattr(fingerprint, "detect", slow_detect)
    fingerprint._detected_gpu.cache_clear()
    try:
        thread = fingerprint.detect_in_background(SimpleNamespace(type="cuda", index=3))
        assert started.wait(10)
        assert fingerprint.detect_for(SimpleNamespace(type="cuda", index=3)) == gpu_fingerprint()
        thread.join(10)
        assert calls == [3]  # the caller waited for the thread's answer, not a second run

        def broken(*, device):
            raise RuntimeError("no GPU")

        monkeypatch.setattr(fingerprint, "detect", broken)
        fingerprint.detect_in_background(SimpleNamespace(type="cuda", index=4)).join(10)
        with pytest.raises(RuntimeError, match="no GPU"):  # left to the caller, said there
            fingerprint.detect_for(SimpleNamespace(type="cuda", index=4))
    finally:
        fingerprint._detected_gpu.cache_clear()


def test_a_cpu_device_gets_the_cpu_fingerprint_even_on_a_gpu_machine(monkeypatch):
    from registry.core import fingerprint

    monkeypatch.setattr(fingerprint, "detect", lambda *a, **k: gpu_fingerprint())
    assert fingerprint.detect_for("cpu").hardware.gpu_name == "cpu"
    assert (
        fingerprint.detect_for(SimpleNamespace(type="cpu", index=None)).hardware.gpu_name == "cpu"
    )
    assert fingerprint.detect_for(SimpleNamespace(type="cuda", index=1)) == gpu_fingerprint()
