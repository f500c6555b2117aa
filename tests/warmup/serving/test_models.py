"""A compiled model in the server, on CPU under Dynamo: called under its declared mode
whatever the caller's, primed until steady, its prime's outcome logged and counted, and
an init container of other versions named."""

from __future__ import annotations

import contextlib
import os
import time

import pytest
import torch
from prometheus_client import CollectorRegistry

from tests.conftest import settings_for, write_manifest
from tests.warmup.compiled.models import COORDESC
from warmup.compiled.counters import snapshot
from warmup.compiled.inputs import make_inputs
from warmup.core.results import ModelResult, RunStatus
from warmup.serving import Serving, models, priming
from warmup.serving.compile_guard import CompileGuard, RequestCompileError
from warmup.serving.metrics import ServingMetrics
from warmup.serving.models import build_served, server_factors
from warmup.serving.priming import PRIME_CALLS

SHAPES = [(1, 3, 32), (2, 3, 32)]


def manifest(build: str, mode: str = "no_grad", dims: str = "{batch: [1, 2], seq: 3}") -> str:
    """One model ``m`` of the MLP's inputs, built by ``build`` in tests.warmup.compiled.models."""
    return (
        "version: 1\nmodels:\n  - name: m\n"
        f"    build: tests.warmup.compiled.models:{build}\n    mode: {mode}\n"
        f"    dims: {dims}\n    inputs:\n"
        "      - {shape: [batch, seq, 32], dtype: fp32}\n"
        "      - {shape: [batch], dtype: int64, high: 3}\n"
    )


@pytest.fixture(autouse=True)
def environment():
    """build_served points this process's Inductor env at the test's folder: put it back.
    Dynamo forgets the other tests' frames (every test's MLP shares one code object)."""
    torch._dynamo.reset()
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def served(tmp_path, build, mode="no_grad", dims="{batch: [1, 2], seq: 3}", **extra):
    path = write_manifest(tmp_path / "manifest.yaml", manifest(build, mode, dims))
    settings = settings_for(tmp_path, manifest=path)
    return build_served("m", settings, device=torch.device("cpu"), guard=None, **extra), settings


def write_status(settings, *, restore="", fingerprint=None):
    model = ModelResult(name="m", phase="warm", restore=restore)
    RunStatus(
        state="ready",
        manifest_digest="d",
        started=time.time(),
        world_size=1,
        fingerprint=fingerprint,
        models=[model] if restore else [],
    ).write(settings.paths.status_file)


def costs_of(call):
    before = snapshot()
    call()
    return (snapshot() - before).request_costs()


@pytest.mark.parametrize(
    ("mode", "callers"),
    [
        ("no_grad", [torch.enable_grad, torch.inference_mode]),
        ("inference_mode", [torch.enable_grad, torch.no_grad]),
        ("grad", [torch.no_grad, torch.inference_mode]),
    ],
)
def test_a_call_from_another_mode_runs_in_the_declared_one_and_compiles_nothing(
    tmp_path, mode, callers
):
    model, _ = served(tmp_path, "traced", mode)
    inputs = make_inputs(model.entry, {"batch": 2, "seq": 3}, "cpu")
    for caller in callers:
        with caller():
            assert costs_of(lambda: model(*inputs)) == {}, caller
    with callers[0]():  # the bare function, from the caller's mode, compiles again
        assert costs_of(lambda: model.function(*inputs))["dynamo_frames"] >= 1


def test_priming_calls_each_shape_until_a_call_compiles_nothing(tmp_path):
    model, _ = served(tmp_path, "counted")
    # the first call at a shape traces it; the second compiles nothing: steady
    assert model.function.calls == [SHAPES[0]] * 2 + [SHAPES[1]] * 2
    assert model.primed is not None and model.primed.calls == 4
    for dims in ({"batch": 1, "seq": 3}, {"batch": 2, "seq": 3}):
        inputs = make_inputs(model.entry, dims, "cpu")
        assert costs_of(lambda inputs=inputs: model(*inputs)) == {}


