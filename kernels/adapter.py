"""What ``warmup/`` needs from a kernel, so that it drives any kernel and names none.

An adapter (one per kernel module, listed in :data:`kernels.ADAPTERS`) answers:

* ``check_shape``: is a manifest shape valid for this kernel (before any GPU work);
* ``tasks``: the tune tasks (:class:`kernels.task.TuneTask`) for a manifest entry's shapes;
* ``tuning_cost``: what tuning one shape costs, relative to the others (the fleet tunes the
  costliest first, so that no pod ends on a long shape while the others wait);
* ``kernel_hash``: the public hash of the kernel's source, part of every fingerprint;
* ``key``: the registry key of one problem (what a stored config depends on);
* ``serve``: a :class:`Served` layer, which a serving op calls with a config per call.

:class:`KernelAdapter` answers the first four, and ``key``, alike for every kernel; a
kernel module states only its ``tasks`` and ``serve`` (its served layer's shared base is
:class:`kernels.served.ServedLayer`). Imports neither torch nor triton: the manifest and
the sidecar use the table.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kernels.shapes import RULES
from registry.core.config import KernelConfig

if TYPE_CHECKING:
    import torch

    from kernels.task import TuneTask

BUCKET_FIELD = "M"  # the key field a serving op buckets on: the rows of one call
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DTYPES = tuple(TORCH_NAMES)  # the dtypes a manifest and a layer name
GEMM_KEY = ("M", "N", "K", "dtype")  # what a single-device GEMM config depends on


def gemm_flops(shape: Mapping[str, int]) -> float:
    """The floating-point operations of one ``M x K @ K x N`` product: a GEMM's tuning
    runs each candidate the same number of times at any shape, so its cost grows with
    this (on an H100: 0.5 s to tune 17 GFLOP, 2.3 s at 240, 8 s at 962)."""
    return 2.0 * shape["M"] * shape["N"] * shape["K"]


def dtype_name(dtype: Any) -> str | None:
    """The name a manifest gives a torch dtype (``torch.bfloat16`` -> ``bf16``); None for
    anything else (a dtype no kernel takes, a string). One dict lookup: serving calls
    check their inputs with it."""
    return _by_torch_dtype().get(dtype)


@functools.cache
def _by_torch_dtype() -> dict[Any, str]:
    import torch  # torch loads only when a dtype is looked up: the manifest runs without it

    return {getattr(torch, torch_name): name for name, torch_name in TORCH_NAMES.items()}


def torch_dtype(name: str) -> Any:
    """The torch dtype a dtype name stands for (imports torch)."""
    import torch  # torch loads only when a kernel runs

    return getattr(torch, TORCH_NAMES[name])


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` (a torch device or its name) as a torch device; a CUDA one with its
    index: the current GPU's where it names none (imports torch)."""
    import torch  # torch loads only when a kernel runs

    place = torch.device(device)
    if place.type == "cuda" and place.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return place


@dataclass(frozen=True)
class LaunchPlan:
    """One kernel launch as data: the JIT function, its grid, arguments and options, so
    that a launch, a compile-only warm-up and a specialisation check see the same thing."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    options: dict[str, Any]

    def launch(self) -> None:
        self.kernel[self.grid](*self.args, **self.options)

    def compile(self) -> Any:
        """Compile (or load from the cache) exactly this launch's variant; no launch."""
        return self.kernel.warmup(*self.args, grid=self.grid, **self.options)

    def variant(self) -> tuple[Any, ...]:
        """What Triton specialises this launch on, taken generously: two plans of one
        variant run one compiled kernel (:meth:`launch_compiled`)."""
        params = getattr(self.kernel, "params", [])
        arguments = tuple(
            _specialisation(arg, getattr(param, "do_not_specialize", False))
            for param, arg in zip(params, self.args, strict=False)
        )
        return (self.kernel, tuple(sorted(self.options.items())), arguments)

    def launch_compiled(self, compiled: Any) -> None:
        """Launch through ``compiled`` (this plan's :meth:`compile`, or one of the same
        :meth:`variant`), as Triton's JIT does after its dispatch: every argument in
        signature order, the constexpr ones included."""
        compiled[(*self.grid, 1, 1)[:3]](*self.full_args())

    def full_args(self) -> tuple[Any, ...]:
        """Every argument in signature order: the positional ones, then the constexprs."""
        names = self.kernel.arg_names
        return (*self.args, *(self.options[name] for name in names[len(self.args) :]))

    def load(self) -> None:
        """Compile, then load the GPU module now, so the first real launch only launches."""
        compiled = self.compile()
        init = getattr(compiled, "_init_handles", None)  # Triton 3.x: lazy module load
        if init is not None:
            init()


