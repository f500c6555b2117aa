"""File locks on a shared volume: filelock's SoftFileLease (a marker file renewed by a
heartbeat thread; a contender takes it over once it has seen no renewal for the TTL,
or at once when the holder's process is dead on this host)."""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from filelock import LeaseCompromise, LeaseSettingsMismatch, SoftFileLease
from filelock import Timeout as FileLockTimeout

from registry.core import atomic
from registry.locks.lease import LOST, Holder, lock_file_name

log = logging.getLogger(__name__)


@dataclass
class _Held:
    lease: SoftFileLease
    name: str
    holder: Holder


class FileLeaseBackend:
    """Leases as files in ``folder``, which every contender must share (a PVC, NFS)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._leases: dict[tuple[str, float], SoftFileLease] = {}

    def describe(self) -> str:
        return f"file leases in {self.folder}"

    def try_acquire(self, name: str, ttl: float, wait: float) -> _Held | None:
        lease = self._lease(name, ttl)
        try:
            try:
                lease.acquire(timeout=wait, poll_interval=min(0.05, ttl / 10))
            except LeaseSettingsMismatch:
                # The holder published another TTL (a fleet mid-rollout): contend on its terms.
                lease = self._lease(name, self._published_ttl(lease, ttl))
                lease.acquire(timeout=wait, poll_interval=min(0.05, ttl / 10))
        except FileLockTimeout:
            return None
        holder = Holder.me(secrets.token_hex(8))
        atomic.write_bytes(self._holder_path(name), holder.to_text().encode())
        return _Held(lease, name, holder)

    def release(self, handle: object) -> None:
        assert isinstance(handle, _Held)
        holder = self.holder(handle.name)
        if holder is not None and holder.token == handle.holder.token:
            with contextlib.suppress(FileNotFoundError):
                self._holder_path(handle.name).unlink()
        handle.lease.release()

    def holder(self, name: str) -> Holder | None:
        try:
            return Holder.parse(self._holder_path(name).read_text())
        except OSError:
            return None

    def _lease(self, name: str, ttl: float) -> SoftFileLease:
        # One lease object per name, so its observation of a silent holder accumulates.
        if (name, ttl) not in self._leases:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{lock_file_name(name)}.lease"
            self._leases[name, ttl] = SoftFileLease(
                str(path), lease_duration=ttl, on_compromise=_warn_lost(name)
            )
        return self._leases[name, ttl]

    @staticmethod
    def _published_ttl(lease: SoftFileLease, ttl: float) -> float:
        owner = lease.owner
        published = owner.lease_duration if owner is not None else None
        log.warning(
            "lock %s: holder uses ttl %s s, this process %s s; using the holder's",
            lease.lock_file,
            published,
            ttl,
        )
        return published or ttl

    def _holder_path(self, name: str) -> Path:
        return self.folder / f"{lock_file_name(name)}.holder.json"


def _warn_lost(name: str):  # type: ignore[no-untyped-def]
    def warn(compromise: LeaseCompromise) -> None:
        log.warning(LOST, name, compromise.reason)

    return warn
