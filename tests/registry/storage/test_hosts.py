"""A host known by its probe (files only, no torch), and the record a warm run leaves."""

import json
import sys

import pytest

from registry import RegistryError
from registry.core.fingerprint import cpu_fingerprint
from registry.storage import hosts
from registry.storage.hosts import HostRecord, Probe
from tests.conftest import gpu_fingerprint


def fake_proc(root, models, driver="570.86.15"):
    (root / "gpus").mkdir(parents=True)
    for i, model in enumerate(models):
        folder = root / "gpus" / f"0000:{i:02x}:00.0"
        folder.mkdir()
        (folder / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\n")
    (root / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Fri\n"
    )
    return root


def test_a_gpu_host_is_probed_from_the_driver_files_alone(tmp_path):
    proc = fake_proc(tmp_path / "nvidia", ["NVIDIA H200", "NVIDIA H200"])
    found = hosts.probe("cuda", 2, proc=proc)
    assert found.gpus == ("NVIDIA H200", "NVIDIA H200")
    assert (found.visible_gpus, found.driver) == (2, "570.86.15")
    assert found.packages["torch"].startswith("torch 2.")  # then the RECORD's digest
    assert found.kernels  # the kernels package's sources were found
    cpu = hosts.probe("cpu", 2, proc=proc)
    assert (cpu.gpus, cpu.visible_gpus, cpu.driver) == ((), 0, "none")


def test_probing_imports_neither_torch_nor_triton(run_python_code):
    out = run_python_code(
        "import sys; from registry.storage import hosts; hosts.probe('cuda', 1); "
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    assert out.strip().splitlines()[-1] == "[]"


@pytest.fixture
def run_python_code():
    import subprocess

    def run(code):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout

    return run


def test_each_fact_of_the_probe_changes_its_digest(tmp_path):
    proc = fake_proc(tmp_path / "a", ["NVIDIA H200"])
    base = hosts.probe("cuda", 1, proc=proc)
    other_gpu = hosts.probe("cuda", 1, proc=fake_proc(tmp_path / "b", ["NVIDIA H100 80GB HBM3"]))
    other_driver = hosts.probe("cuda", 1, proc=fake_proc(tmp_path / "c", ["NVIDIA H200"], "575.1"))
    digests = {
        base.digest(),
        other_gpu.digest(),
        other_driver.digest(),
        hosts.probe("cuda", 2, proc=proc).digest(),
        Probe(**{**base.to_json(), "gpus": base.gpus, "packages": {"torch": "2.12.0 x"}}).digest(),
        Probe(**{**base.to_json(), "gpus": base.gpus, "kernels": "edited"}).digest(),
    }
    assert len(digests) == 6
    assert hosts.probe("cuda", 1, proc=proc).digest() == base.digest()  # stable
    assert base.differences(other_gpu.to_json()) == ["gpus"]


def test_knobs_are_the_key_entering_variables_without_folders_or_own_settings():
    environ = {
        "TRITON_DEFAULT_FP_FUSION": "0",
        "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
        "TRITON_CACHE_DIR": "/pod/a",
        "TORCHINDUCTOR_CACHE_DIR": "/pod/b",
        "TRITON_PTXAS_PATH": "/opt/ptxas",  # a tool, not a cache: it picks ptxas's version
        "TRITON_WARMUP_VOLUME": "/vol",
        "HOME": "/root",
    }
    assert hosts.knobs(environ) == {
        "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
        "TRITON_DEFAULT_FP_FUSION": "0",
        "TRITON_PTXAS_PATH": "/opt/ptxas",
    }


def test_mig_instances_are_a_fact_of_the_probe(tmp_path, monkeypatch):
    proc = fake_proc(tmp_path / "nvidia", ["NVIDIA H100 80GB HBM3"])
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-1234")
    whole = hosts.probe("cuda", 1, proc=proc)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "MIG-5678")
    sliced = hosts.probe("cuda", 1, proc=proc)
    assert (whole.mig, sliced.mig) == (False, True) and whole.digest() != sliced.digest()


def test_a_package_source_digest_follows_its_files(tmp_path, monkeypatch):
    package = tmp_path / "probe_pkg_x"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "k.py").write_text("A = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = hosts.sources_digest("probe_pkg_x")
    (package / "k.py").write_text("A = 2\n")
    assert hosts.sources_digest("probe_pkg_x") not in ("", first)
    assert hosts.sources_digest("no_such_package_here") == ""
    assert hosts.package_build("no-such-distribution-here") == "none"
    assert hosts.package_build("no-such-distribution-here", "torch").startswith("torch ")


def record(fingerprint=None, items=None, found=None):
    found = found or Probe(device="cpu", python="3.11.0")
    items = (
        items if items is not None else hosts.items_of([("ag_gemm", "bf16", 2, {"M": 8}, {"M": 8})])
    )
    return HostRecord(
        found.to_json(), fingerprint or cpu_fingerprint(), {}, {"ag_gemm": "h"}, items
    )


def test_a_record_is_written_read_back_and_merged_by_fingerprint(tmp_path):
    found = Probe(device="cpu", python="3.11.0")
    assert hosts.read_record(tmp_path, found) is None
    first = record(found=found)
    hosts.write_record(tmp_path, found, first)
    assert hosts.read_record(tmp_path, found) == first
    more = hosts.items_of([("ag_gemm", "bf16", 2, {"M": 16}, {"M": 16})])
    hosts.write_record(tmp_path, found, record(items=more, found=found))
    assert len(hosts.read_record(tmp_path, found).items) == 2  # one fingerprint: a union
    other_hashes = HostRecord(found.to_json(), cpu_fingerprint(), {}, {"matmul": "m"}, {})
    hosts.write_record(tmp_path, found, other_hashes)
    merged = hosts.read_record(tmp_path, found)
    assert merged.kernel_hashes == {"ag_gemm": "h", "matmul": "m"} and len(merged.items) == 2
    # a host of this probe that detected another fingerprint (a topology, a MIG profile):
    # the probe cannot tell them apart, so the record serves no full hit again
    hosts.write_record(tmp_path, found, record(gpu_fingerprint(), items=more, found=found))
    ambiguous = hosts.read_record(tmp_path, found)
    assert ambiguous.ambiguous and ambiguous.items == {}
    hosts.write_record(tmp_path, found, first)
    assert hosts.read_record(tmp_path, found).ambiguous  # and stays so


@pytest.mark.parametrize(
    "text",
    ["[]", '{"version": 2}', "not json", '{"version": 1, "probe": {}, "items": []}'],
)
def test_a_foreign_record_is_a_registry_error_naming_the_file(tmp_path, text):
    found = Probe(device="cpu")
    hosts.record_path(tmp_path, found).write_text(text)
    with pytest.raises(RegistryError, match="host record"):
        hosts.read_record(tmp_path, found)
    hosts.write_record(tmp_path, found, record(found=found))  # replaced by one that reads
    assert hosts.read_record(tmp_path, found) is not None


def test_a_record_is_read_within_its_bound_and_under_its_own_probe(tmp_path, monkeypatch):
    found = Probe(device="cpu")
    hosts.write_record(tmp_path, found, record(found=found))
    other = Probe(device="cuda")
    path = hosts.record_path(tmp_path, found)
    path.rename(hosts.record_path(tmp_path, other))  # a collision, or a hand-moved file
    with pytest.raises(RegistryError, match="probe differs in"):
        hosts.read_record(tmp_path, other)
    monkeypatch.setattr(hosts, "MAX_RECORD_BYTES", 10)
    with pytest.raises(RegistryError, match="limit 10"):
        hosts.read_record(tmp_path, other)


def test_an_item_names_kernel_dtype_world_and_shape():
    one = hosts.item_id("ag_gemm", "bf16", 2, {"M": 8, "N": 16, "K": 32})
    assert one == hosts.item_id("ag_gemm", "bf16", 2, {"K": 32, "N": 16, "M": 8})
    assert json.loads(one)["shape"] == {"M": 8, "N": 16, "K": 32}
    assert one != hosts.item_id("ag_gemm", "bf16", 4, {"M": 8, "N": 16, "K": 32})


def test_a_record_travels_by_the_remote_tier_read_within_its_bound(redis_url, monkeypatch):
    from registry.remote.tier import RemoteTier

    tier = RemoteTier(redis_url)
    found = Probe(device="cpu", python="3.11.7")
    assert hosts.fetch_record(tier, found) is None
    written = record(found=found)
    assert hosts.publish_record(tier, found, written)
    assert hosts.fetch_record(tier, found) == written
    other = Probe(device="cuda", python="3.11.7")
    tier.client.set(hosts.remote_key(other), tier.client.get(hosts.remote_key(found)))
    assert hosts.fetch_record(tier, other) is None  # another probe's record at its key
    monkeypatch.setattr(hosts, "MAX_RECORD_BYTES", 64)
    assert hosts.fetch_record(tier, found) is None  # over the bound: not read
    tier.client.set(hosts.remote_key(found), b"[1, 2]")
    monkeypatch.setattr(hosts, "MAX_RECORD_BYTES", 4096)
    assert hosts.fetch_record(tier, found) is None  # not a record


def test_a_remote_tier_that_is_down_has_no_record():
    from registry.remote.tier import RemoteTier
    from tests.conftest import free_port

    tier = RemoteTier(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.3)
    found = Probe(device="cpu")
    assert hosts.fetch_record(tier, found) is None
    assert not hosts.publish_record(tier, found, record(found=found))