def test_a_function_that_never_compiles_is_primed_once_per_shape(tmp_path):
    model, _ = served(tmp_path, "counted_plain")
    assert model.function.calls == SHAPES


def test_priming_goes_on_while_a_cuda_graph_warms_up_or_records(tmp_path, monkeypatch):
    # each shape: warm-up, recording, then replay (as cudagraph trees report them)
    states = iter([True, True, False] * 2)
    monkeypatch.setattr(priming, "_graph_pending", lambda device: next(states))
    model, _ = served(tmp_path, "counted_plain")
    assert model.function.calls == [SHAPES[0]] * 3 + [SHAPES[1]] * 3
    monkeypatch.setattr(priming, "_graph_pending", lambda device: True)  # never steady
    (tmp_path / "again").mkdir()
    model, _ = served(tmp_path / "again", "counted_plain")
    assert model.function.calls == [SHAPES[0]] * PRIME_CALLS + [SHAPES[1]] * PRIME_CALLS


def test_a_prime_that_compiled_nothing_is_logged_and_counted_restored(tmp_path, caplog):
    metrics = ServingMetrics(CollectorRegistry())
    with caplog.at_level("INFO", "warmup.serving.models"):
        model, settings = served(tmp_path, "traced", metrics=metrics)
    assert model.primed is not None and model.primed.outcome == "restored"
    assert model.primed.cause == "" and model.primed.counts.dynamo_frames == 2
    assert "model m: restored (0 FX-graph hits, 0 compiles) in " in caplog.text
    assert caplog.text.rstrip().endswith(
        f"s from the pod's Inductor cache {settings.folders.inductor_cache_dir}"
    )
    labels = {"model": "m", "outcome": "restored", "rank": "0"}
    assert metrics.registry.get_sample_value("triton_warmup_model_primes_total", labels) == 1


def test_a_prime_that_compiled_says_why_from_the_warmup_status(tmp_path, caplog):
    metrics = ServingMetrics(CollectorRegistry())
    with caplog.at_level("INFO", "warmup.serving.models"):
        model, settings = served(tmp_path, "misses_at_first_call", metrics=metrics)
    assert model.primed is not None and model.primed.outcome == "compiled"
    assert model.primed.cause == f"no warmup status at {settings.paths.status_file}"
    assert model.primed.counts.coordesc_benchmarks == 1
    assert "model m: compiled cold (1 FX-graph misses, 0 Triton compiles, 1 autotune" in caplog.text
    labels = {"model": "m", "outcome": "compiled", "rank": "0"}
    assert metrics.registry.get_sample_value("triton_warmup_model_primes_total", labels) == 1
    write_status(settings, restore="miss: no artifacts of model m")
    again = build_served("m", settings, device=torch.device("cpu"), guard=None)
    assert again.primed is not None
    assert again.primed.cause == (
        "warmup restore: miss: no artifacts of model m; the pod's Inductor cache "
        f"{settings.folders.inductor_cache_dir} held nothing here: not the folder the warmup filled"
    )


def test_an_init_container_of_another_torch_is_named_counted_and_not_refused(tmp_path, caplog):
    here = server_factors(torch.device("cpu"))
    fingerprint = {
        "software": {"torch": "2.0.0+other", "triton": here["triton"]},
        "hardware": {"gpu_name": "cpu"},
    }
    path = write_manifest(tmp_path / "manifest.yaml", manifest("misses_at_first_call"))
    settings = settings_for(tmp_path, manifest=path, create_volume=True)
    write_status(settings, restore="hit", fingerprint=fingerprint)
    with caplog.at_level("INFO", "warmup"), Serving(settings, follow=False) as serving:
        model = serving.model("m", device="cpu")
        value = serving.metrics.registry.get_sample_value
        name = "triton_warmup_serving_warmup_mismatches_total"
        assert value(name, {"factor": "torch", "rank": "0"}) == 1
        assert value(name, {"factor": "triton", "rank": "0"}) is None
    [warning] = [r.getMessage() for r in caplog.records if "init container" in r.getMessage()]
    assert f"torch 2.0.0+other (init) vs {torch.__version__} (server)" in warning
    assert "triton" not in warning and "gpu_name" not in warning
    assert model.primed is not None
    assert model.primed.cause.startswith("warmup restore: hit; ")
    assert model.primed.cause.endswith(f"; init vs server torch 2.0.0+other vs {torch.__version__}")


