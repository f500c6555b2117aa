"""Shapes a compiled model met under traffic that its manifest does not declare: learned
by one pod, warmed by every pod after it.

A new shape costs a Dynamo trace in every new process, whatever the caches hold, so the
caches alone cannot keep it off the request path: the shape itself must be warmed.

1. The serving process records the dims of a call that compiled after it was warm
   (:class:`Recorder`), in a file of its own in the serving-metrics folder
   (``learned-<rank>-<pid>.json``).
2. The sidecar's harvest merges those files into the volume (:func:`merge`:
   ``<volume>/learned/<model>.json``) and saves the model's artifacts again.
3. The next pod's warmup warms the learned dims after the declared ones, and
   ``Serving.model`` primes them (:func:`learned_dims`): rank 0's list on every rank,
   a shape that fails skipped (a bonus, never fatal).

The model's key stays the declared one's: the index saved after the harvest holds the
learned shapes' artifacts too. Nothing read is trusted: dims must name exactly the
model's dims, each an int from 1 to the largest the manifest declares for it; at most
:data:`MAX_LEARNED` a model. Two harvests merging at once may lose one's new dims (no
lock across pods): they are learned again at their next compile.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry import atomic
from registry.patterns import MODEL_NAME
from warmup.manifest import Manifest, ModelEntry

if TYPE_CHECKING:
    from warmup.collectives import Lockstep

log = logging.getLogger(__name__)
MAX_LEARNED = 64  # learned dims a model (each one more shape to warm at start)
MAX_FILE_BYTES = 2**20
PREFIX = "learned-"


def call_dims(entry: ModelEntry, args: Sequence[Any]) -> dict[str, int] | None:
    """The dims of a call, read from its inputs' shapes as the manifest names them; None
    when the call does not fit the declared inputs (another signature, a non-tensor)."""
    found: dict[str, int] = {}
    if len(args) < len(entry.inputs):
        return None
    for spec, arg in zip(entry.inputs, args, strict=False):
        shape = getattr(arg, "shape", None)
        if shape is None or len(shape) != len(spec.shape):
            return None
        for want, size in zip(spec.shape, shape, strict=True):
            if isinstance(want, str):
                if found.setdefault(want, int(size)) != int(size):
                    return None
            elif want != int(size):
                return None
    return found if set(found) == set(entry.dims) else None


def kept(
    entry: ModelEntry, candidates: Iterable[Any], held: Sequence[Any] = ()
) -> list[dict[str, int]]:
    """The ``candidates`` that are learned dims of ``entry``, each once and in order:
    naming exactly its dims, each a size from 1 to the largest the manifest declares for
    it (a request far past them is no shape to warm on every pod: declare it), neither
    declared nor in ``held``."""
    declared = entry.expand()
    largest = {name: max(d[name] for d in declared) for name in entry.dims}
    found: list[dict[str, int]] = []
    for dims in candidates:
        fits = isinstance(dims, dict) and set(dims) == set(entry.dims)
        sizes = fits and all(type(v) is int and 1 <= v <= largest[k] for k, v in dims.items())
        if sizes and dims not in declared and dims not in held and dims not in found:
            found.append(dims)
    return found


class Recorder:
    """This serving process's learned dims, kept in its file in ``folder``."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.path = folder / f"{PREFIX}{rank}-{os.getpid()}.json"
        self.models: dict[str, list[dict[str, int]]] = {}
        self._lock = threading.Lock()

    def record(self, entry: ModelEntry, args: Sequence[Any]) -> None:
        """Record the dims of a call that compiled (``args``: its inputs); never raises:
        the request it follows has its answer already."""
        try:
            dims = call_dims(entry, args)
            if dims is not None:
                self.add(entry, dims)
        except Exception as e:
            log.warning("model %s: a call's shape not recorded: %s", entry.name, e)

    def add(self, entry: ModelEntry, dims: dict[str, int]) -> bool:
        """Record ``dims`` of ``entry`` unless declared, known, out of range or past the
        bound; whether the file changed (written atomically)."""
        with self._lock:
            held = self.models.setdefault(entry.name, [])
            if not kept(entry, [dims], held) or len(held) >= MAX_LEARNED:
                return False
            held.append(dict(dims))
            try:
                atomic.write_json(self.path, {"models": self.models})
            except OSError as e:
                log.warning("learned shapes not written to %s: %s", self.path, e)
                return False
        log.info("model %s: learned dims %s (the next pods warm them)", entry.name, dims)
        return True


def merge(folder: Path, root: Path, manifest: Manifest) -> int:
    """Merge every serving process's learned dims in ``folder`` into ``root`` (the
    volume's ``learned``), for the models ``manifest`` declares; how many are new."""
    found: dict[str, list[dict[str, int]]] = {}
    for path in sorted(folder.glob(f"{PREFIX}*.json")) if folder.is_dir() else []:
        for name, dims in _read(path).items():
            found.setdefault(name, []).extend(dims)
    new = 0
    for entry in manifest.models:
        if entry.name not in found or not MODEL_NAME.fullmatch(entry.name):
            continue
        held = learned_dims(root, entry)
        fresh = kept(entry, found[entry.name], held)[: MAX_LEARNED - len(held)]
        if fresh:
            atomic.write_json(root / f"{entry.name}.json", {"dims": held + fresh})
            new += len(fresh)
    return new


def learned_dims(root: Path, entry: ModelEntry) -> list[dict[str, int]]:
    """The learned dims of ``entry`` in ``root`` that are valid and not declared."""
    path = root / f"{entry.name}.json"
    if not path.is_file():
        return []
    try:
        data = atomic.loads(atomic.read_bounded(path, MAX_FILE_BYTES))
        dims = data["dims"] if isinstance(data, dict) else None
    except (OSError, ValueError, KeyError) as e:
        log.warning("learned shapes of %s unreadable, ignored: %s", entry.name, e)
        return []
    return kept(entry, dims if isinstance(dims, list) else [])[:MAX_LEARNED]


def _read(path: Path) -> dict[str, list[Any]]:
    try:
        data = atomic.loads(atomic.read_bounded(path, MAX_FILE_BYTES))
        models = data.get("models") if isinstance(data, dict) else None
    except (OSError, ValueError) as e:
        log.warning("learned shapes in %s unreadable, skipped: %s", path.name, e)
        return {}
    if not isinstance(models, dict):
        return {}
    return {k: v for k, v in models.items() if isinstance(k, str) and isinstance(v, list)}


def shared_dims(steps: Lockstep, root: Path, entry: ModelEntry) -> list[dict[str, int]]:
    """:func:`learned_dims` as rank 0 reads them, on every rank (a harvest may write the
    file between two ranks' reads), so that every rank warms the same shapes."""
    from warmup.collectives import LearnedDims

    mine = LearnedDims(dims=learned_dims(root, entry)) if steps.leader else None
    return steps.share(mine, LearnedDims, what=f"model {entry.name}: learned shapes").dims
