"""Whose host the harvest stores under, and the host recorded for the next pod.

What the server compiles is stored under the warmup's fingerprint (its ranks detected
it), or, when the init container started no rank
(``warmup.run.full_hit.leave_to_the_server``), under what the server's rank 0 detected
and wrote beside its metrics (:class:`~warmup.core.results.RankHost`). Such a host is then
recorded under the init's probe (:mod:`registry.storage.hosts`), so the next pod's init finds
its full hit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from registry.core.errors import RegistryError
from registry.core.fingerprint import Fingerprint
from registry.remote.tier import RemoteTier
from registry.storage import hosts
from warmup.core.results import RankHost, RunStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HarvestHost:
    """The fingerprint and Triton knobs what the server compiles is stored under."""

    fingerprint: Fingerprint
    triton_env: dict[str, str] = field(default_factory=dict)


def host_of(status: RunStatus | None, told: Path) -> HarvestHost | None:
    """The warmup's host, else what the server told in the folder ``told``; None while
    the pod is not ready or neither is known yet."""
    if status is None or not status.ready:
        return None
    if status.fingerprint:
        return HarvestHost(Fingerprint.from_json(status.fingerprint), dict(status.triton_env))
    rank = RankHost.read(told)
    if rank is None:
        return None
    return HarvestHost(Fingerprint.from_json(rank.fingerprint), dict(rank.triton_env))


def record_host(
    status: RunStatus, host: HarvestHost, told: Path, records: Path, remote: RemoteTier | None
) -> None:
    """A host whose init container started no rank (its status has the probe, not the
    fingerprint): recorded under that probe in ``records`` once its models are stored.
    A failure is logged: it costs the next pod its full hit, never this one."""
    if status.fingerprint or not status.probe:
        return
    try:
        found = hosts.Probe.from_json(status.probe)
        rank = RankHost.read(told)
        record = hosts.HostRecord(
            found.to_json(), host.fingerprint.with_kernel(""), rank.triton_env if rank else {}
        )
        hosts.keep_record(records, found, record, remote)
    except (OSError, ValueError, RegistryError) as e:
        log.warning("harvest: this host not recorded for the next pod: %s", e)
