"""``make demo``: the main job on the embedded defaults, on CPU.

2 ranks on gloo, Triton's interpreter, the three small AllGather-GEMM shapes and the
small compiled model (:func:`compiled_mlp`, Inductor's CPU backend) of
``examples/demo.yaml``, ``./demo-volume`` as the volume, file locks. The first run tunes
the misses and compiles the model, and stores both; the second, a new pod (a fresh
work folder), finds everything stored for this host: a full hit, it restores the caches
for the server and exits without starting a rank or importing torch.
Then the sidecar starts and answers the readiness probe and /metrics.
"""

from __future__ import annotations

import shutil
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from warmup import logs
from warmup.cli import summary
from warmup.manifest import load_manifest
from warmup.run.launch import run
from warmup.settings import Settings

KEY_METRICS = (
    "triton_warmup_ready ",
    "triton_warmup_configs_total",
    "triton_warmup_cache_hits_total",
    "triton_warmup_cache_misses_total",
    "triton_warmup_tuning_seconds_count",
    "triton_warmup_tuning_seconds_sum",
    "triton_warmup_warmup_duration_seconds",
    "triton_warmup_registry_entries",
    "triton_warmup_ranks",
    "triton_warmup_model_ready",
    "triton_warmup_model_compiles",
)


def main() -> int:
    # A fresh checkout has no ./demo-volume: the demo asks for it, as a user would with
    # --create-volume (a volume that is not there is otherwise an error).
    settings = Settings(device="cpu", create_volume=True)
    settings.existing_volume()
    logs.configure(settings.log_format, level=30)  # the demo prints its own story
    manifest = load_manifest(settings.manifest)
    shapes = sum(len(e.expand()) for e in manifest.entries)
    models = ", ".join(f"{m.name} at {m.count()} shapes" for m in manifest.models) or "none"
    print(
        f"manifest {settings.manifest}: {shapes} kernel shapes, compiled models: {models}, "
        f"digest {manifest.digest()}; "
        f"volume {settings.volume.resolve()}"
    )
    for label in (
        "first run (empty registry: misses are tuned)",
        "second run (a new pod: fresh work folder, same volume: a full hit)",
    ):
        print(f"\n== {label}")
        shutil.rmtree(settings.work_dir, ignore_errors=True)  # a new pod: only the volume stays
        started = time.time()
        status = run(settings, manifest)
        print(summary(status) + f"  [wall {time.time() - started:.1f} s]")
        if not status.ready:
            return 1
    print("\n== the sidecar")
    from warmup.sidecar.server import Sidecar

    sidecar = Sidecar(settings)
    port = sidecar.start(host="127.0.0.1", port=0)
    try:
        code, body = _get(f"http://127.0.0.1:{port}/readyz")
        print(f"GET /readyz -> {code} {body}")
        _, text = _get(f"http://127.0.0.1:{port}/metrics")
        for line in text.splitlines():
            if line.startswith(KEY_METRICS):
                print(f"  {line}")
    finally:
        sidecar.stop()
    return 0


def compiled_mlp(device: Any) -> Any:
    """The demo's compiled model: a small MLP, ``torch.compile``d as a server would."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    return torch.compile(model.to(device).eval(), dynamic=False)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


if __name__ == "__main__":
    sys.exit(main())