def _specialisation(arg: Any, unspecialised: bool) -> Any:
    """What of one argument a compiled variant may depend on: a tensor's dtype and 16-byte
    alignment, a descriptor's type and layout, an integer's value (its width alone where
    the kernel does not specialise on it)."""
    if isinstance(arg, bool) or arg is None or isinstance(arg, str):
        return arg
    if isinstance(arg, int):
        return ("int", -(2**31) <= arg < 2**31) if unspecialised else arg
    if hasattr(arg, "block_shape"):  # a host tensor descriptor
        shape, strides = tuple(arg.shape), tuple(arg.strides)
        return ("descriptor", arg.base.dtype, tuple(arg.block_shape), shape[1:], strides)
    if hasattr(arg, "data_ptr"):
        return ("tensor", arg.dtype, arg.data_ptr() % 16 == 0)
    return (type(arg).__name__, arg)


@dataclass(frozen=True)
class Layer:
    """One served layer: what a serving op is made for. ``max_m`` bounds the rows of a
    call (for a tensor-parallel kernel, the gathered rows over every rank)."""

    n: int
    k: int
    dtype: str  # "bf16" | "fp16" | "fp32"
    max_m: int

    def __post_init__(self) -> None:
        for name in ("n", "k", "max_m"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Layer {name}={value!r}: must be an int >= 1.")
        if self.dtype not in DTYPES:
            raise ValueError(f"Layer dtype={self.dtype!r}: must be one of {', '.join(DTYPES)}.")


class Served(Protocol):
    """A kernel made ready for one layer: it runs a given config and builds variants."""

    kernel: str
    rows_step: int  # a call's M is a multiple of this (the world size for a gather)
    device: Any  # the torch.device it runs on
    collective: bool  # calls are collectives: every rank must run the same algorithm at each call
    group: Any  # the process group its calls span; None: this process alone

    def key(self, m: int) -> dict[str, Any]:
        """The registry key of a call with ``m`` rows."""
        ...

    def rows(self, a: Any, b: Any, /) -> int:
        """The M of a call on ``a`` (this rank's rows) and ``b`` (the layer's weight;
        cheap: no checks beyond the shapes)."""
        ...

    def __call__(self, config: KernelConfig, a: Any, b: Any, /, *, out: Any = None) -> Any:
        """Run the layer's kernel with ``config``; the kernel checks its inputs."""
        ...

    def prepare(self, config: KernelConfig, rows: Sequence[int]) -> None:
        """Build ``config``'s variant in this process (compile or load, GPU module
        loaded) for calls of every M in ``rows`` (the Ms a table serves with it), so that
        no call compiles or makes a per-shape choice (a library's, such as cuBLAS's
        algorithm pick at each new M); collective-free. A serving op calls it once per
        config and then only with Ms that config was not built for yet."""
        ...

    def rehearse(self, configs: Sequence[KernelConfig]) -> None:
        """One real call per config, at the smallest M with scratch inputs, so that a
        process's one-time costs (first launch of each variant, lazy imports, first
        peer access) stay out of its first requests; a collective for a tensor-parallel
        kernel: every rank calls it with as many configs."""
        ...

    def default_config(self) -> KernelConfig:
        """The config a layer with no tuned entry falls back to."""
        ...

    def agree(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank of the layer's group (a collective), so that
        ranks that read the registry at different moments still make the same op."""
        ...

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` is true on every rank of the layer's group (a collective), so
        that a change one rank could not make is made by none."""
        ...


class Adapter(Protocol):
    """A kernel as ``warmup/`` drives it (see the module's docstring); every kernel's
    subclasses :class:`KernelAdapter`, which holds the parts they share."""

    name: str

    def kernel_hash(self) -> str: ...

    def check_shape(self, shape: Mapping[str, int], *, world_size: int) -> str | None:
        """None when the shape is valid, else why not (one line)."""
        ...

    def key(self, *, m: int, n: int, k: int, dtype: str, world: int) -> dict[str, Any]: ...

    def tasks(
        self, shapes: Sequence[Mapping[str, int]], *, dtype: str, group: Any, device: Any
    ) -> Iterator[TuneTask]:
        """One tune task per shape, in order; every rank of ``group`` calls it."""
        ...

    def tuning_cost(self, shape: Mapping[str, int]) -> float:
        """What tuning ``shape`` costs, in any unit shared by this manifest's kernels (only
        the order matters); the same on every rank."""
        ...

    def serve(self, layer: Layer, *, group: Any, device: Any) -> Served: ...

    def reserve(self, layers: Sequence[Layer], *, group: Any, device: Any) -> None:
        """Make now, once, what every layer of ``layers`` that this process will serve on
        ``group`` shares (a collective where it makes anything)."""
        ...


@dataclass(eq=False)
class KernelAdapter(ABC):
    """What every kernel's :class:`Adapter` does alike: its hash is its module's
    ``kernel_hash``, its shape check the rule :mod:`kernels.shapes` holds for it (read
    there without torch), its key the fields of ``key_fields``, its tuning cost a
    GEMM's flops. A kernel module subclasses it with ``tasks`` and ``serve`` and makes one
    instance, its ``ADAPTER``."""

    name: str
    source_hash: Callable[[], str]  # the kernel module's kernel_hash()
    key_fields: tuple[str, ...] = GEMM_KEY  # a tensor-parallel kernel adds "world"

    def kernel_hash(self) -> str:
        """The public hash of the kernel's source, part of every fingerprint."""
        return self.source_hash()

    def check_shape(self, shape: Mapping[str, int], *, world_size: int) -> str | None:
        """None when the shape is valid, else why not (one line)."""
        return RULES[self.name].check(shape, world_size=world_size)

    def key(self, *, m: int, n: int, k: int, dtype: str, world: int) -> dict[str, Any]:
        """The registry key of one problem: the fields of ``key_fields``, in that order."""
        values: dict[str, Any] = {"M": m, "N": n, "K": k, "dtype": dtype, "world": world}
        return {name: values[name] for name in self.key_fields}

    def tuning_cost(self, shape: Mapping[str, int]) -> float:
        """A GEMM's flops: its tuning runs each candidate as often at any shape."""
        return gemm_flops(shape)

    @abstractmethod
    def tasks(
        self, shapes: Sequence[Mapping[str, int]], *, dtype: str, group: Any, device: Any
    ) -> Iterator[TuneTask]:
        """One tune task per shape, in order; every rank of ``group`` calls it."""

    @abstractmethod
    def serve(self, layer: Layer, *, group: Any, device: Any) -> Served:
        """The kernel made ready for ``layer`` on ``device`` (a collective over ``group``
        for a tensor-parallel kernel)."""

    def reserve(self, layers: Sequence[Layer], *, group: Any, device: Any) -> None:
        """Make now, once, what the layers this process will serve share, sized for them
        all (the AllGather-GEMM: one workspace); by default nothing is shared. A
        collective where it makes anything: every rank passes the same layers."""
        return None  # a kernel whose layers share nothing
