"""``make demo``: the main job on the embedded defaults, on CPU.

2 ranks on gloo, Triton's interpreter, the three small AllGather-GEMM shapes and the
small compiled model (:func:`compiled_mlp`, Inductor's CPU backend) of
``examples/demo.yaml``, ``./demo-volume`` as the volume, file locks: each passed
explicitly, as a pod names its own (the commands have no demo defaults). Each run is
``triton-warmup run`` in a process of its own, as in a pod, so that its time to ready
counts from its own start. The first run tunes the misses and compiles the model, and
stores both; the second, a new pod (a fresh work folder), finds everything stored for
this host: a full hit, it restores the caches for the server and exits without
starting a rank or importing torch.
Then the sidecar starts and answers the readiness probe and /metrics, and hot-reloads
a bundle of the registry signed by the demo's own key (``demo-volume/keys``, made on
the first run, the only key the demo trusts), while an unsigned copy is refused.

Nothing is left in the system's temp folder: the demo and its ranks take
``demo-work/tmp`` as theirs (TMPDIR), where Inductor also puts what it writes outside
its cache folder (its precompiled C++ header, 155 MB, under
``<temp>/torchinductor_<user>``, whatever TORCHINDUCTOR_CACHE_DIR says).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from registry.bundles import bundle
from registry.storage.store import Store
from registry.trust import signing
from registry.trust.signing import SigningKey
from warmup.core import logs
from warmup.core.manifest import load_manifest
from warmup.core.services import Services, existing_volume
from warmup.core.settings import Settings

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
    "triton_warmup_rank_processes",
    "triton_warmup_model_ready",
    "triton_warmup_model_compiles",
)


# The demo's own: no command has defaults like these (a pod names its manifest and volume).
MANIFEST = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
VOLUME, WORK_DIR = Path("demo-volume"), Path("demo-work")


def main() -> int:
    # A fresh checkout has no ./demo-volume: the demo asks for it, as a user would with
    # --create-volume (a volume that is not there is otherwise an error).
    settings = Settings(
        device="cpu", create_volume=True, manifest=MANIFEST, volume=VOLUME, work_dir=WORK_DIR
    )
    settings = trusting_its_own_key(settings, existing_volume(settings) / "keys")
    logs.configure(settings.logs.format, level=30)  # the demo prints its own story
    manifest = load_manifest(settings.paths.manifest)
    shapes = sum(len(e.expand()) for e in manifest.entries)
    models = ", ".join(f"{m.name} at {m.count()} shapes" for m in manifest.models) or "none"
    print(
        f"manifest {settings.paths.manifest}: {shapes} kernel shapes, compiled models: {models}, "
        f"digest {manifest.digest()}; "
        f"volume {settings.paths.volume.resolve()}"
    )
    print(f"trust: {Services(settings).trust.describe()}")  # the demo's own: an entry point
    for label in (
        "first run (empty registry: misses are tuned)",
        "second run (a new pod: fresh work folder, same volume: a full hit)",
    ):
        print(f"\n== {label}", flush=True)
        shutil.rmtree(
            settings.paths.work_dir, ignore_errors=True
        )  # a new pod: only the volume stays
        use_temp_folder(settings.paths.work_dir / "tmp")
        started = time.monotonic()
        ready = run_pod(settings)  # prints its summary
        wall = time.monotonic() - started
        print(f"  wall time of this run, from its process's start to its exit: {wall:.1f} s")
        if not ready:
            return 1
    print("\n== the sidecar")
    from warmup.sidecar.server import Sidecar  # the pods' sidecar, in its own process

    for name in DEMO_BUNDLES:  # an earlier demo's: not scanned again at the start
        (settings.paths.bundle_dir / name).unlink(missing_ok=True)
    sidecar = Sidecar(settings)
    port = sidecar.start(host="127.0.0.1", port=0)
    try:
        code, body = _get(f"http://127.0.0.1:{port}/readyz")
        print(f"GET /readyz -> {code} {body}")
        _, text = _get(f"http://127.0.0.1:{port}/metrics")
        print("GET /metrics, the key lines (docs/metrics.md says what each counts):")
        for line in text.splitlines():
            if line.startswith(KEY_METRICS):
                print(f"  {line}")
        print("\n== signed bundles (hot reload)")
        hot_reload_signed(settings, port)
    finally:
        sidecar.stop()
    return 0


DEMO_BUNDLES = ("demo-unsigned.tgz", "demo-signed.tgz")


def run_pod(settings: Settings) -> bool:
    """``triton-warmup run`` in a process of its own, on the demo's ``settings``, as a
    pod's init container runs it (its time to ready counts from that process's start,
    not the demo's); whether it ended ready."""
    given = {
        "volume": settings.paths.volume,
        "work_dir": settings.paths.work_dir,
        "manifest": settings.paths.manifest,
        "device": settings.run.device,
        "trusted_keys": settings.trust.keys,
        "signing_key": settings.trust.signing_key,
    }
    env = {f"TRITON_WARMUP_{name.upper()}": str(value) for name, value in given.items() if value}
    done = subprocess.run([sys.executable, "-m", "warmup", "run"], env={**os.environ, **env})
    return done.returncode == 0


def trusting_its_own_key(settings: Settings, keys: Path) -> Settings:
    """``settings`` signing with the demo's key and trusting only it; the key pair is
    made in ``keys`` on the first run."""

    if not (keys / "demo.key").exists():
        signing.generate(keys, "demo")
    return settings.updated(trusted_keys=keys, signing_key=keys / "demo.key")


def hot_reload_signed(settings: Settings, port: int) -> None:
    """Drop an unsigned bundle of the registry, then the same signed, into the sidecar's
    bundle folder; print what the sidecar did with each."""

    assert settings.trust.signing_key is not None
    key = SigningKey.load(settings.trust.signing_key)
    entries = Store(settings.paths.registry_dir).entries()
    made = settings.paths.work_dir / "bundles"
    made.mkdir(parents=True, exist_ok=True)
    version = time.strftime("%Y%m%d%H%M%S")
    for file, signer in zip(DEMO_BUNDLES, (None, key), strict=True):
        path = made / file
        bundle.create(path, name="demo", version=version, entries=entries, signer=signer)
        expected = "rejected" if signer is None else "installed"
        before = _reloads(port, expected)
        shutil.copy(path, settings.paths.bundle_dir / file)
        deadline = time.monotonic() + 15.0
        while _reloads(port, expected) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        done = expected if _reloads(port, expected) > before else f"not {expected} within 15 s"
        by = f"signed by key {key.key_id}" if signer else "unsigned"
        print(f"{file} ({by}): {done}")


def _reloads(port: int, result: str) -> float:
    """The sidecar's count of bundles that ended as ``result``."""
    metric = f'triton_warmup_bundle_reloads_total{{result="{result}"}}'
    _, text = _get(f"http://127.0.0.1:{port}/metrics")
    found = [line.split()[-1] for line in text.splitlines() if line.startswith(metric)]
    return float(found[0]) if found else 0.0


def use_temp_folder(folder: Path) -> None:
    """Make ``folder`` the temp folder of this process and of those it starts."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(folder.resolve())  # read by the ranks' tempfile (and torch)
    tempfile.tempdir = None  # this process's: found again, from TMPDIR, at its next use


def compiled_mlp(device: Any) -> Any:
    """The demo's compiled model: a small MLP, ``torch.compile``d as a server would."""
    import torch  # torch loads on first use

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