def test_an_autotune_benchmark_in_a_request_is_a_request_cost(tmp_path):
    guard = CompileGuard()
    model, _ = served(tmp_path, "traced")
    model.guard = guard
    inputs = make_inputs(model.entry, {"batch": 1, "seq": 3}, "cpu")
    from torch._dynamo.utils import compilation_time_metrics

    def tuned(*args, function=model.function):
        compilation_time_metrics.setdefault(COORDESC, []).extend([0.0] * 3)
        return function(*args)

    model.function = tuned
    with guard:
        model(*inputs)
    assert guard.models == {("m", "autotune_runs"): 3}


@pytest.mark.parametrize(("choice", "on"), [("off", False), ("on", True)])
def test_a_chosen_static_launcher_is_set_in_the_environment_and_in_inductors_config(
    tmp_path, monkeypatch, choice, on
):
    from torch._inductor import config

    from warmup.serving.models import use_inductor_cache

    for name in ("TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.setenv(name, "")  # put back after the test
    monkeypatch.setenv("CUDA_CACHE_PATH", "")
    with config.patch(use_static_cuda_launcher=not on):  # imported and set before
        use_inductor_cache(settings_for(tmp_path, static_launcher=choice))
        assert os.environ["TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"] == str(int(on))
        assert config.use_static_cuda_launcher is on


def test_the_servers_own_static_launcher_variable_gives_way_to_the_setting(tmp_path, monkeypatch):
    """A server's container may hold another value than the init container's: the
    setting decides in both, as the FX graph's key needs."""
    from torch._inductor import config

    from warmup.serving.models import use_inductor_cache

    monkeypatch.setenv("TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER", "0")
    for name in ("TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"):
        monkeypatch.setenv(name, "")
    with config.patch(use_static_cuda_launcher=False):
        use_inductor_cache(settings_for(tmp_path))  # the default: on
        assert os.environ["TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"] == "1"
        assert config.use_static_cuda_launcher is True


def test_a_prime_that_fails_names_its_shape_and_logs_where_it_failed(tmp_path, caplog):
    with pytest.raises(ValueError, match=r"at \{'batch': 2, 'seq': 3\}: AssertionError") as error:
        served(tmp_path, "asserts_at_batch_2")
    assert error.value.__cause__ is None  # one line for the caller
    logged = [r for r in caplog.records if "priming at {'batch': 2" in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback, for the operator
    assert "asserts_at_batch_2" in caplog.text or "x.shape[0] != 2" in caplog.text


def refused(model, inputs, caller=contextlib.nullcontext):
    """The RequestCompileError a strict guard raises for a call with ``inputs`` in the
    ``caller``'s context (the warning it logs too)."""
    with CompileGuard(strict=True) as guard, caller():
        model.guard = guard
        with pytest.raises(RequestCompileError) as error:
            model(*inputs)
    return error.value


def test_an_undeclared_batch_1_is_named_with_dynamos_specialisation_and_the_fix(tmp_path, caplog):
    model, _ = served(tmp_path, "traced_dynamic", dims="{batch: [2, 4], seq: 3}")
    between = make_inputs(model.entry, {"batch": 3, "seq": 3}, "cpu")
    assert costs_of(lambda: model(*between)) == {}  # the dynamic graph serves batch 3
    with caplog.at_level("WARNING", "warmup.serving.compile_guard"):
        error = refused(model, make_inputs(model.entry, {"batch": 1, "seq": 3}, "cpu"))
    assert [cause.kind for cause in error.causes] == ["shape"]
    said = (
        "batch=1 is not declared (the manifest's batch: 2, 4); Dynamo specialises sizes 0 "
        "and 1, so no graph primed at other sizes serves it, dynamic or not (fix: add 1 to "
        "the model's dim batch in the manifest)"
    )
    assert str(error).startswith("model 'm' compiled (dynamo_frames=")
    assert f"after the process was declared warm: {said} (TRITON_WARMUP_COMPILE_GUARD" in str(error)
    assert f"compiled model m compiled after warm (dynamo_frames=1): {said}" in caplog.text


def test_an_inference_tensor_for_a_no_grad_model_is_named_with_the_fix(tmp_path):
    model, _ = served(tmp_path, "traced")
    with torch.inference_mode():  # where a server makes its inputs
        inputs = make_inputs(model.entry, {"batch": 2, "seq": 3}, "cpu")
    error = refused(model, inputs, torch.inference_mode)
    assert [cause.kind for cause in error.causes] == ["tensor kind"]
    assert (
        "inputs 0 [batch, seq, 32], 1 [batch] are inference tensors, made under "
        "torch.inference_mode() (the caller is in it); model m (mode: no_grad) was primed "
        "with normal tensors (fix: make its inputs outside torch.inference_mode(), or "
        "declare mode: inference_mode (then it is primed with both kinds))"
    ) in str(error)
    assert "dims" not in str(error)  # batch 2 is declared: the shape is not the cause


def test_an_input_that_requires_grad_is_named_with_the_fix(tmp_path):
    model, _ = served(tmp_path, "traced")
    x, scale = make_inputs(model.entry, {"batch": 2, "seq": 3}, "cpu")
    error = refused(model, [x.requires_grad_(), scale], torch.enable_grad)
    assert [cause.kind for cause in error.causes] == ["requires_grad"]
    assert (
        "input 0 [batch, seq, 32] has requires_grad=True (a leaf asked for it, or made from "
        "one that requires grad with grad enabled (the caller's mode)); priming's inputs do "
        "not (fix: pass it .detach()ed, or make it under torch.no_grad() or "
        "torch.inference_mode())"
    ) in str(error)


def test_a_grad_mode_the_models_own_code_changes_is_named_with_the_fix(tmp_path, monkeypatch):
    from tests.warmup.compiled.models import GRAD_INSIDE

    model, _ = served(tmp_path, "sets_its_own_grad_mode")
    monkeypatch.setitem(GRAD_INSIDE, "enabled", True)  # after priming, under no_grad
    error = refused(model, make_inputs(model.entry, {"batch": 2, "seq": 3}, "cpu"))
    assert [cause.kind for cause in error.causes] == ["grad mode"]
    assert (
        "the grad mode inside the call differs from priming's (mode: no_grad; the caller's: "
        "grad enabled; Dynamo: GLOBAL_STATE changed: grad_mode) (fix: call the compiled module "
        "only through the served model"
    ) in str(error)


def test_a_compile_whose_causes_cannot_be_read_is_counted_all_the_same(
    tmp_path, monkeypatch, caplog
):
    model, _ = served(tmp_path, "traced", dims="{batch: [2, 4], seq: 3}")

    def fails(*args, **kwargs):
        raise RuntimeError("another torch")

    monkeypatch.setattr(models, "explain", fails)
    with CompileGuard() as guard, caplog.at_level("WARNING", "warmup.serving"):
        model.guard = guard
        model(*make_inputs(model.entry, {"batch": 3, "seq": 3}, "cpu"))
    assert guard.models[("m", "dynamo_frames")] == 1
    assert "why a call compiled not found: RuntimeError: another torch" in caplog.text
    assert "compiled model m compiled after warm (dynamo_frames=1): cause not known" in caplog.text
