"""The checks before a run: one sequence, in one order, whoever starts the run.

``triton-warmup run`` (the launcher), a rank that torchrun started and ``warmup.warm()``
in a server's own process run the same steps (:func:`checked`) before any rank warms or
anything is written, so that the same bad input gives the same first error:

1. the volume is there (made first with ``create_volume``); for ``triton-warmup run`` the
   command line checks it before the launcher starts (``launch.run``'s other callers,
   the demo and the tests, bring volumes of their own);
2. the manifest has entries for this world size;
3. its entries for other world sizes: skipped (the launcher says each, once for every
   rank), or refused when ``other_world_sizes`` is 'fail';
4. the device: the launcher's from the GPUs the driver lists (no torch: seconds of
   start-up), a rank's from torch (on CPU it turns Triton's interpreter on);
5. every kernel's shapes and every function, imported (the launcher checks them later,
   while its ranks import torch: :attr:`Caller.kernels_later`);
6. the registry's remote tier can be made;
7. the lock server answers, or the run falls back to file leases.

What differs between callers is a :class:`Caller`: the words of its errors, how it
decides the device, when it checks the kernels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from registry import RegistryError
from registry.core import triton_internals
from registry.core.errors import BadInput
from registry.locks import LockServerUnreachable, check_backend
from warmup.core.manifest import Manifest, ManifestError
from warmup.core.services import Services, existing_volume
from warmup.core.settings import Settings
from warmup.run.gpus import GPU_LIST, visible_gpus

log = logging.getLogger(__name__)

Device = Literal["cpu", "cuda"]
DeviceStep = Callable[[Settings, int], Device]  # (settings, world size) -> where ranks warm

# How a self-started rank's caller asks for a volume to be made, in its own words.
VOLUME_FIX_ENV = "check TRITON_WARMUP_VOLUME, or create it with TRITON_WARMUP_CREATE_VOLUME=true"
VOLUME_FIX_PYTHON = "check Settings(volume=...), or pass Settings(create_volume=True) to create it"


class RunError(BadInput, RuntimeError):
    """The run cannot start or cannot go on: no entry for the world size, no GPU, a rank
    that cannot reach its device or the restored cache."""


@dataclass(frozen=True)
class Caller:
    """Who runs the checks, and how its steps differ: the same steps, in its words."""

    source: str  # the manifest, as its errors name it
    device: DeviceStep  # step 4: where the ranks warm
    volume_fix: str | None  # how it makes a missing volume; None: its command line checked it
    command_line: bool = False  # a world without entries is fixed with --world-size
    says_skipped: bool = False  # each entry of another world size logged, once for the pod
    kernels_later: bool = False  # step 5 is its own, while its ranks import torch


@dataclass(frozen=True)
class Checked:
    """What the checks decided: the services to run with (the lock backend chosen), their
    settings, and where the ranks warm."""

    services: Services
    device: Device

    @property
    def settings(self) -> Settings:
        """The settings to run with (those of :attr:`services`)."""
        return self.services.settings


def launcher(source: str) -> Caller:
    """``triton-warmup run``: the command line's words, the device from /proc, the
    kernels checked while the ranks start."""
    return Caller(
        source,
        listed_device,
        volume_fix=None,
        command_line=True,
        says_skipped=True,
        kernels_later=True,
    )


def self_started(source: str, volume_fix: str) -> Caller:
    """A rank that torchrun started (``volume_fix``: :data:`VOLUME_FIX_ENV`) or
    ``warmup.warm()`` (:data:`VOLUME_FIX_PYTHON`): the device from torch."""
    return Caller(source, torch_device, volume_fix)


def checked(services: Services, manifest: Manifest, world: int, caller: Caller) -> Checked:
    """The checks before a run of ``world`` ranks, in the module's order, on the services
    its entry point built; the first that fails raises (:class:`RunError`,
    :class:`ManifestError`, :class:`registry.core.volume.MissingFolder`: all bad input, exit 2)."""
    settings = services.settings
    if caller.volume_fix is not None:
        existing_volume(settings, caller.volume_fix)
    manifest.require_world(world, caller.source, command_line=caller.command_line)
    other_world_sizes(settings, manifest, world, caller)
    device = caller.device(settings, world)
    if not caller.kernels_later:
        manifest.check_kernels(caller.source)  # imports the kernels: after the interpreter is on
    check_remote(services)
    return Checked(lock_backend(services, manifest, world), device)


def other_world_sizes(settings: Settings, manifest: Manifest, world: int, caller: Caller) -> None:
    """The manifest's entries for other world sizes: logged when the caller says them,
    :class:`ManifestError` when ``other_world_sizes`` is 'fail'."""
    if caller.says_skipped:
        for skipped in manifest.skipped_entries(world):
            log.warning("skipping %s: this pod has %d ranks", skipped, world)
    refused = other_worlds_refused(settings, manifest, world)
    if refused:
        raise ManifestError(caller.source, [refused])


def other_worlds_refused(settings: Settings, manifest: Manifest, world: int) -> str | None:
    """Why this run fails for entries of other world sizes (``other_world_sizes`` is
    'fail'), or None."""
    skipped = manifest.skipped_entries(world)
    if not skipped or settings.run.other_world_sizes != "fail":
        return None
    return (
        f"{len(skipped)} manifest entries are for other world sizes than this pod's "
        f"{world} ranks, and other_world_sizes is 'fail': {'; '.join(skipped[:5])}"
    )


def listed_device(settings: Settings, world: int) -> Device:
    """The launcher's step 4: where its ranks warm, decided without importing torch
    (seconds of start-up): the NVIDIA driver lists its GPUs in /proc."""
    gpus = visible_gpus(GPU_LIST)
    device = settings.run.device_type(gpus)
    if device == "cuda" and gpus < world:
        raise RunError(
            f"device cuda: {world} rank(s) need {world} GPU(s), this machine has {gpus} "
            f"(listed in {GPU_LIST}); use --device cpu"
            + (f" or --world-size {gpus}" if gpus else "")
        )
    return device


def torch_device(settings: Settings, world: int) -> Device:
    """A self-started rank's step 4: :func:`uses_cuda`, as a device type."""
    return "cuda" if uses_cuda(settings) else "cpu"


