"""Where torch.compile reads and writes its artifacts: the environment a rank or a
server sets so that Inductor works in the pod's restored cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmup.core.settings import Settings

CUDA_JIT_CACHE = "cuda-jit"  # the CUDA driver's JIT cache, inside the Inductor cache
# Inductor's static CUDA launcher enters the FX graph's cache key: the ranks and the server
# set it alike (``Settings.static_launcher``), whatever their environments hold. With it on,
# torch before 2.12 drops max-autotune's coordinate-descent winners on an FX-graph cache hit
# (pytorch issue 172819), which ``warmup.compiled.coordesc`` mends. With it off, Triton's
# cache keys of Inductor's kernels differ between the process that compiled a graph and the
# ones that load it from the cache (torch 2.11, Triton 3.6: 8-15 kernels compiled again,
# 3-5 s, in every first load of a fleet's artifacts).
STATIC_LAUNCHER = "TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"


def inductor_environment(settings: Settings) -> dict[str, str]:
    """What makes torch.compile in a rank (or a server) read and write its artifacts in
    the pod's Inductor cache, where they are restored and stored from: the folder, the
    FX graph and AOTAutograd caches on (whatever the torch build's default), Inductor's
    static CUDA launcher as :data:`STATIC_LAUNCHER` says, and the CUDA driver's JIT cache
    inside it (PTX that torch's own kernels compile on a first call: 0.2 to 0.7 s a shape
    on one H100, paid again in every new home folder). The driver reads
    ``CUDA_CACHE_PATH`` when CUDA starts: a server sets it in its environment."""
    folder = settings.folders.inductor_cache_dir.resolve()
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(folder),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        STATIC_LAUNCHER: "1" if settings.models.static_launcher == "on" else "0",
        "CUDA_CACHE_PATH": str(folder / CUDA_JIT_CACHE),
    }
