"""What the run's tests share: this process set up as a rank that torchrun started."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from warmup.core.settings import Settings


@pytest.fixture
def torchrun_rank(monkeypatch: pytest.MonkeyPatch) -> Callable[[Settings, int], None]:
    """Set this process up as torchrun's rank 0 of ``world`` for ``settings`` (what
    ``warmup.run.session.main`` reads); what the rank sets is put back after the test."""

    def rank(settings: Settings, world: int) -> None:
        for name, value in {
            "RANK": "0",
            "WORLD_SIZE": str(world),
            "TRITON_WARMUP_VOLUME": str(settings.paths.volume),
            "TRITON_WARMUP_WORK_DIR": str(settings.paths.work_dir),
            "TRITON_WARMUP_MANIFEST": str(settings.paths.manifest),
            "TRITON_WARMUP_DEVICE": "cpu",
        }.items():
            monkeypatch.setenv(name, value)
        for name in ("TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "CUDA_CACHE_PATH"):
            monkeypatch.setenv(name, "")  # put back after the rank sets them
        for name in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE"):
            monkeypatch.setenv(name, "")
        monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "")
        monkeypatch.setenv("TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER", "")

    return rank
