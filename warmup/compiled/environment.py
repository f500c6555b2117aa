"""Where torch.compile reads and writes its artifacts: the environment a rank or a
server sets so that Inductor works in the pod's restored cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmup.settings import Settings

CUDA_JIT_CACHE = "cuda-jit"  # the CUDA driver's JIT cache, inside the Inductor cache
# Off in the ranks and the server alike (it enters the FX graph's cache key): on an FX
# graph cache hit, torch 2.11's static launcher path drops the coordinate-descent winners
# (pytorch issue 172819) and looks the tuned configs up under the compiling process's own
# paths, so a max-autotune server benchmarked again on a fully restored cache (30-36
# benchmarks for 3 graphs on one H200); with it off, none, at the same speed.
STATIC_LAUNCHER = "TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"


def inductor_environment(settings: Settings) -> dict[str, str]:
    """What makes torch.compile in a rank (or a server) read and write its artifacts in
    the pod's Inductor cache, where they are restored and stored from: the folder, the
    FX graph and AOTAutograd caches on (whatever the torch build's default), Inductor's
    static CUDA launcher off (:data:`STATIC_LAUNCHER`), and the CUDA
    driver's JIT cache inside it (PTX that torch's own kernels compile on a first call:
    0.2 to 0.7 s a shape on one H100, paid again in every new home folder). The driver
    reads ``CUDA_CACHE_PATH`` when CUDA starts: a server sets it in its environment."""
    folder = settings.inductor_cache_dir.resolve()
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(folder),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        STATIC_LAUNCHER: "0",
        "CUDA_CACHE_PATH": str(folder / CUDA_JIT_CACHE),
    }
