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
:data:`MAX_LEARNED` a model. The harvest reads the files in bounded memory whatever they
hold: at most :data:`MAX_FILES` of them (the newest), :data:`MAX_READ_BYTES` together,
each bounded in bytes and JSON values before it is parsed, and filtered as it is read
(only declared models' valid dims kept, at most :data:`MAX_LEARNED` a model). Two
harvests merging at once may lose one's new dims (no lock across pods): they are learned
again at their next compile.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.core import atomic
from registry.core.patterns import MODEL_NAME
from warmup.core.collectives import LearnedDims
from warmup.core.manifest import Manifest, ModelEntry

if TYPE_CHECKING:
    from warmup.core.collectives import Lockstep

log = logging.getLogger(__name__)
MAX_LEARNED = 64  # learned dims a model (each one more shape to warm at start)
MAX_FILE_BYTES = 2**20
MAX_FILE_VALUES = 2**16  # JSON values of one file, counted before parsing: ~5 a dims
MAX_FILES = 256  # the newest serving processes' files one merge reads (one a rank and pid)
MAX_READ_BYTES = 32 * 2**20  # the files one merge reads, together
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
    entry: ModelEntry,
    candidates: Iterable[Any],
    held: Sequence[Any] = (),
    *,
    most: int | None = None,
) -> list[dict[str, int]]:
    """The ``candidates`` that are learned dims of ``entry``, each once and in order:
    naming exactly its dims, each a size from 1 to the largest the manifest declares for
    it (a request far past them is no shape to warm on every pod: declare it), neither
    declared nor in ``held``; the first ``most`` of them (the rest are not looked at)."""
    declared = entry.expand()
    largest = {name: max(d[name] for d in declared) for name in entry.dims}
    found: list[dict[str, int]] = []
    for dims in candidates:
        if most is not None and len(found) >= most:
            break
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
    """Merge the serving processes' learned dims in ``folder`` into ``root`` (the
    volume's ``learned``), for the models ``manifest`` declares; how many are new. Each
    file is filtered as it is read: what is kept is at most :data:`MAX_LEARNED` a model."""
    models = {e.name: e for e in manifest.models if MODEL_NAME.fullmatch(e.name)}
    held: dict[str, list[dict[str, int]]] = {}  # the volume's, read at a model's first dims
    fresh: dict[str, list[dict[str, int]]] = {}
    left = MAX_READ_BYTES
    for path in _newest(folder):
        if left <= 0:
            log.warning(
                "learned shapes: %s and the files after it not read: %d bytes read",
                path,
                MAX_READ_BYTES,
            )
            break
        read, found = _read(path, models, min(MAX_FILE_BYTES, left))
        left -= read
        for name, candidates in found.items():
            entry = models[name]
            before = held.setdefault(name, learned_dims(root, entry))
            mine = fresh.setdefault(name, [])
            room = MAX_LEARNED - len(before) - len(mine)
            mine += kept(entry, candidates, before + mine, most=room) if room > 0 else []
    new = 0
    for name, dims in fresh.items():
        if dims:
            atomic.write_json(root / f"{name}.json", {"dims": held[name] + dims})
            new += len(dims)
    return new


def _newest(folder: Path) -> list[Path]:
    """The newest :data:`MAX_FILES` learned files in ``folder``, in name order (a folder
    of millions of names is listed, never held)."""
    try:
        listing = os.scandir(folder)
    except OSError:  # no folder (yet): nothing learned
        return []
    with listing:
        named = (e for e in listing if e.name.startswith(PREFIX) and e.name.endswith(".json"))
        newest = heapq.nlargest(MAX_FILES, ((_mtime(e), e.name) for e in named))
    return [folder / name for name in sorted(name for _, name in newest)]


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def learned_dims(root: Path, entry: ModelEntry) -> list[dict[str, int]]:
    """The learned dims of ``entry`` in ``root`` that are valid and not declared."""
    path = root / f"{entry.name}.json"
    if not path.is_file():
        return []
    try:
        data = _parsed(path, MAX_FILE_BYTES)
        dims = data["dims"] if isinstance(data, dict) else None
    except (OSError, ValueError, KeyError) as e:
        log.warning("learned shapes of %s unreadable, ignored: %s", entry.name, e)
        return []
    return kept(entry, dims if isinstance(dims, list) else [])[:MAX_LEARNED]


def _read(
    path: Path, models: Mapping[str, ModelEntry], limit: int
) -> tuple[int, dict[str, list[Any]]]:
    """The bytes read of one serving process's file (at most ``limit``) and its lists of
    candidate dims for the declared ``models`` (the rest is dropped as read)."""
    try:
        raw = atomic.read_bounded(path, limit)
        data = _parsed(path, limit, raw)
        found = data.get("models") if isinstance(data, dict) else None
    except (OSError, ValueError) as e:
        log.warning("learned shapes in %s unreadable, skipped: %s", path.name, e)
        return 0, {}
    if not isinstance(found, dict):
        return len(raw), {}
    return len(raw), {k: v for k, v in found.items() if k in models and isinstance(v, list)}


def _parsed(path: Path, limit: int, raw: bytes | None = None) -> Any:
    """A learned file's JSON: bounded in bytes (``limit``) and values before it is parsed."""
    data = atomic.read_bounded(path, limit) if raw is None else raw
    values = atomic.json_values(data)
    if values > MAX_FILE_VALUES:
        raise ValueError(f"{values} JSON values; limit {MAX_FILE_VALUES}")
    return atomic.loads(data)


def shared_dims(steps: Lockstep, root: Path, entry: ModelEntry) -> list[dict[str, int]]:
    """:func:`learned_dims` as rank 0 reads them, on every rank (a harvest may write the
    file between two ranks' reads), so that every rank warms the same shapes."""

    mine = LearnedDims(dims=learned_dims(root, entry)) if steps.leader else None
    return steps.share(mine, LearnedDims, what=f"model {entry.name}: learned shapes").dims
