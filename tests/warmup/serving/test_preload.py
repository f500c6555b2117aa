"""The compiler's imports started by Serving() when the manifest declares a model, the
pod's Inductor environment set first, and waited for before the first prime."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from tests.conftest import DEMO, ROOT, settings_for, write_manifest
from tests.warmup.serving.test_models import manifest
from warmup.serving import Serving
from warmup.serving.models import build_served
from warmup.serving.preload import Preload, declares_models


@pytest.fixture(autouse=True)
def environment():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_the_environment_is_set_before_the_imports_and_a_failure_is_kept(tmp_path, monkeypatch):
    package = tmp_path / "preload_probe_mod.py"
    package.write_text("import os\nSEEN = os.environ.get('TORCHINDUCTOR_CACHE_DIR')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = settings_for(tmp_path)
    preload = Preload(settings, ("preload_probe_mod", "no_such_module_here", "json"))
    preload.wait()
    assert (
        str(settings.folders.inductor_cache_dir.resolve()) == sys.modules["preload_probe_mod"].SEEN
    )
    assert preload.error.startswith("no_such_module_here: ModuleNotFoundError")
    assert os.environ["TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"] == "1"  # the default: on


def test_serving_preloads_only_for_a_manifest_that_declares_models(tmp_path):
    models = write_manifest(tmp_path / "models.yaml", manifest("traced"))
    assert declares_models(models) and not declares_models(DEMO)
    assert not declares_models(tmp_path / "missing.yaml")
    assert declares_models(ROOT / "examples" / "demo.yaml")
    settings = settings_for(tmp_path, manifest=models, create_volume=True)
    with Serving(settings, follow=False) as serving:
        assert serving.preload is not None
        serving.preload.wait()
        assert serving.preload.error is None and serving.preload.seconds > 0
    off = settings_for(tmp_path, manifest=models, serving_preload=False)
    with Serving(off, follow=False) as serving:
        assert serving.preload is None
    with Serving(settings_for(tmp_path, manifest=DEMO), follow=False) as serving:
        assert serving.preload is None  # kernels only: nothing compiles in this process


def test_the_first_prime_waits_for_the_preload_after_the_build(tmp_path):
    torch._dynamo.reset()  # another test may have traced the same code in this process
    path = write_manifest(tmp_path / "m.yaml", manifest("traced"))
    events = []

    def waited():
        events.append(("waited", torch._dynamo.utils.counters["frames"]["ok"]))

    before = torch._dynamo.utils.counters["frames"]["ok"]
    build_served(
        "m", settings_for(tmp_path, manifest=path), device=torch.device("cpu"), guard=None,
        before_prime=waited,
    )  # fmt: skip
    assert events == [("waited", before)]  # nothing traced before it returned
    assert torch._dynamo.utils.counters["frames"]["ok"] > before


GRAPH_TREES_PROBE = """
import sys, threading
import torch
from tests.conftest import settings_for
from pathlib import Path
from warmup.serving import preload

def strict_get_obj(local, name):  # torch 2.11's: a thread without the state asserts
    if hasattr(local, name):
        return getattr(local, name)
    assert torch._C._is_key_in_tls(name)
    return torch._C._get_obj_in_tls(name)

loader = preload.Preload(settings_for(Path(sys.argv[1])), (preload.GRAPH_TREES,))
loader._thread.join()  # imported on the preload thread, as another torch's modules may
trees = sys.modules[preload.GRAPH_TREES]
trees.get_obj = strict_get_obj
if sys.argv[2] == "as-2.11" and hasattr(trees, "_initialize_tls"):
    del trees._initialize_tls
loader.wait()
trees.get_container(0)  # this thread's first CUDA graph would start here
print("made", flush=True)
import os
os._exit(0)  # the state's teardown at exit is torch's, not what this probe asks
"""


@pytest.mark.parametrize("torch_like", ["as-2.11", "as-installed"])
def test_the_thread_that_waits_has_the_cuda_graph_trees_state(tmp_path, torch_like):
    import subprocess

    probe = subprocess.run(
        [sys.executable, "-c", GRAPH_TREES_PROBE, str(tmp_path), torch_like],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert probe.returncode == 0 and "made" in probe.stdout, probe.stderr[-2000:]
