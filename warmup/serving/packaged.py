"""A declared model served from its compiled package: no compiler in the process.

    served = load_packaged(entry, settings, device=device)   # ServedPackage, or why not
    logits = served(tokens)

The package (``warmup.compiled.package``, restored into ``<package_dir>/<model>`` by the
init container) is loaded through torch's package loader
(``torch._C._aoti.AOTIModelPackageLoader``: milliseconds), not ``aoti_load_package``,
whose CPU-feature probe runs g++ for seconds and imports Dynamo. The model's own build
gives the weights (``torch.compile`` stood in for while it builds:
``warmup.compiled.uncompiled``), handed to the package by name without a copy. Nothing
here imports ``torch._dynamo`` or Inductor's compiler.

A call runs under the model's declared mode. Its inputs are checked against what the
package serves first (count, dtype, rank, device, each size static or inside its dim's
declared range, a dim equal across inputs): the package itself would compute garbage
past a range, so such a call is refused with :class:`PackageRefused` naming the input,
the dim and the range. Where the model's ``torch.compile`` mode records CUDA graphs, a
graph is captured at every primed shape on a GPU, and a call at one of those shapes
replays it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmup.compiled import package_files
from warmup.compiled.inputs import grad_mode, make_inputs, torch_dtype
from warmup.compiled.key import model_key
from warmup.compiled.package_files import PACKAGE, PackageFailed, PackageInfo
from warmup.compiled.uncompiled import build_uncompiled, module_tensor
from warmup.core.manifest import ModelEntry
from warmup.core.settings import Settings

log = logging.getLogger(__name__)

PRIME_CALLS = 2  # the first call loads the package's kernels; the second is a steady one


class PackageRefused(ValueError):
    """A call the package does not serve (an input outside what it was made for)."""


def package_folder(settings: Settings, name: str) -> Path:
    """Where the model ``name``'s package is in this pod."""
    return settings.folders.folder("package_dir") / name


def usable(entry: ModelEntry, settings: Settings) -> PackageInfo | str:
    """The info of ``entry``'s package in this pod when it was made for the model's key
    and this process's torch (read without importing the compiler); else why not."""
    import torch  # torch loads on first use

    folder = package_folder(settings, entry.name)
    found = package_files.read(folder)
    if found is None:
        return f"no package in {folder}"
    if isinstance(found, PackageFailed):
        return f"the warmup could not package it ({found.stage}): {found.reason}"
    try:
        key = model_key(entry).digest
    except ValueError as e:
        return f"it has no key: {e}"
    if found.key_digest != key:
        return f"its package was made for other code or shapes (key {found.key_digest[:12]})"
    if found.torch != str(torch.__version__):
        return f"its package was made by torch {found.torch}, this process runs {torch.__version__}"
    return found


def load_packaged(
    entry: ModelEntry, settings: Settings, *, device: Any, prime: bool = True,
    learned: Sequence[dict[str, int]] = (),
) -> ServedPackage | str:  # fmt: skip
    """``entry`` served from its package on ``device``, primed at every declared shape
    (then each of ``learned`` inside the package's ranges); or why it cannot be (no
    usable package, another device, a build that cannot give the weights)."""
    import torch  # torch loads on first use

    info = usable(entry, settings)
    if isinstance(info, str):
        return info
    kind = getattr(device, "type", str(device))
    if info.device != kind:
        return f"its package was made for {info.device}, this process serves on {kind}"
    if info.gpu and kind == "cuda" and info.gpu != torch.cuda.get_device_name(device):
        return f"its package was made on {info.gpu}, not {torch.cuda.get_device_name(device)}"
    started = time.perf_counter()
    built = build_uncompiled(entry, device)  # ValueError: the build's own failure
    if built.unpackaged and info.weights == "module":
        return f"its build cannot give the package's weights: {built.unpackaged}"
    loader = _loader(package_folder(settings, entry.name) / PACKAGE, device)
    if info.weights == "module":
        _give_weights(loader, built.model, info)
    served = ServedPackage(entry, info, loader, device, built.model)
    served.load_s = time.perf_counter() - started
    if prime:
        served.prime_all(learned)
    log.info("%s", served.describe())
    return served


def _loader(path: Path, device: Any) -> Any:
    import torch  # torch loads on first use

    index = device.index if getattr(device, "type", "") == "cuda" else -1
    index = torch.cuda.current_device() if index is None else index
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, index)


def _give_weights(loader: Any, module: Any, info: PackageInfo) -> None:
    """The module's tensors handed to the package by the names it lists, used in place
    (no copy where this torch allows it); ValueError naming one the module lacks."""
    constants = {}
    for name in loader.get_constant_fqns():
        tensor = module_tensor(module, name)
        if tensor is None:
            raise ValueError(f"the model's module has no tensor {name!r} the package needs")
        constants[name] = tensor.detach()
    try:
        loader.load_constants(constants, False, True, True)  # in place: the module's own
    except TypeError:  # an older torch: no user_managed, the package copies them
        loader.load_constants(constants, False, True)


@dataclass(frozen=True)
class _Graph:
    graph: Any
    inputs: list[Any]
    outputs: list[Any]


