"""The composition root: the registry's services of one process, built from its settings
once, at its entry point, and passed down.

Each entry point (``triton-warmup run`` and its ranks, ``warmup.warm()``, ``serve``,
``Serving()``, each command of the CLI, Triton's remote cache plug-in) makes one
:class:`Services` and hands it to what it calls; nothing below an entry point builds a
store, a remote tier, a lock backend or a trust of its own, and the settings build
nothing (``warmup.core.settings``: plain data). A service is made when first used, then kept:
a process that never locks never imports redis for it, and a bad key folder or remote
URL is an error where it is first needed, as it was before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from registry.core.errors import BadInput, RegistryError
from registry.core.volume import Volume, existing_folder
from registry.locks import LockBackend, backend_from_url
from registry.remote.freshness import FILE_NAME as FRESHNESS_FILE
from registry.remote.tier import RemoteTier, remote_tier
from registry.storage.store import Store
from registry.trust.signing import Trust
from warmup.core.settings import Settings

log = logging.getLogger(__name__)

# How the CLI asks for a missing volume to be made, in its flags' words.
VOLUME_FIX_CLI = (
    "check --volume (TRITON_WARMUP_VOLUME), or create it with --create-volume "
    "(TRITON_WARMUP_CREATE_VOLUME=true)"
)


def existing_volume(settings: Settings, fix: str | None = None) -> Path:
    """The volume's folder, made first with ``create_volume``;
    :class:`registry.core.volume.MissingFolder` when it is not there, saying ``fix`` (how to
    create it, in the caller's words: the CLI's flags by default)."""
    paths = settings.paths
    return existing_folder(
        paths.volume, what="volume", create=paths.create_volume, fix=fix or VOLUME_FIX_CLI
    )


def writable_work_dir(settings: Settings) -> Path:
    """The work dir, when it can be made and written (checked, then left as it was);
    :class:`BadInput` saying why not, before a command starts its work."""
    folder = settings.paths.work_dir
    error = unwritable(folder)
    if error:
        raise BadInput(
            f"work dir '{folder}' cannot be made or written ({error}): check --work-dir "
            "(TRITON_WARMUP_WORK_DIR); a pod's is an emptyDir"
        )
    return folder


def unwritable(folder: Path) -> str | None:
    """None when ``folder`` can be made and a file in it written, synced and removed;
    else why not. The folders made for the probe are removed again."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-") as probe:
            probe.write(b"probe")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as e:
        return str(e)
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()
    return None


@dataclass(frozen=True)
class Services:
    """The store, the remote tier, the lock backend, the trust and the volume of one
    process, made from ``settings`` as that process needs them: a ``run``'s store puts
    wait ``locks.timeout_s`` for the store's write lock (an install may hold it);
    ``check_interval``: how often a store's reader looks for a new generation (0: at every
    read); ``remote_timeout_s``: the deadline of each remote call. The remote tier keeps
    the newest issue time it has seen per key in ``<volume>/remote-seen.json``."""

    settings: Settings
    run: bool = False
    check_interval: float = 0.0
    remote_timeout_s: float = 1.0

    @property
    def volume(self) -> Volume:
        """The volume's layout (``registry.core.volume.Volume``)."""
        return self.settings.paths.layout

    def store(self) -> Store:
        """The registry's store, opened as this process opens it (each call a new handle,
        as :class:`registry.families.Scope` asks)."""
        # The volume's own store: existing_volume guards the volume; its first write makes it.
        root, interval = self.settings.paths.registry_dir, self.check_interval
        if self.run:
            wait = self.settings.locks.timeout_s
            return Store(root, lock_timeout=wait, check_interval=interval, create=True)
        return Store(root, check_interval=interval, create=True)

    @functools.cached_property
    def trust(self) -> Trust:
        """What this process accepts and signs with; :class:`registry.trust.signing.KeyFileError`
        for a key folder or file it cannot use."""
        return self.reload_trust()

    def reload_trust(self) -> Trust:
        """The trust read again from its key folders (a Secret's keys rotate in place)."""
        trust = self.settings.trust
        return Trust.load(
            trust.keys,
            bundle_keys_dir=trust.bundle_keys,
            signing_key=trust.signing_key,
            allow_unsigned=trust.allow_unsigned,
        )

    @functools.cached_property
    def remote(self) -> RemoteTier | None:
        """The registry's remote tier; None when it is off; :class:`registry.RegistryError`
        for a URL it cannot use (or keys it cannot read)."""
        remote = self.settings.remote
        return remote_tier(
            remote.url,
            timeout_s=self.remote_timeout_s,
            password=remote.password(),
            trust=self.trust,
            seen=self.volume.root / FRESHNESS_FILE,  # a replay stays refused after a restart
            max_age_s=self.settings.trust.remote_max_age_s,
        )

    def remote_or_none(self, unused: str) -> RemoteTier | None:
        """:attr:`remote`, or None when it cannot be made: logged with ``unused``, what
        goes without it."""
        try:
            return self.remote
        except RegistryError as e:
            log.warning("%s: %s", unused, e)
            return None

    @functools.cached_property
    def locks(self) -> LockBackend:
        """The fleet's lock backend at ``locks.url``."""
        return self.locks_at(self.settings.locks.url)

    def locks_at(self, url: str) -> LockBackend:
        """A lock backend at ``url``, with the redis password."""
        return backend_from_url(url, password=self.settings.remote.password())

    def with_settings(self, settings: Settings) -> Services:
        """The same kind of services for other settings (a run that falls back to file
        leases: its locks and remote tier are derived again)."""
        return dataclasses.replace(self, settings=settings)