def uses_cuda(settings: Settings) -> bool:
    """Whether this process warms on its GPU: ``device`` auto takes one when torch sees
    it, cuda requires it (:class:`RunError`). On CPU, Triton kernels run only in its
    interpreter, which Triton picks when it is imported: this turns it on, or says why
    it is too late."""
    cuda = on_gpu(settings, "device cuda: torch sees no CUDA GPU in this process; use device cpu")
    if cuda or triton_internals.interpreting():
        return cuda
    try:
        triton_internals.enable_interpreter()
    except ValueError as e:
        raise RunError(
            f"warming on CPU runs Triton kernels in Triton's interpreter, and {e}: set "
            "TRITON_INTERPRET=1 before anything imports triton (or warm on a GPU)"
        ) from None
    log.info("no GPU: Triton's interpreter is on in this process (TRITON_INTERPRET=1)")
    return False


def on_gpu(settings: Settings, refused: str) -> bool:
    """Whether this process warms on a GPU (:meth:`Settings.device_type` of the GPUs torch
    can run on: none when CUDA does not start, a driver that lists GPUs its runtime
    cannot use); :class:`RunError` saying ``refused`` when device cuda finds none."""
    import torch  # torch loads on first use

    usable = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda = settings.run.device_type(usable) == "cuda"
    if cuda and not usable:
        raise RunError(refused)
    return cuda


def check_remote(services: Services) -> None:
    """:class:`RunError` when the registry's remote tier is set and cannot be made (a
    bad URL, no redis-py); whether it answers is the tier's own business (it may not,
    and the run goes on with the local tier)."""
    try:
        _ = services.remote  # made now: a bad URL is bad input
    except RegistryError as e:
        raise RunError(f"TRITON_WARMUP_REMOTE_URL: {e}") from None


def lock_backend(services: Services, manifest: Manifest, world: int) -> Services:
    """Where this run locks, decided before any rank warms: a lock server must answer, or
    with ``lock_fallback`` file the run locks with the lease folder (the launcher decides
    once for the ranks it spawns; a torchrun or in-process rank decides for itself, and
    only rank 0 ever takes a lock)."""
    if not any(e.policy == "tune" and not e.is_user_function for e in manifest.entries_for(world)):
        return services  # nothing will be tuned: no lock taken
    try:
        check_backend(services.locks)
    except LockServerUnreachable as e:
        if services.settings.locks.fallback != "file":
            raise RunError(
                f"{e}: start it, fix TRITON_WARMUP_LOCK_URL, "
                "or set TRITON_WARMUP_LOCK_FALLBACK=file"
            ) from None
        log.warning("%s: falling back to file leases in %s for this run", e, services.volume.locks)
        # <volume>/locks, and the remote tier derived again: services of their own
        return services.with_settings(services.settings.updated(lock_url=""))
    return services
