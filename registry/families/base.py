"""The protocol every cache family implements, and the typed values it is handed.

A family declares what it needs of the pod (:class:`PodFolder`: each folder it keeps,
its setting and where the server reads it) and its option in the bundle commands
(:class:`BundleOption`); it is told *where* (a :class:`Scope`: the volume, the pod
folders it declared and no others, what the manifest declares, this host's fingerprint
once known) and answers:

- :meth:`Family.restore`: the volume's copy into this pod, before the server starts;
- :meth:`Family.save`: this pod's new artifacts onto the volume, when the run ends;
- :meth:`Family.explain`: whether this host would hit what is stored, and why not.

Each returns a value that names the family, so the loops print, count and label it
without knowing which family it was. A family that has nothing to do at a step keeps the
default (nothing moved; an empty prediction says why).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from registry.caches.triton_cache import Origin
from registry.core.explain import Prediction, predict
from registry.core.fingerprint import Fingerprint, MatchPolicy
from registry.core.volume import Volume
from registry.families.file_harvest import FileLimits, Harvested, Refused

if TYPE_CHECKING:
    from registry.bundles.bundle import Bundle
    from registry.families.bundle_parts import BundlePart
    from registry.remote.tier import RemoteTier
    from registry.storage.store import Store


@dataclass(frozen=True)
class Declared:
    """One thing a manifest declares that a keyed family stores: a model or a folder.
    ``key``: what its artifacts depend on besides the host, ``key_digest`` its hash
    ("" with ``error`` when the key could not be made); ``folder``: where the server
    reads it (a declared folder), None for a family's own folder."""

    name: str
    key_digest: str
    key: Mapping[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    error: str = ""


@dataclass(frozen=True)
class PodFolder:
    """A folder of this pod that a family keeps: its setting ``name`` (read from
    ``TRITON_WARMUP_<NAME>``), its ``default`` under the settings' work dir, what it is
    (``description``), the variable the server reads its path from (``server_env``, ""
    for none), and whether the chart mounts it for every container (``mounted``: under
    the work dir's mounted ``families/`` unless the chart sets it by name)."""

    name: str
    default: str
    description: str
    server_env: str = ""
    mounted: bool = True

    @property
    def env(self) -> str:
        """The environment variable of its setting."""
        return f"TRITON_WARMUP_{self.name.upper()}"

    @property
    def option(self) -> str:
        """Its option on the command line (``--triton-cache-dir``)."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class BundleOption:
    """How the ``registry bundle`` commands name a family's folder: ``create``'s option
    takes files from a folder (``--triton-cache``), ``install``'s and ``rollback``'s put
    them in one: by default the family's folder on the volume, or its pod folder
    ``pod`` where that setting was given. ``dest``: its attribute on parsed arguments."""

    flag: str
    carries: str  # create's help: what it also carries
    goes: str  # install's help: what goes there
    pod: str = ""  # a pod folder's setting that, given, is install's default

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Scope:
    """Where the families work for one pod: the volume, this pod's folders by their
    setting's name (a family is handed only those it declared: :meth:`only`), what the
    manifest declares, and this host's fingerprint when it is known (a run knows it
    once a rank detected it, a full hit from the host's record)."""

    volume: Volume
    pod: Mapping[str, Path]
    store: Callable[[], Store]
    match_policy: MatchPolicy = MatchPolicy.EXACT
    models: Sequence[Declared] = ()
    folders: Sequence[Declared] = ()
    user_functions: bool = False  # the manifest names @triton.autotune functions
    fingerprint: Fingerprint | None = None  # this host's, as the run detected it
    triton_env: Mapping[str, str] | None = None  # the env knobs in Triton's key, if known
    remote: RemoteTier | None = None  # the registry's remote tier: fetched from, published to

    def folder(self, name: str) -> Path:
        """The pod folder of setting ``name``; :class:`KeyError` for one not handed over
        (a family reads only the folders it declared)."""
        try:
            return self.pod[name]
        except KeyError:
            raise KeyError(
                f"pod folder '{name}' was not declared; handed: {sorted(self.pod)}"
            ) from None

    def only(self, family: Family) -> Scope:
        """This scope with only the pod folders ``family`` declared."""
        names = {f.name for f in family.folders}
        return replace(self, pod={k: v for k, v in self.pod.items() if k in names})


@dataclass(frozen=True)
class Host:
    """This host's side of every comparison ``explain`` makes."""

    fingerprint: Fingerprint  # no kernel hash: each kernel's comes from kernel_hashes
    triton: Origin
    kernel_hashes: Mapping[str, str] = field(default_factory=dict)  # adapter -> source hash


@dataclass(frozen=True)
class Sources:
    """What else holds artifacts besides the volume, for ``explain``: bundles waiting to
    install, the remote tier, and whether this pod's own folders count (not while a run
    restores and compiles into them)."""

    bundles: Sequence[Bundle] = ()
    remote: RemoteTier | None = None
    local: bool = True


@dataclass
class Moved:
    """What one family's restore or save did: files copied, files already in place,
    registry entries made, and one note per thing it could not do."""

    family: str
    copied: int = 0
    present: int = 0
    entries: int = 0
    notes: list[str] = field(default_factory=list)
    bytes: int = 0  # of the files copied, where the family counts them
    failed: str = ""  # the step raised: why (the loop went on with the other families)

    @property
    def anything(self) -> bool:
        return bool(self.copied or self.present or self.entries or self.notes)

    def line(self, verb: str) -> str:
        """One line for the log: ``triton-kernels: restored 12 files (3 already there)``."""
        parts = [f"{verb} {self.copied} file{'' if self.copied == 1 else 's'}"]
        if self.present:
            parts.append(f"({self.present} already there)")
        if self.entries:
            parts.append(f"and {self.entries} registry entries")
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        return f"{self.family}: {' '.join(parts)}{notes}"


class Family:
    """One cache family. Subclasses set ``name`` (its label in metrics, ``explain`` and
    the logs) and ``order`` (where it comes in every loop), and override what applies."""

    name: str = ""
    order: int = 100
    needs_host = False  # restored only once the host's fingerprint is known
    folders: tuple[PodFolder, ...] = ()  # the pod folders it keeps (settings, chart, scope)
    bundled: BundlePart | None = None  # its members in a bundle (registry.families.bundle_parts)
    option: BundleOption | None = None  # its folder's option in the bundle commands
    # the kinds of file it harvests one by one (:meth:`harvest_file`) -> their metrics label
    file_kinds: Mapping[str, str] = MappingProxyType({})

    def volume_root(self, volume: Volume) -> Path | None:
        """Its folder on the volume, where bundles take its files from and install them
        to; None for a family with no files of its own there."""
        return None

    def restore(self, scope: Scope) -> Moved:
        """The volume's copy into this pod; nothing by default."""
        return Moved(self.name)

    def save(self, scope: Scope) -> Moved:
        """This pod's new artifacts onto the volume; nothing by default."""
        return Moved(self.name)

    def explain(self, scope: Scope, host: Host, sources: Sources) -> Prediction:
        """Whether ``host`` would hit what is stored; by default nothing is."""
        return predict(self.name, [])

    def watched(self, scope: Scope) -> list[Path]:
        """The pod's folders the sidecar's harvest watches for this family, saved whole
        once quiet (:meth:`harvest`); none by default (Triton's files are harvested one
        by one, as each is finished: ``warmup.sidecar.harvest``)."""
        return []

    def harvest(self, scope: Scope) -> Moved:
        """After ready, what the server wrote into :meth:`watched` kept on the volume and
        shared; nothing by default."""
        return Moved(self.name)

    def file_folders(self, scope: Scope) -> list[Path]:
        """The pod's folders whose files the sidecar's harvest takes one by one, each as
        it is finished (:meth:`file_kind`, :meth:`harvest_file`); none by default."""
        return []

    def file_kind(self, scope: Scope, path: Path) -> str | None:
        """Which of :attr:`file_kinds` a new file in :meth:`file_folders` is, or None
        when this family does not take it (not finished, not its own)."""
        return None

    def harvest_file(self, scope: Scope, kind: str, path: Path, limits: FileLimits) -> Harvested:
        """After ready, one finished file of ``kind`` checked, bounded by ``limits``, and
        kept on the volume; what to share on the remote tier comes back with it.
        :class:`~registry.families.file_harvest.Refused` says why one is not taken."""
        raise Refused(f"{self.name} harvests no {kind} file")

    def __repr__(self) -> str:
        return f"<cache family {self.name}>"
