"""The benches' model weights, taken as a server takes its weights (issue [5.2]): a file
made once per run (seeded, so every process and every rank of a run reads the same
weights), loaded with ``torch.load(mmap=True, weights_only=True)`` into a module made on
the ``meta`` device (``load_state_dict(assign=True)``), so that a model's build measures
loading, not ``torch.manual_seed`` and an initialisation on the CPU.

``bench/pod_ready.py`` makes each model's file in the run's folder before any pod
(``BENCH_WEIGHTS_DIR``, not counted); elsewhere the first build makes it in the
temporary folder's ``triton-warmup-bench-weights``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "BENCH_WEIGHTS_DIR"  # where the files are: the run's folder, as pod_ready sets it
DEFAULT = "triton-warmup-bench-weights"  # under the temporary folder, where ENV is unset


def folder() -> Path:
    """The folder of the weight files (``BENCH_WEIGHTS_DIR``, else a temporary one's)."""
    return Path(os.environ.get(ENV) or Path(tempfile.gettempdir()) / DEFAULT)


def weights_file(name: str, dtype: Any, make: Callable[[], dict[str, Any]]) -> Path:
    """The weight file of ``name`` in ``dtype`` (a torch dtype), ``make()``'s state dict
    written there first if it is not (atomically: ranks and pods may race, and write
    the same seeded weights)."""
    import torch  # a bench's driver that only names the file need not load torch

    dtype_name = str(dtype).removeprefix("torch.")
    path = folder() / f"{name}-{dtype_name}.pt"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {key: value.to(dtype).contiguous() for key, value in make().items()}
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            torch.save(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def load_into(
    module: Any,
    path: Path,
    device: Any,
    select: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Any:
    """``module`` (made on the ``meta`` device) given the weights of ``path`` on
    ``device``: read through a memory map, ``select`` (a rank's slices) applied before
    anything is copied, every tensor assigned, none left on ``meta``; in eval mode."""
    import torch  # as above

    state = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    if select is not None:
        state = select(state)
    state = {key: value.to(device).contiguous() for key, value in state.items()}
    module.load_state_dict(state, assign=True, strict=True)
    return module.eval()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.model_weights MODEL DEVICE``: the weight file of a bench model
    (``bench.compiled_models.make_weights``) made in :func:`folder`; its path printed."""
    import argparse

    from bench.compiled_models import make_weights  # the models import this module

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model")
    parser.add_argument("device", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    print(make_weights(args.model, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
