"""A cache family's files in a bundle: the part a family contributes under its own folder
(``triton-cache/``, ``inductor/``, ``caches/``), and the staging of its files on install.

``registry.bundles.bundle`` reads and writes the archive, its manifest, its signature and the
registry's entries; for every other member it asks the family whose :class:`BundlePart`
owns the member's folder (``registry.families``), and names none:

- :meth:`BundlePart.pack`: the members ``bundle create`` takes from the family's folder;
- :meth:`BundlePart.limit`: a listed member's name checked, and the most bytes it may hold;
- :meth:`BundlePart.reader`: a :class:`PartReader` that checks each member as the stream
  brings it (staging it on install), then the part as a whole;
- after the store's swap, :meth:`PartReader.commit` moves the staged files in;
  :meth:`BundlePart.undo` puts back what an install replaced, on rollback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.core.fingerprint import Fingerprint
from registry.families.staging import Stage
from registry.storage.generations import Record

if TYPE_CHECKING:
    from registry.bundles.bundle import Limits

log = logging.getLogger(__name__)
Check = Callable[[str, Fingerprint], None]  # an entry's or index's fingerprint, checked
Hashed = Callable[[str, str, Iterator[bytes]], Iterator[bytes]]  # a member's pieces, checked


@dataclass
class Packed:
    """What ``bundle create`` takes from a family: member name -> file, and fingerprints."""

    members: dict[str, Path] = field(default_factory=dict)
    fingerprints: list[Fingerprint] = field(default_factory=list)
    indexes: int = 0


@dataclass(frozen=True)
class Held:
    """What a verified bundle holds of one family: its files and, of a keyed family,
    its indexes (names relative to the family's folder; the bytes stay on disk)."""

    files: list[str] = field(default_factory=list)
    indexes: list[str] = field(default_factory=list)


def keep(stage: Stage | None, label: str, rel: str, hashed: Iterator[bytes]) -> None:
    """``hashed`` written to ``stage`` at ``rel``, or only read through (verify)."""
    if stage is None:
        for _ in hashed:  # verify only: hash and drop
            pass
    else:
        stage.write(label, rel, hashed)


class PartReader:
    """One family's members of one bundle, checked as the stream brings them."""

    def __init__(
        self,
        part: BundlePart,
        label: str,
        limits: Limits,
        stage: Stage | None,
        budget: Any = None,
    ) -> None:
        self.part, self.label, self.limits, self.stage = part, label, limits, stage
        self.budget = budget  # what the whole bundle may restore, shared by its parts
        self.files: list[str] = []  # the members read, relative to the part's folder
        self.indexes: list[str] = []  # of a keyed family: its indexes, apart from files
        self.digests: dict[str, str] = {}  # fingerprint digest -> a member with it
        self.listed: Mapping[str, tuple[str, int]] = {}
        self.hashed: Hashed = lambda name, sha, chunks: chunks
        self.check: Check | None = None

    def begin(
        self, listed: Mapping[str, tuple[str, int]], hashed: Hashed, check: Check | None
    ) -> None:
        """Once MANIFEST.json is read: the bundle's members as it lists them, how a
        member's pieces are hashed (a mismatch rejects after the last), and the
        fingerprint check of an install (None: none)."""
        self.listed, self.hashed, self.check = listed, hashed, check

    def read(self, name: str, sha: str, data: Iterator[bytes]) -> None:
        """One member: its bytes hashed on the way, kept in the stage on install."""
        rel = name.removeprefix(self.part.prefix)
        keep(self.stage, self.label, rel, self.hashed(name, sha, data))
        self.files.append(rel)

    def finish(self) -> None:
        """After the last member: what the part as a whole must hold (nothing here)."""

    def before_seal(self) -> dict[str, Any]:
        """What the new generation's record keeps to undo this install (nothing here)."""
        return {}

    def commit(self) -> None:
        """After the swap: the staged files into the family's folder."""
        if self.stage is not None:
            self.stage.commit(self.files)

    def held(self) -> Held:
        return Held(list(self.files), list(self.indexes))

    def record(self) -> dict[str, int]:
        """How many of what it installed, for the generation's record."""
        return {self.part.counted: len(self.files)} if self.part.counted else {}


class BundlePart:
    """A family's folder in a bundle. ``prefix``: its members' folder (``name/``);
    ``what``: how messages call the family's files; ``counted``: the record's key for
    how many it installed; ``carries_code``: its files are run (imported, unpickled,
    loaded), so an unsigned bundle holding any is refused unless unsigned code is allowed
    (:class:`registry.trust.signing.Trust`)."""

    prefix = ""
    what = "artifacts"
    counted = ""
    carries_code = True
    option = ""  # how callers name its folder: "cache", "inductor"

    def owns(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def pack(self, root: Path, *, only: str | None = None) -> Packed:
        """The members of the family's folder ``root`` (of ``only``, for a family of
        named things, if given)."""
        raise NotImplementedError

    def limit(self, label: str, name: str, limits: Limits) -> tuple[str, int]:
        """What the listed member ``name`` is, as a message calls it, and the most bytes
        it may hold; :class:`BundleRejected` for a name the part does not take."""
        raise NotImplementedError

    def check_sha(self, label: str, name: str, sha: str) -> None:
        """The sha256 MANIFEST.json lists for ``name``, where the part constrains it."""

    def reader(
        self, label: str, limits: Limits, stage: Stage | None, budget: Any = None
    ) -> PartReader:
        """A reader of this part of one bundle; ``budget``: what the bundle's parts may
        restore together (``bundle_indexed.Restores``), shared by them."""
        return PartReader(self, label, limits, stage, budget)

    def undo(self, root: Path, record: Record) -> int:
        """Put back what the install of ``record`` replaced in ``root``; nothing here."""
        return 0

    def describe(self, names: list[str]) -> str:
        """Its members among a bundle's, counted in words: "3 artifacts"."""
        return f"{len(names)} {self.counted or self.what}"

    def record_keys(self) -> tuple[str, ...]:
        """The keys of a generation's record that :meth:`undo` reads."""
        return ()

    def is_blob(self, name: str) -> bool:
        """Whether member ``name`` is named by its sha256 (checked when created)."""
        return False
