"""The server's one line per model (``warmup.serving.models``): restored, from where and
how many artifacts, or compiled, and why, from what the init container's status and the
volume say."""

from __future__ import annotations

import time

import pytest

from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint
from tests.conftest import settings_for
from tests.warmup.serving.test_models import environment, manifest, served  # noqa: F401
from warmup.compiled.counters import CompileCounts
from warmup.compiled.key import model_key
from warmup.core.manifest import parse_manifest
from warmup.core.results import ModelResult, RunStatus
from warmup.serving import models
from warmup.serving.models import Primed

ENTRY = parse_manifest(manifest("misses_at_first_call")).model("m")
FP = cpu_fingerprint()


def status(*records: ModelResult, state: str = "ready") -> RunStatus:
    return RunStatus(
        state=state,
        manifest_digest="d",
        started=time.time(),
        world_size=1,
        fingerprint=FP.to_json(),
        models=list(records),
    )


def record(**fields) -> ModelResult:
    return ModelResult(**{"name": "m", "phase": "warm", "key_digest": "", **fields})


def stored_index(settings, digest: str) -> str:
    """Two files stored on the volume as the model's artifacts at ``digest``; the index."""
    made = settings.paths.work_dir / "made"
    for name in ("fxgraph/a", "triton/b"):
        (made / name).parent.mkdir(parents=True, exist_ok=True)
        (made / name).write_bytes(name.encode())
    root = settings.paths.layout.inductor
    inductor_cache.save(made, root, model="m", key_digest=digest, key={}, fingerprint=FP)
    return str(inductor_cache.index_path(root, "m", digest, FP))


def test_a_restored_model_names_the_cache_and_the_index_the_warmup_restored(tmp_path, caplog):
    settings = settings_for(tmp_path)
    digest = model_key(parse_manifest(manifest("traced")).model("m")).digest
    index = stored_index(settings, digest)
    status(record(phase="restored", restore="hit", key_digest=digest)).write(
        settings.paths.status_file
    )
    with caplog.at_level("INFO", "warmup.serving.models"):
        model, _ = served(tmp_path, "traced")
    assert model.primed is not None and model.primed.outcome == "restored"
    [line] = [r.getMessage() for r in caplog.records if "restored (" in r.getMessage()]
    assert line.startswith("model m: restored (0 FX-graph hits, 0 compiles) in ")
    assert line.endswith(
        f"s from the pod's Inductor cache {settings.folders.inductor_cache_dir}: 2 artifacts the "
        f"warmup restored from {index} (hit)"
    )


def test_a_model_whose_code_changed_since_the_warmup_says_so(tmp_path, caplog):
    settings = settings_for(tmp_path)
    warmed = record(phase="restored", restore="hit", key_digest="0" * 32)
    status(warmed).write(settings.paths.status_file)
    with caplog.at_level("INFO", "warmup.serving.models"):
        model, _ = served(tmp_path, "misses_at_first_call")
    assert model.primed is not None and model.primed.outcome == "compiled"
    mine = model_key(ENTRY).digest[:12]
    why = f"the model's code or shapes changed since the warmup (key {mine}, warmed 000000000000)"
    assert model.primed.cause == why
    assert "model m: compiled cold (1 FX-graph misses, 0 Triton compiles, 1 autotune " in (
        caplog.text
    )
    assert caplog.text.rstrip().endswith(why)


MISSED = "; this process missed the warmup's artifacts (an Inductor setting, the environment"
REFUSED = "the remote tier's copy was refused: unsigned, or not signed by a trusted key"


@pytest.mark.parametrize(
    ("said", "why"),
    [
        (status(state="running"), "the warmup had not finished (its status says running)"),
        (status(record(name="other")), "the warmup status has no model m"),
        (status(record(phase="failed", error="boom")), "the warmup failed it: boom"),
        (
            status(record(phase="deferred", restore=f"miss: none stored; {REFUSED}")),
            f"the warmup left it to the server: miss: none stored; {REFUSED}",
        ),
        (status(record(restore="hit")), f"warmup restore: hit{MISSED}"),
        (
            status(record(restore="miss: no artifacts")),
            f"warmup restore: miss: no artifacts{MISSED}",
        ),
        (  # rank 0's record is the one that restored
            status(record(rank=1), record(restore="hit", key_digest=model_key(ENTRY).digest)),
            f"warmup restore: hit{MISSED}",
        ),
    ],
)
def test_a_compiled_prime_says_why_from_the_warmups_status(tmp_path, said, why):
    settings = settings_for(tmp_path)
    assert models._cause(settings, said, ENTRY, {}, cache_empty=False).startswith(why)


def test_an_empty_cache_is_named_as_the_cause_whatever_the_warmup_did(tmp_path):
    settings = settings_for(tmp_path)
    said = status(record(restore="hit"))
    cause = models._cause(settings, said, ENTRY, {"torch": ("1", "2")}, cache_empty=True)
    assert cause == (
        f"warmup restore: hit; the pod's Inductor cache {settings.folders.inductor_cache_dir} held "
        "nothing here: not the folder the warmup filled; init vs server torch 1 vs 2"
    )


def test_a_restored_model_not_restored_by_the_warmup_or_whose_index_is_gone_says_so(tmp_path):
    settings = settings_for(tmp_path)
    cache = f"the pod's Inductor cache {settings.folders.inductor_cache_dir}"
    compiled = status(record(restore="miss: no artifacts"))
    assert models._source(settings, compiled, "m") == (
        f"{cache}, where the warmup compiled it (its restore: miss: no artifacts)"
    )
    deferred = status(record(phase="deferred", restore="miss: nothing stored for this host"))
    assert models._source(settings, deferred, "m") == (
        f"{cache}, filled after the warmup (deferred; its restore: miss: nothing stored for "
        "this host)"
    )
    gone = status(record(phase="restored", restore="hit", key_digest="0" * 32))
    assert models._source(settings, gone, "m") == f"{cache}, restored there by the warmup (hit)"
    assert models._source(settings, None, "m") == cache


def test_a_compile_that_some_cache_hits_spared_is_in_part():
    counts = CompileCounts(fxgraph_hits=2, fxgraph_misses=1, kernel_compiles=3)
    primed = Primed(outcome="compiled", seconds=1.5, counts=counts, cause="why", calls=4)
    assert primed.describe("m") == (
        "model m: compiled in part (2 FX-graph hits, 1 misses, 3 Triton compiles) in 1.50 s: why"
    )
    cold = Primed(
        outcome="compiled",
        seconds=1.5,
        counts=CompileCounts(fxgraph_misses=1),
        cause="why",
        calls=2,
    )
    assert cold.describe("m").startswith("model m: compiled cold (1 FX-graph misses, 0 Triton")
