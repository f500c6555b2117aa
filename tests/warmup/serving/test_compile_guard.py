"""The compile guard: after arm(), Triton compiles and autotune runs are counted, logged and,
when strict, refused; disarm() puts Triton back as it was."""

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from prometheus_client import CollectorRegistry
from triton import knobs
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JitFunctionInfo

from tests.conftest import env_without_interpreter
from warmup.core.settings import Settings
from warmup.serving.compile_guard import CompileGuard, RequestCompileError, guard_from_settings
from warmup.serving.metrics import ServingMetrics

ROOT = Path(__file__).parents[3]
COMPILES = "triton_warmup_request_compiles_total"
AUTOTUNES = "triton_warmup_request_autotunes_total"


@pytest.fixture(autouse=True)
def triton_untouched():
    """Every test leaves Triton's hook and autotuner class as it found them."""
    hook, run, bench = knobs.runtime.jit_cache_hook, Autotuner.run, Autotuner._bench
    listener = knobs.compilation.listener
    yield
    assert knobs.runtime.jit_cache_hook is hook
    assert knobs.compilation.listener is listener
    assert Autotuner.__dict__["run"] is run and Autotuner.__dict__["_bench"] is bench


def hook_call(name="scale_kernel", block=128, manual=False):
    """The keyword arguments Triton 3.9's ``JITFunction._call_hook`` passes its hooks."""
    compile_info = {
        "key": f"spec-{block}",
        "signature": {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        "device": 0,
        "constants": {(2,): block},
        "num_warps": 4,
        "num_ctas": 1,
        "num_stages": 3,
        "enable_fp_fusion": True,
        "launch_cooperative_grid": False,
        "extern_libs": (),
        "configs": [{(0,): [["tt.divisibility", 16]]}],
        "specialization_data": "{}",
        "is_warmup": manual,
    }
    return {
        "key": compile_info["key"],
        "repr": f"{name}[num_warps=4](...)",
        "fn": JitFunctionInfo("tests.kernels", name, None),
        "compile": compile_info,
        "is_manual_warmup": manual,
        "already_compiled": False,
    }


@pytest.fixture
def previous():
    """A hook set before the guard (a profiler, say), which records what it is given."""
    calls = []

    def hook(**kwargs):
        calls.append(kwargs)
        return hook.answer

    hook.answer = None
    hook.calls = calls
    knobs.runtime.jit_cache_hook = hook
    yield hook
    knobs.runtime.jit_cache_hook = None


@pytest.mark.parametrize(("mode", "strict"), [("count", False), ("strict", True), ("off", None)])
def test_settings_pick_the_mode(mode, strict):
    metrics = ServingMetrics(CollectorRegistry())
    guard = guard_from_settings(Settings(compile_guard=mode), metrics)
    if strict is None:
        assert guard is None
    else:
        assert guard.strict is strict and guard.metrics is metrics and guard.total == 0


def test_arm_chains_to_the_previous_hook_and_disarm_restores_it(previous):
    guard = CompileGuard()
    guard.arm()
    guard.arm()  # idempotent: one installation, one count per compile
    assert knobs.runtime.jit_cache_hook is not previous
    call = hook_call()
    assert knobs.runtime.jit_cache_hook(**call) is None  # the compile goes ahead
    assert previous.calls == [call]
    assert guard.compiles == {"scale_kernel": 1} and guard.total == 1
    guard.disarm()
    assert knobs.runtime.jit_cache_hook is previous
    knobs.runtime.jit_cache_hook(**hook_call())
    assert guard.compiles == {"scale_kernel": 1}


def test_a_previous_hook_that_skips_the_compile_is_respected(previous):
    previous.answer = True  # e.g. compile_pool.capture: nothing will compile
    with CompileGuard(strict=True) as guard:
        assert knobs.runtime.jit_cache_hook(**hook_call()) is True
    assert guard.total == 0


def test_a_compile_is_logged_with_its_specialisation(caplog):
    with caplog.at_level(logging.WARNING, "warmup.serving.compile_guard"), CompileGuard() as guard:
        knobs.runtime.jit_cache_hook(**hook_call(block=128, manual=True))
    assert guard.compiles == {"scale_kernel": 1}
    [record] = caplog.records
    message = record.getMessage()
    for part in ("scale_kernel", "x_ptr: *fp32", "n: i32", "BLOCK=128", "tt.divisibility=16"):
        assert part in message
    assert "num_warps=4" in message and "explicit kernel.warmup" in message


def test_strict_raises_naming_kernel_specialisation_and_fix():
    with CompileGuard(strict=True) as guard, pytest.raises(RequestCompileError) as error:
        knobs.runtime.jit_cache_hook(**hook_call("gemm_kernel", block=256))
    assert isinstance(error.value, RuntimeError)
    assert error.value.kernel == "gemm_kernel" and "BLOCK=256" in error.value.detail
    assert "gemm_kernel" in str(error.value) and "manifest" in str(error.value)
    assert guard.compiles == {"gemm_kernel": 1}  # refused, and still counted


def test_a_models_compile_is_counted_logged_and_refused_with_its_causes(caplog):
    from warmup.compiled.causes import Cause

    metrics = ServingMetrics(CollectorRegistry())
    causes = [
        Cause("shape", "batch=1 is not declared", "add 1"),
        Cause("dtype", "x is fp16", "cast"),
    ]
    with caplog.at_level(logging.WARNING, "warmup.serving.compile_guard"):
        CompileGuard(metrics=metrics).model_costs("m", {"dynamo_frames": 1}, causes)
        strict = CompileGuard(strict=True)
        with pytest.raises(RequestCompileError) as error:
            strict.model_costs("m", {"dynamo_frames": 2, "inductor_compiles": 1}, causes)
    said = "batch=1 is not declared (fix: add 1); x is fp16 (fix: cast)"
    assert [r.getMessage() for r in caplog.records] == [
        f"compiled model m compiled after warm (dynamo_frames=1): {said}",
        f"compiled model m compiled after warm (dynamo_frames=2, inductor_compiles=1): {said}",
    ]
    assert str(error.value) == (
        "model 'm' compiled (dynamo_frames=2, inductor_compiles=1) after the process was "
        f"declared warm: {said} (TRITON_WARMUP_COMPILE_GUARD=count would only count it)."
    )
    assert error.value.causes == tuple(causes) and strict.models[("m", "inductor_compiles")] == 1
    labels = {"model": "m", "what": "dynamo_frames", "rank": "0"}
    assert (
        metrics.registry.get_sample_value("triton_warmup_model_request_compiles_total", labels) == 1
    )
    with pytest.raises(RequestCompileError, match="warm: cause not known \\(TRITON"):
        strict.model_costs("m", {"dynamo_frames": 1})


def test_builds_made_on_purpose_are_exempt_on_their_thread_only():
    with CompileGuard(strict=True) as guard:
        with guard.exempt():
            assert knobs.runtime.jit_cache_hook(**hook_call()) is None  # not refused
            seen = []
            other = threading.Thread(target=lambda: seen.append(_refused()))
            other.start()
            other.join()
        assert guard.compiles == {"scale_kernel": 1} and seen == [True]  # the other thread's
        assert _refused()  # exemption ended with the block


def _refused() -> bool:
    try:
        knobs.runtime.jit_cache_hook(**hook_call())
    except RequestCompileError:
        return True
    return False


def test_counts_reach_the_metrics_registry():
    metrics = ServingMetrics(CollectorRegistry(), rank=3)
    with CompileGuard(metrics=metrics):
        for name in ("a_kernel", "a_kernel", "b_kernel"):
            knobs.runtime.jit_cache_hook(**hook_call(name))
    read = metrics.registry.get_sample_value
    assert read(COMPILES, {"kernel": "a_kernel", "rank": "3"}) == 2
    assert read(COMPILES, {"kernel": "b_kernel", "rank": "3"}) == 1


def test_a_compile_that_triton_loaded_from_its_disk_cache_is_also_a_load():
    metrics = ServingMetrics(CollectorRegistry(), rank=1)
    seen = []
    before = knobs.compilation.listener  # another test's, installed for the process
    knobs.compilation.listener = lambda **event: seen.append(event["cache_hit"])
    try:
        with CompileGuard(metrics=metrics) as guard:
            knobs.runtime.jit_cache_hook(**hook_call("loaded"))
            knobs.compilation.listener(cache_hit=True)  # Triton's compile(): a disk hit
            knobs.runtime.jit_cache_hook(**hook_call("built"))
            knobs.compilation.listener(cache_hit=False)
            knobs.compilation.listener(cache_hit=True)  # a compile the guard did not count
        assert guard.compiles == {"loaded": 1, "built": 1} and guard.loads == {"loaded": 1}
        assert guard.built == {"built": 1}
        assert seen == [True, False, True]  # the listener set before is still called
        loads = "triton_warmup_request_cache_loads_total"
        assert metrics.registry.get_sample_value(loads, {"kernel": "loaded", "rank": "1"}) == 1
    finally:
        knobs.compilation.listener = before


def test_a_refused_compile_is_never_taken_for_a_later_load():
    with CompileGuard(strict=True) as guard:
        with pytest.raises(RequestCompileError):
            knobs.runtime.jit_cache_hook(**hook_call("refused"))
        knobs.compilation.listener(cache_hit=True)  # another compile on this thread
    assert guard.loads == {} and guard.built == {"refused": 1}


def test_only_the_compile_the_hook_saw_answers_it():
    seen, other = object(), object()
    call = hook_call("watched")
    call["fn"] = JitFunctionInfo("tests.kernels", "watched", seen)
    with CompileGuard() as guard:
        knobs.runtime.jit_cache_hook(**call)
        src = type("Src", (), {})
        src.fn = other
        knobs.compilation.listener(src=src, cache_hit=True)  # Inductor's, say: not ours
        src.fn = seen
        knobs.compilation.listener(src=src, cache_hit=False)  # ours: built
        knobs.compilation.listener(src=src, cache_hit=True)  # nothing pending any more
    assert guard.built == {"watched": 1} and guard.loads == {}


def test_only_armed_guards_count_and_a_hook_stacked_on_ours_survives_disarm():
    idle, guard = CompileGuard(), CompileGuard()
    guard.arm()
    ours = knobs.runtime.jit_cache_hook

    def stacked(**kwargs):  # installed after arm(), chaining to ours
        return ours(**kwargs)

    knobs.runtime.jit_cache_hook = stacked
    stacked(**hook_call())
    guard.disarm()
    assert knobs.runtime.jit_cache_hook is stacked  # not clobbered
    stacked(**hook_call())  # ours now passes through
    assert guard.compiles == {"scale_kernel": 1} and idle.total == 0
    knobs.runtime.jit_cache_hook = None


def test_rearming_under_a_stacked_hook_counts_once_and_keeps_the_chain(previous):
    first = CompileGuard()
    first.arm()
    ours = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda **kwargs: ours(**kwargs)
    stacked = knobs.runtime.jit_cache_hook
    first.disarm()
    with CompileGuard() as second:  # its hook -> stacked -> the first's -> previous
        knobs.runtime.jit_cache_hook(**hook_call())
        assert knobs.runtime.jit_cache_hook is not stacked
    assert second.compiles == {"scale_kernel": 1} and first.total == 0
    assert len(previous.calls) == 1
    knobs.runtime.jit_cache_hook = previous


def test_counting_from_many_threads_loses_nothing():
    with CompileGuard() as guard:
        call = hook_call()
        logging.getLogger("warmup.serving.compile_guard").disabled = True
        try:
            threads = [
                threading.Thread(
                    target=lambda: [knobs.runtime.jit_cache_hook(**call) for _ in range(300)]
                )
                for _ in range(8)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            logging.getLogger("warmup.serving.compile_guard").disabled = False
    assert guard.compiles == {"scale_kernel": 8 * 300}


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def tuned(benched):
    """A fresh ``@triton.autotune`` of two configs (an empty key cache), run by Triton's
    interpreter; the benchmark function records each config it times."""

    def do_bench(kernel_call, quantiles):
        kernel_call()
        benched.append(1)
        return [float(len(benched))] * 3

    configs = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})]
    kernel = triton.autotune(configs=configs, key=["n"], do_bench=do_bench)(add_one)

    def launch(x):
        kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, x.numel())

    return launch


