"""The volume into the pod before any rank warms, and the run folder's word that it is.

The launcher restores while its ranks import torch, then marks the run folder
(:func:`mark_restored`); its ranks wait for the mark (:func:`wait_for_restore`). Rank 0
of a self-started run restores before the first barrier; a full hit restores and ends
with no rank (``warmup.run.full_hit``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from registry import RegistryError
from registry.core import atomic
from registry.core.fingerprint import Fingerprint
from warmup.caches import families
from warmup.core.manifest import Manifest
from warmup.core.results import RankHost
from warmup.core.services import Services
from warmup.run.checks import RunError

log = logging.getLogger(__name__)
RESTORED = "restored"  # marker file: the compile cache is in place
RECOVERY_BUDGET_S = 10.0  # the start's clearing of killed writers' debris; writes go on


def restore(
    services: Services, manifest: Manifest | None = None, *, host: Fingerprint | None = None
) -> dict[str, int]:
    """The volume into this pod: the registry recovered first, then every cache family
    (those keyed by the host only when ``host``, its fingerprint, is known; declared
    models are restored by their own warm). Returns what the recovery cleared, by kind
    (the run's metrics count it)."""
    recovered = recover_store(services)
    where = families.scope(services, manifest, fingerprint=host, models=False)
    families.restore(where, needing_host=None if host is not None else False)
    return recovered


def recover_store(services: Services) -> dict[str, int]:
    """Before any rank reads the registry: clean what a killed writer left and repair a
    broken ``current``, within ``RECOVERY_BUDGET_S`` (the first write goes on with the
    rest). A store that cannot be written (a read-only mount) is read as is. Returns what
    was cleared, by kind (``Store.recovered``)."""
    store = services.store()
    try:
        store.recover(budget_s=RECOVERY_BUDGET_S)
    except (OSError, RegistryError) as e:
        log.warning(
            "registry %s not recovered (%s); reading it as it is",
            services.settings.paths.registry_dir,
            e,
        )
    return dict(store.recovered)


def clear_run_dir(run_dir: Path) -> None:
    """The run folder made, without a previous run's reports, marker or host facts."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in [*run_dir.glob("rank-*.json"), run_dir / RESTORED, run_dir / RankHost.FILE]:
        old.unlink(missing_ok=True)


def mark_restored(run_dir: Path) -> None:
    """Tell the ranks that wait in :func:`wait_for_restore` that the caches are in place."""
    atomic.write_bytes(run_dir / RESTORED, b"")


def wait_for_restore(run_dir: Path, timeout_s: float) -> None:
    """Until :func:`mark_restored`; :class:`RunError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (run_dir / RESTORED).exists():
        if time.monotonic() > deadline:
            raise RunError(f"the compile cache was not restored within {timeout_s:g} s")
        time.sleep(0.01)
