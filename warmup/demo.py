"""``make demo``: the registry's part of the story on CPU, with real work at every step.

1. Pod A tunes three matmul shapes (Triton interpreter, wall-clock timing, each config
   checked against a float64 reference) under a file lock on the volume, stores the
   winners, compiles them for sm90 (no GPU needed) and saves the compile cache.
2. The store and the cache are packed into a bundle, which is verified.
3. Pod B restores the compile cache into its own folder (Triton's lookup hits there),
   installs the bundle and finds every shape.
A second run finds everything stored: no tuning.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

from registry import Entry, KernelConfig, Measurement, Store, bundle, lock, triton_cache
from registry.fingerprint import Fingerprint, detect, kernel_source_hash
from registry.locks import backend_from_url
from warmup.platform import use_interpreter
from warmup.settings import Settings

SHAPES = [(64, 64, 64), (96, 80, 48), (128, 64, 96)]
SPACE = [
    KernelConfig.make(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 2}, num_warps=4, num_stages=2
    )
    for bm, bn, bk in ((16, 16, 16), (32, 32, 16), (32, 32, 32), (16, 32, 32))
]
REPEATS = 3
WORK = Path("demo-work")


def main() -> int:
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    settings = Settings()
    use_interpreter()
    from kernels import matmul

    fingerprint = detect(kernel_source_hash(matmul._matmul_kernel))
    store = Store(settings.paths.registry)
    print(
        f"volume {settings.volume.resolve()}  platform {fingerprint.gpu_slug()}  "
        f"torch {fingerprint.software.torch}  triton {fingerprint.software.triton}"
    )
    print("\n[1] pod A: warm every shape (tune misses under the volume's lock)")
    for m, n, k in SHAPES:
        _warm_shape(matmul, store, fingerprint, settings, (m, n, k))
    winners = sorted({e.best for e in store.entries() if e.kernel == matmul.NAME}, key=str)
    cache_a = WORK / "pod-a" / "triton-cache"
    written = _compile_ahead(cache_a, winners)
    saved = triton_cache.save(cache_a, settings.paths.triton_cache)
    print(
        f"    compiled {len(winners)} distinct winning configs for sm90: {written} new artifacts; "
        f"saved to volume: {saved.copied} new, {saved.present} already there"
    )

    print("\n[2] bundle the volume")
    out = settings.paths.bundles / "demo.tgz"
    manifest = bundle.create(
        out,
        name="demo",
        version=time.strftime("%Y%m%d%H%M%S"),
        entries=store.entries(),
        triton_cache=settings.paths.triton_cache,
    )
    checked = bundle.verify(out)
    print(f"    {out}: {len(manifest['members'])} members, sha256 {checked.sha256[:16]}, verified")

    print("\n[3] pod B: restore the compile cache, install the bundle, look up every shape")
    cache_b = WORK / "pod-b" / "triton-cache"
    restored = triton_cache.restore(settings.paths.triton_cache, cache_b)
    rewritten = _compile_ahead(cache_b, winners)
    print(
        f"    restored {restored.copied} files, relocated {restored.relocated} groups; "
        f"recompiling the winners wrote {rewritten} files "
        f"({'Triton cache HIT' if rewritten == 0 else 'MISS'})"
    )
    store_b = Store(WORK / "pod-b" / "registry")
    info = bundle.install(out, store_b, expect=fingerprint, triton_cache=cache_b)
    hits = sum(store_b.lookup(matmul.NAME, _key(s), fingerprint) is not None for s in SHAPES)
    print(f"    installed as {info['id']}: {hits}/{len(SHAPES)} shapes hit in pod B's registry")

    print("\n[4] triton-warmup registry ls")
    sys.stdout.flush()
    from warmup.cli import main as cli

    return cli(["registry", "--store", str(settings.paths.registry), "ls"])


def _key(shape: tuple[int, int, int]) -> dict[str, object]:
    m, n, k = shape
    return {"M": m, "N": n, "K": k, "dtype": "fp32"}


def _warm_shape(
    matmul,
    store: Store,
    fingerprint: Fingerprint,
    settings: Settings,  # type: ignore[no-untyped-def]
    shape: tuple[int, int, int],
) -> None:
    key = _key(shape)
    if (hit := store.lookup(matmul.NAME, key, fingerprint)) is not None:
        print(f"    {key}: HIT  {hit.best.label()}  (tuned {hit.created} on {hit.host})")
        return
    backend = backend_from_url(settings.lock_location)
    with lock(
        f"{matmul.NAME}/{json.dumps(key, sort_keys=True)}",
        ttl=settings.lock_ttl_s,
        timeout=settings.lock_timeout_s,
        backend=backend,
    ):
        if (hit := store.lookup(matmul.NAME, key, fingerprint)) is not None:
            print(f"    {key}: HIT after waiting for the lock")
            return
        started = time.perf_counter()
        results = [_measure(matmul, shape, config) for config in SPACE]
        best = min(results, key=lambda r: r.median_ms)
        entry = Entry.make(
            matmul.NAME,
            key,
            fingerprint,
            best.config,
            measurements=tuple(results),
            tuning_seconds=time.perf_counter() - started,
            source="tuned",
        )
        store.put(entry)
    print(
        f"    {key}: MISS -> tuned {len(SPACE)} configs in {entry.tuning_seconds:.1f} s, "
        f"best {best.config.label()} at {best.median_ms:.1f} ms (interpreter)"
    )


def _measure(matmul, shape: tuple[int, int, int], config: KernelConfig) -> Measurement:  # type: ignore[no-untyped-def]
    import torch

    m, n, k = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.full((m, n), float("nan"))  # poisoned: a config that skips tiles fails
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        matmul.matmul(a, b, config, out=out)
        times.append((time.perf_counter() - started) * 1e3)
    if not torch.allclose(out, matmul.reference(a, b), atol=1e-3, rtol=1e-3):
        return Measurement(config, error="output differs from the float64 reference")
    times.sort()
    return Measurement(config, statistics.median(times), times[0], times[-1])


def _compile_ahead(cache_dir: Path, configs: list[KernelConfig]) -> int:
    """Compile ``configs`` for sm90 in a child process (no interpreter there); returns the
    number of files it wrote into ``cache_dir``: 0 means every compile hit the cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir.resolve()), TRITON_DEFAULT_FP_FUSION="1")
    payload = json.dumps([c.to_json() for c in configs])
    done = subprocess.run(
        [sys.executable, "-m", "warmup.demo", "compile", payload],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ahead-of-time compile failed:\n{done.stderr[-2000:]}")
    return int(done.stdout.strip().splitlines()[-1])


def _compile_child(payload: str) -> int:
    from triton.backends.compiler import GPUTarget

    from kernels import matmul

    cache = Path(os.environ["TRITON_CACHE_DIR"])
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    for config in json.loads(payload):
        matmul.compile_ahead(KernelConfig.from_json(config), "fp32", GPUTarget("cuda", 90, 32))
    after = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    print(sum(1 for p, t in after.items() if before.get(p) != t))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["compile"]:
        sys.exit(_compile_child(sys.argv[2]))
    sys.exit(main())