def test_autotune_counts_each_new_key_once(caplog):
    benched = []
    launch = tuned(benched)
    metrics = ServingMetrics(CollectorRegistry(), rank=1)
    guard = CompileGuard(metrics=metrics)
    launch(torch.zeros(40))  # not armed: tuned, not counted
    assert len(benched) == 2 and guard.total == 0
    with caplog.at_level(logging.WARNING, "warmup.serving.compile_guard"), guard:
        launch(torch.zeros(40))  # a key tuned before arm()
        assert guard.autotunes == {}
        x = torch.zeros(50)
        launch(x)
        launch(x)  # the same key again
    assert len(benched) == 4  # one new key: its two configs
    assert guard.autotunes == {"add_one": 1}
    [record] = caplog.records
    assert "autotune run of add_one" in record.getMessage() and "n=50" in record.getMessage()
    assert "torch.float32" in record.getMessage()
    read = metrics.registry.get_sample_value
    assert read(AUTOTUNES, {"kernel": "add_one", "rank": "1"}) == 1


def test_strict_refuses_an_autotune_run_before_benchmarking():
    benched = []
    launch = tuned(benched)
    x = torch.zeros(40)
    with CompileGuard(strict=True) as guard, pytest.raises(RequestCompileError, match="add_one"):
        launch(x)
    assert benched == [] and torch.equal(x, torch.zeros(40))  # nothing ran
    assert guard.autotunes == {"add_one": 1}
    launch(x)  # disarmed: Triton tunes as usual
    assert len(benched) == 2


