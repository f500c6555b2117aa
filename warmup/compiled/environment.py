"""Where torch.compile reads and writes its artifacts: the environment a rank or a
server sets so that Inductor works in the pod's restored cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmup.settings import Settings

CUDA_JIT_CACHE = "cuda-jit"  # the CUDA driver's JIT cache, inside the Inductor cache


def inductor_environment(settings: Settings) -> dict[str, str]:
    """What makes torch.compile in a rank (or a server) read and write its artifacts in
    the pod's Inductor cache, where they are restored and stored from: the folder, the
    FX graph and AOTAutograd caches on (whatever the torch build's default), and the CUDA
    driver's JIT cache inside it (PTX that torch's own kernels compile on a first call:
    0.2 to 0.7 s a shape on one H100, paid again in every new home folder). The driver
    reads ``CUDA_CACHE_PATH`` when CUDA starts: a server sets it in its environment."""
    folder = settings.inductor_cache_dir.resolve()
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(folder),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "CUDA_CACHE_PATH": str(folder / CUDA_JIT_CACHE),
    }