class ServedPackage:
    """A declared model served from its package: a call checked, run under the model's
    mode, its outputs in the shape the model returns them."""

    served_as = "package"

    def __init__(
        self, entry: ModelEntry, info: PackageInfo, loader: Any, device: Any, module: Any
    ) -> None:
        from torch.utils import _pytree  # torch loads on first use

        self.entry, self.info, self.loader, self.device = entry, info, loader, device
        self.module = module  # holds the weights the package reads in place
        self.out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])
        self.graphs: dict[tuple[tuple[int, ...], ...], _Graph] = {}
        self.use_graphs = info.cuda_graphs and getattr(device, "type", "") == "cuda"
        self.load_s = self.prime_s = 0.0
        self.calls = 0  # priming calls
        self._lock = threading.Lock()  # a graph's buffers serve one call at a time
        self.primed = None  # the compiled path's record: not made here

    @property
    def name(self) -> str:
        return self.entry.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise PackageRefused(f"model {self.name}: a package takes its inputs by position")
        check_inputs(self.entry, self.info, args, self.device)
        graph = self.graphs.get(_shapes(args)) if self.graphs else None
        if graph is not None:
            return self._replay(graph, args)
        with grad_mode(self.entry):
            outputs = self.loader.run(list(args))
        return self._unflatten(outputs)

    def _replay(self, graph: _Graph, args: Sequence[Any]) -> Any:
        with self._lock, grad_mode(self.entry):
            for static, given in zip(graph.inputs, args, strict=True):
                static.copy_(given)
            graph.graph.replay()
            outputs = [out.clone() for out in graph.outputs]  # the next replay overwrites them
        return self._unflatten(outputs)

    def _unflatten(self, outputs: list[Any]) -> Any:
        from torch.utils import _pytree  # torch loads on first use

        return _pytree.tree_unflatten(outputs, self.out_spec)

    def prime_all(self, learned: Sequence[dict[str, int]] = ()) -> None:
        """Every declared shape run until steady (its kernels loaded) and, where the
        model's mode asks, its CUDA graph captured; then each learned shape inside the
        package's ranges."""
        started = time.perf_counter()
        inside = [d for d in learned if _inside(d, self.info.ranges)]
        for dims in [*self.entry.expand(), *inside]:
            self.prime(dims)
        self.prime_s = time.perf_counter() - started

    def prime(self, dims: dict[str, int]) -> None:
        import torch  # torch loads on first use

        inputs = make_inputs(self.entry, dims, self.device)
        for _ in range(PRIME_CALLS):
            self(*inputs)
            self.calls += 1
        if self.use_graphs and _shapes(inputs) not in self.graphs:
            self.graphs[_shapes(inputs)] = self._capture(inputs)
        if getattr(self.device, "type", "") == "cuda":
            torch.cuda.synchronize(self.device)

    def _capture(self, inputs: list[Any]) -> _Graph:
        import torch  # torch loads on first use

        static = [t.clone() for t in inputs]
        graph = torch.cuda.CUDAGraph()
        with grad_mode(self.entry), torch.cuda.graph(graph):
            outputs = self.loader.run(static)
        return _Graph(graph, static, list(outputs))

    def describe(self) -> str:
        graphs = f", {len(self.graphs)} CUDA graphs" if self.graphs else ""
        return (
            f"model {self.name}: served from its package (loaded in {self.load_s:.2f} s, "
            f"primed {self.calls} calls in {self.prime_s:.2f} s{graphs}; weights from the "
            f"{self.info.weights})"
        )


def check_inputs(entry: ModelEntry, info: PackageInfo, args: Sequence[Any], device: Any) -> None:
    """:class:`PackageRefused` unless ``args`` are what the package serves: one tensor
    per declared input, its dtype, rank and device, each size static or inside its
    dim's range, a dim equal wherever it appears."""
    import torch  # torch loads on first use

    if len(args) != len(entry.inputs):
        raise PackageRefused(
            f"model {entry.name}: {len(args)} inputs given, its package takes {len(entry.inputs)}"
        )
    seen: dict[str, int] = {}
    for i, (spec, given) in enumerate(zip(entry.inputs, args, strict=True)):
        where = f"model {entry.name}: input {i}"
        if not isinstance(given, torch.Tensor):
            raise PackageRefused(f"{where} is a {type(given).__name__}, not a tensor")
        if given.dtype != torch_dtype(spec.dtype):
            raise PackageRefused(f"{where} is {given.dtype}, its package takes {spec.dtype}")
        if given.device.type != getattr(device, "type", str(device)):
            raise PackageRefused(f"{where} is on {given.device}, its package serves {device}")
        if given.dim() != len(spec.shape):
            raise PackageRefused(
                f"{where} has {given.dim()} dims, its package takes {len(spec.shape)}"
            )
        for axis, size in enumerate(spec.shape):
            _check_size(where, axis, size, int(given.shape[axis]), info.ranges, seen)


def _check_size(
    where: str, axis: int, size: int | str, got: int,
    ranges: dict[str, tuple[int, int]], seen: dict[str, int],
) -> None:  # fmt: skip
    if isinstance(size, int):
        if got != size:
            raise PackageRefused(f"{where}: size {got} at axis {axis}, its package takes {size}")
        return
    low, high = ranges[size]
    if not low <= got <= high:
        raise PackageRefused(
            f"{where}: {size}={got} is outside its package's range {low}..{high} (the "
            "manifest's declared dims); declare it and warm again"
        )
    if seen.setdefault(size, got) != got:
        raise PackageRefused(f"{where}: {size}={got} here but {seen[size]} in an earlier input")


def _inside(dims: dict[str, int], ranges: dict[str, tuple[int, int]]) -> bool:
    return all(
        name in ranges and ranges[name][0] <= v <= ranges[name][1] for name, v in dims.items()
    )


def _shapes(args: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(a.shape) for a in args)