def test_disarm_restores_the_autotuner_only_when_the_last_guard_disarms():
    run, bench = Autotuner.__dict__["run"], Autotuner.__dict__["_bench"]
    first, second = CompileGuard(), CompileGuard()
    first.arm()
    second.arm()
    assert Autotuner.__dict__["run"] is not run and Autotuner.__dict__["_bench"] is not bench
    first.disarm()
    assert Autotuner.__dict__["_bench"] is not bench
    second.disarm()
    assert Autotuner.__dict__["run"] is run and Autotuner.__dict__["_bench"] is bench


JIT_SCRIPT = """
import json, sys
from pathlib import Path
import torch, triton, triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from warmup.serving.compile_guard import CompileGuard, RequestCompileError
from warmup.tuning.compile_pool import cache_files

class CpuOnlyDriver:  # what JITFunction.run asks the driver; compiles for sm90, never launches
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)

driver.set_active(CpuOnlyDriver())

@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3, mask=offs < n)

def warm(block):
    return scale.warmup(torch.float32, 1000, BLOCK=block, grid=(1,)) is not None

def compiled():
    return cache_files(Path(sys.argv[1]))

guard = CompileGuard()
warm(64)  # before arm(): not counted
with guard:
    warm(64)  # in the JIT's memory: no compile
    made = warm(128)
    warm(128)
    scale.device_caches.clear()  # a new process's JIT: 128 is on disk only
    warm(128)
before = compiled()
try:
    with CompileGuard(strict=True):
        warm(256)
    error = None
except RequestCompileError as e:
    error = str(e)
restored = knobs.runtime.jit_cache_hook is None
print(json.dumps({"counts": guard.compiles, "loads": guard.loads, "made": made, "error": error,
                  "added": compiled() - before, "hook_restored": restored}))
"""


@pytest.mark.slow
def test_the_jit_calls_the_guard_before_it_compiles(tmp_path):
    """Triton's own JIT, with a driver stand-in for the GPU: compiles for sm90 on CPU."""
    script = tmp_path / "jit_guard.py"  # @triton.jit needs its source in a file
    script.write_text(JIT_SCRIPT)
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, str(script), str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env_without_interpreter(TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["counts"] == {"scale": 2} and result["made"]
    assert result["loads"] == {"scale": 1}  # the second came from Triton's disk cache
    assert "'scale'" in result["error"] and "BLOCK=256" in result["error"]
    assert result["added"] == 0 and result["hook_restored"]  # strict: nothing compiled
