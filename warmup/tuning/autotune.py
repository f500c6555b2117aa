"""``@autotune(config_space, key_fn, prune_fn=None)``: the decorator, with the call
conventions of Triton-distributed's ``triton_dist.tune.autotune``, backed by the registry.

    @autotune(config_space=[{"gemm_config": triton.Config({...}, num_warps=8)}, ...],
              key_fn=lambda a, b, ctx: (a.shape, b.shape, a.dtype))
    def ag_gemm_fn(a, b, ctx, gemm_config): ...

    ag_gemm_fn(a, b, ctx)                       # looks up, or tunes once and stores
    ag_gemm_fn(a, b, ctx, autotune=False)       # the first config, no lookup
    ag_gemm_fn(a, b, ctx, autotune_verbose=True)
    ag_gemm_fn(a, b, ctx, autotune_pg=group)    # tune in lockstep over the group

Config-space entries are ``KernelConfig``s, dicts of scalars, or dicts holding one
``triton.Config`` (flattened for the registry, rebuilt for the call).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels.task import Task
from registry import KernelConfig, Store
from registry.core.fingerprint import Fingerprint, detect_for, kernel_source_hash
from registry.locks import LockBackend
from warmup.core.collectives import Lockstep
from warmup.core.settings import Settings
from warmup.tuning.timing import Timer, cuda_event_timer, wall_clock_timer
from warmup.tuning.tuner import TuneOptions, Tuner, TunerStats

log = logging.getLogger(__name__)
_LAUNCH = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclass(frozen=True)
class _Choice:
    """A space entry: its registry form and the keyword arguments it stands for."""

    config: KernelConfig
    kwargs: dict[str, Any]


def autotune(
    config_space: Sequence[Any],
    key_fn: Callable[..., Any],
    prune_fn: Callable[..., bool] | None = None,
    *,
    kernel: str | None = None,
    store: Store | None = None,
    fingerprint: Fingerprint | None = None,
    timer: Timer | None = None,
    options: TuneOptions | None = None,
    lock_backend: LockBackend | None = None,
    reference: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorate a function whose keyword arguments come from ``config_space``."""

    def decorate(fn: Callable[..., Any]) -> AutotunedFunction:
        return AutotunedFunction(
            fn,
            config_space,
            key_fn,
            prune_fn,
            kernel=kernel,
            store=store,
            fingerprint=fingerprint,
            timer=timer,
            options=options or TuneOptions(),
            lock_backend=lock_backend,
            reference=reference,
        )

    return decorate


