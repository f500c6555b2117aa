"""Bundle versions: in a store, each bundle name only moves forward (no rollback, no
replay), as TUF's monotonic versions do.

A bundle's MANIFEST.json, which its signature covers, carries ``sequence``: a whole
number that grows with each bundle of its name (``bundle create --sequence N``; by
default the creation time in milliseconds, so bundles made one after the other are in
order without anyone setting it). ``version`` stays the human label. A bundle made
before sequences reads as 0.

An install refuses (:class:`BundleRejected`) a bundle whose sequence is lower than the
highest installed for its name, or equal to it with another manifest (a replay of the
name's slot with other content), unless ``allow_downgrade``: then it is logged at
WARNING and named in the generation's record (``allowed_downgrade``). Bundles that all
read as 0 claim no order: they replace each other as before, but once a bundle of the
name with a sequence is installed, none of them goes in again.

Only a sequence a trusted key vouched for moves the mark (the bundle's signature verified
against a key the trust holds): an unsigned bundle, taken where the trust allows one (a
bundle of tuned configs alone with no key configured, or the opt-out), is checked
against the mark but never raises it, since anyone could have written its sequence. An
install with ``allow_downgrade`` sets the mark to its own sequence: the name goes on from
what the operator chose (a sequence written too large by mistake is undone that way).

The highest installed sequence of a name is the store's high-water mark,
:data:`MARKS_FILE` in its root: raised at each vouched install, under the store's write
lock, written atomically; never lowered but by an allowed downgrade, so it outlives the
garbage collection of old generations, a rollback and a restart of the pod. Where the
file holds no mark of a name (it was lost, or cannot be read), the highest that a kept
generation's record of a vouched install says stands in. ``registry
rollback`` is the explicit way back: it changes no mark, so the bundle it undid may be
installed again, an older one still not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.bundles.reader import MAX_SEQUENCE, Bundle
from registry.core import atomic
from registry.core.errors import BundleRejected
from registry.storage.generations import Generation
from registry.storage.store import Store

log = logging.getLogger(__name__)
MARKS_FILE = "BUNDLE_VERSIONS.json"
MAX_MARKS_BYTES = 4 * 2**20  # ~100 bytes a name: tens of thousands of names
OVERRIDE = "pass --allow-downgrade (allow_downgrade=True) to install it anyway"


@dataclass(frozen=True)
class Mark:
    """The highest sequence installed of one bundle name, and the manifest installed at it."""

    sequence: int
    manifest_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"sequence": self.sequence, "manifest_sha256": self.manifest_sha256}


def highest(store: Store) -> dict[str, Mark]:
    """Each bundle name's highest installed sequence: the marks file's, or for a name it
    holds none of, the highest a kept generation's record of a vouched install says."""
    recorded: dict[str, Mark] = {}
    for generation in store.generations():  # oldest first: at a tie the latest wins
        found = _recorded(generation)
        if found is not None:
            name, mark = found
            if name not in recorded or mark.sequence >= recorded[name].sequence:
                recorded[name] = mark
    return {**recorded, **read_marks(store.root)}


def admit(store: Store, bundle: Bundle, *, allow_downgrade: bool) -> dict[str, Any]:
    """Check ``bundle`` against the highest installed sequence of its name; call it under
    the store's write lock. :class:`BundleRejected` if it is older, or a replay of the
    same sequence with other content, unless ``allow_downgrade``; then what the
    generation's record keeps of the override ({} when none was needed)."""
    mark = highest(store).get(bundle.name)
    if mark is None:
        return {}
    fault = _fault(bundle, mark)
    if fault is None:
        return {}
    if not allow_downgrade:
        raise BundleRejected(str(bundle.path), f"{fault}; {OVERRIDE}")
    log.warning("installing %s although %s: --allow-downgrade", bundle.path, fault)
    return {"allowed_downgrade": {"sequence": bundle.sequence, "installed": mark.to_json()}}


def _fault(bundle: Bundle, mark: Mark) -> str | None:
    """Why ``bundle`` may not follow ``mark``, or None when it may."""
    name, sequence = bundle.name, bundle.sequence
    if sequence < mark.sequence:
        return (
            f"bundle '{name}' sequence {sequence} is older than sequence {mark.sequence} "
            "installed (roll back with 'registry rollback')"
        )
    same = mark.manifest_sha256 == bundle.manifest_sha256
    if sequence == mark.sequence and sequence > 0 and not same:
        return (
            f"bundle '{name}' sequence {sequence} is installed already with other content "
            f"(manifest sha256 {mark.manifest_sha256[:16]}, this one "
            f"{bundle.manifest_sha256[:16]}): a replay of its slot"
        )
    return None


def raise_mark(store: Store, bundle: Bundle, *, downgrade: bool = False) -> None:
    """Record ``bundle``'s sequence as its name's high-water mark if a trusted key vouched
    for it, never lowering it unless ``downgrade`` (the operator's override); call it
    under the store's write lock, before the install's swap (a swap that fails afterwards
    leaves a mark the same bundle passes again)."""
    if not bundle.vouched:
        return  # anyone could have written an unsigned bundle's sequence
    marks = highest(store)
    current = marks.get(bundle.name)
    if current is not None and current.sequence > bundle.sequence and not downgrade:
        return
    marks[bundle.name] = Mark(bundle.sequence, bundle.manifest_sha256)
    store.root.mkdir(parents=True, exist_ok=True)
    body = {name: mark.to_json() for name, mark in sorted(marks.items())}
    atomic.write_json(store.root / MARKS_FILE, {"bundles": body})


def read_marks(root: Path) -> dict[str, Mark]:
    """The marks file of the store at ``root``; {} when there is none. One that cannot be
    read is logged and left out: the records still count, and the next install rewrites it."""
    path = root / MARKS_FILE
    try:
        data = atomic.loads(atomic.read_bounded(path, MAX_MARKS_BYTES))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.error("bundle versions %s unreadable, the kept records stand alone: %s", path, e)
        return {}
    body = data.get("bundles") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        log.error("bundle versions %s hold no 'bundles' object: the kept records stand alone", path)
        return {}
    return {name: mark for name, item in body.items() if (mark := _mark(item)) is not None}


def _recorded(generation: Generation) -> tuple[str, Mark] | None:
    """The bundle name and mark the record of a vouched install (or of its rollback)
    names, if any."""
    about = generation.bundle
    if about.get("vouched") is not True:
        return None
    name = about.get("name")
    mark = _mark({"sequence": about.get("sequence", 0), **about})
    if not isinstance(name, str) or mark is None:
        return None
    return name, mark


def _mark(item: Mapping[str, Any] | Any) -> Mark | None:
    if not isinstance(item, Mapping):
        return None
    sequence, sha = item.get("sequence"), item.get("manifest_sha256")
    if not isinstance(sequence, int) or isinstance(sequence, bool) or not isinstance(sha, str):
        return None
    return Mark(sequence, sha) if 0 <= sequence <= MAX_SEQUENCE else None