class AutotunedFunction:
    def __init__(
        self,
        fn: Callable[..., Any],
        config_space: Sequence[Any],
        key_fn: Callable[..., Any],
        prune_fn: Callable[..., bool] | None,
        *,
        kernel: str | None,
        store: Store | None,
        fingerprint: Fingerprint | None,
        timer: Timer | None,
        options: TuneOptions,
        lock_backend: LockBackend | None,
        reference: Callable[..., Any] | None,
    ) -> None:
        if not config_space:
            raise ValueError(f"autotune({fn.__qualname__}): config_space is empty.")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.choices = [_choice(entry) for entry in config_space]
        self.key_fn, self.prune_fn, self.reference = key_fn, prune_fn, reference
        self.kernel = kernel or _kernel_name(fn)
        self.options, self.timer, self.lock_backend = options, timer, lock_backend
        self._store, self._fingerprint = store, fingerprint
        self.stats = TunerStats()
        self.best: dict[str, _Choice] = {}

    def __call__(
        self,
        *args: Any,
        autotune: bool = True,
        autotune_verbose: bool = False,
        autotune_pg: Any = None,
        **kwargs: Any,
    ) -> Any:
        overlap = set(kwargs) & set(self.choices[0].kwargs)
        if overlap:
            raise ValueError(
                f"{self.kernel}: keyword(s) {sorted(overlap)} come from the "
                "config space; do not pass them."
            )
        if not autotune:
            return self.fn(*args, **self.choices[0].kwargs, **kwargs)
        key = to_key(self.key_fn(*args, **kwargs))
        memo = json.dumps(key, sort_keys=True)
        if memo not in self.best:
            task = _CallTask(self, args, kwargs, key)
            device = _device_of([*args, *kwargs.values()])
            tuner = Tuner(
                self.store(),
                self.fingerprint(device),
                timer=self.timer or (wall_clock_timer() if device == "cpu" else cuda_event_timer()),
                lockstep=Lockstep(autotune_pg, timeout_s=self.options.rank_timeout_s),
                lock_backend=self.lock_backend,
                options=self.options,
                stats=self.stats,
            )
            outcome = tuner.get(task)
            self.best[memo] = self._choice_for(outcome.config)
            message = (
                f"{self.kernel} {key}: {outcome.source} config "
                f"{outcome.config.label()} in {outcome.seconds:.2f} s"
            )
            log.info(message)
            if autotune_verbose:
                print(message)
        return self.fn(*args, **self.best[memo].kwargs, **kwargs)

    def store(self) -> Store:
        if self._store is None:
            from warmup.core.services import Services  # a decorator's first call: its entry point

            self._store = Services(Settings()).store()
        return self._store

    def fingerprint(self, device: Any = "cpu") -> Fingerprint:
        """The one given, else where the call's tensors live (the CPU's for CPU tensors,
        even on a machine with GPUs)."""
        if self._fingerprint is not None:
            return self._fingerprint

        return detect_for(device)

    def pruned(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[_Choice]:
        if self.prune_fn is None:
            return list(self.choices)
        return [c for c in self.choices if self.prune_fn(c.kwargs, *args, **kwargs)]

    def _choice_for(self, config: KernelConfig) -> _Choice:
        """The space entry of a config the tuner chose (one it ``accepts``)."""
        for choice in self.choices:
            if choice.config == config:
                return choice
        raise ValueError(f"{self.kernel}: {config.label()} is not in the config space.")

    def space_hash(self) -> str:
        """The config space's hash: part of the kernel hash, so a changed space is a miss."""
        space = sorted(json.dumps(c.config.to_json(), sort_keys=True) for c in self.choices)
        return hashlib.sha256("\n".join(space).encode()).hexdigest()[:16]


class _CallTask(Task):
    """One call's arguments, as a tuner task: each config runs the function itself."""

    def __init__(
        self,
        owner: AutotunedFunction,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        key: dict[str, Any],
    ) -> None:
        self.owner, self.args, self.kwargs, self._key = owner, args, dict(kwargs), key
        self.kernel = owner.kernel
        self._expected: Any = None

    @property
    def kernel_hash(self) -> str:
        return f"{kernel_source_hash(self.owner.fn)}-{self.owner.space_hash()}"

    def accepts(self, config: KernelConfig) -> bool:
        return any(choice.config == config for choice in self.owner.choices)

    def key(self) -> dict[str, Any]:
        return self._key

    def candidates(self) -> list[KernelConfig]:
        return [c.config for c in self.owner.pruned(self.args, self.kwargs)]

    def run(self, config: KernelConfig) -> Any:
        return self.owner.fn(*self.args, **self.owner._choice_for(config).kwargs, **self.kwargs)

    def verify(self, output: Any) -> str | None:
        if self.owner.reference is None:
            return None
        import torch  # torch loads on first use

        if self._expected is None:
            self._expected = self.owner.reference(*self.args, **self.kwargs)
        ok = torch.allclose(output.float(), self._expected.float(), rtol=2e-2, atol=2e-2)
        return None if ok else "output differs from the reference"

    def warmup(self, config: KernelConfig) -> None:
        return None  # a function may launch several kernels: they compile on first run


def to_key(value: Any) -> dict[str, Any]:
    """A key function's result as a registry key (a JSON object)."""
    plain = _plain(value)
    return plain if isinstance(plain, dict) else {"key": plain}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # torch.Size is a tuple
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # torch.dtype and friends


def _choice(entry: Any) -> _Choice:
    if isinstance(entry, KernelConfig):
        return _Choice(entry, entry.all_kwargs())  # num_ctas and maxnreg too, when set
    if not isinstance(entry, Mapping):
        raise ValueError(f"autotune: config-space entry {entry!r} is not a dict or KernelConfig.")
    meta: dict[str, Any] = {}
    launch: dict[str, Any] = {}
    for name, value in entry.items():
        if hasattr(value, "kwargs") and hasattr(value, "num_warps"):  # a triton.Config
            meta.update(value.kwargs)
            launch = {k: getattr(value, k) for k in _LAUNCH if getattr(value, k, None) is not None}
        elif isinstance(value, (int, float, str, bool)) or value is None:
            meta[name] = value
        else:
            raise ValueError(
                f"autotune: config-space value {name}={value!r} is not a scalar or a triton.Config."
            )
    return _Choice(KernelConfig.make(meta, **launch), dict(entry))


def _kernel_name(fn: Callable[..., Any]) -> str:
    """``module:qualname``, made a valid registry name (``<locals>`` and the like)."""
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", f"{fn.__module__}:{fn.__qualname__}")[-128:]


def _device_of(args: Sequence[Any]) -> Any:
    """The first CUDA tensor's device among ``args``; "cpu" when there is none."""
    return next((a.device for a in args if getattr(a, "is_cuda", False)), "cpu")
