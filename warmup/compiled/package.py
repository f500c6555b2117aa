"""Making a declared model's package: ``torch.export`` with the manifest's dims dynamic
over their declared range, then an AOTInductor package compiled for this host.

    made = make_package(entry, key_digest, device, folder)   # PackageInfo or PackageFailed

The model is built with ``torch.compile`` stood in for (``warmup.compiled.uncompiled``):
what the build hands the compiler is exported, with the options it asked for
(``max-autotune`` tunes while the package compiles). Each input's dims that the manifest
declares with more than one value are dynamic from their smallest to their largest value,
so an undeclared size in between is served too; one value is a static size. The export
runs at the largest declared value of each dim. The weights stay out of the package
(``aot_inductor.package_constants_in_so`` off): the server's module gives them, by the
names the package lists, unless the manifest's ``package_weights`` asks for a copy in the
package (or this torch cannot leave them out). The package is then loaded and run once
in a fresh process (``warmup.compiled.package_probe``): a native loader that crashes on
it must crash there, not in a server. A model that cannot be exported, compiled or
loaded gets a :class:`~warmup.compiled.package_files.PackageFailed` with the stage and
the reason, never an exception: ``auto`` serves it through ``torch.compile``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from registry.core.errors import first_line
from warmup.compiled.inputs import make_inputs
from warmup.compiled.package_files import (
    PACKAGE,
    PackageFailed,
    PackageInfo,
    write_failed,
    write_info,
)
from warmup.compiled.package_probe import probe
from warmup.compiled.uncompiled import Uncompiled, build_uncompiled, module_tensor
from warmup.core.manifest import ModelEntry

log = logging.getLogger(__name__)

GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that record CUDA graphs
AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
CONSTANTS_IN_SO = "aot_inductor.package_constants_in_so"


def make_package(
    entry: ModelEntry, key_digest: str, device: Any, folder: Path
) -> PackageInfo | PackageFailed:
    """``entry``'s package written into ``folder`` for ``key_digest``, with what it is;
    or why it has none, written there instead. Never raises for the model's own faults."""
    import torch  # torch loads on first use

    def failed(stage: str, reason: str) -> PackageFailed:
        log.warning("model %s: no package (%s failed): %s", entry.name, stage, reason)
        made = PackageFailed(
            name=entry.name, key_digest=key_digest, torch=str(torch.__version__),
            stage=stage, reason=reason[:500],
        )  # fmt: skip
        write_failed(folder, made)
        return made

    if entry.mode == "grad":
        return failed("build", "its mode is grad: a package has no backward")
    try:
        built = build_uncompiled(entry, device)
    except ValueError as e:
        return failed("build", str(e))
    if built.unpackaged:
        return failed("build", built.unpackaged)
    clock = time.perf_counter()
    try:
        program = export(entry, built.model, device)
    except Exception as e:  # the model's code: a dim it specialises, an op export lacks
        log.debug("model %s: export failed", entry.name, exc_info=e)  # --debug: where
        return failed("export", _one_line(e))
    export_s, clock = time.perf_counter() - clock, time.perf_counter()
    options = inductor_options(built, weights_in_package=entry.package_weights)
    try:
        _compile(program, folder / PACKAGE, options)
    except Exception as e:  # a compiler error, a missing C++ toolchain
        log.debug("model %s: package compile failed", entry.name, exc_info=e)
        return failed("compile", _one_line(e))
    weights = {} if options.get(CONSTANTS_IN_SO, True) else weight_shapes(program, built.model)
    refused = probe(folder / PACKAGE, entry, weights, device)
    if refused:
        return failed("load", refused)
    info = PackageInfo(
        name=entry.name,
        key_digest=key_digest,
        torch=str(torch.__version__),
        triton=_triton_version(),
        device=getattr(device, "type", str(device)),
        gpu=_gpu(device),
        mode=entry.mode,
        ranges=entry.ranges(),
        inputs=[spec.model_dump(mode="json") for spec in entry.inputs],
        weights="package" if options.get(CONSTANTS_IN_SO, True) else "module",
        constants=constant_names(program),
        cuda_graphs=wants_graphs(built),
        options={k: v for k, v in options.items() if isinstance(v, (bool, int, float, str))},
        export_s=round(export_s, 3),
        compile_s=round(time.perf_counter() - clock, 3),
    )
    write_info(folder, info)
    log.info(
        "model %s: packaged in %.1f s (export %.1f s), weights from the %s",
        entry.name, info.export_s + info.compile_s, info.export_s, info.weights,
    )  # fmt: skip
    return info


def export(entry: ModelEntry, model: Any, device: Any) -> Any:
    """``model`` exported at the largest declared value of each dim, every dim declared
    with more than one value dynamic over its declared range."""
    import torch  # torch loads on first use

    ranges = entry.ranges()
    largest = {name: high for name, (_, high) in ranges.items()}
    inputs = make_inputs(entry, largest, device)
    dims = {
        name: torch.export.Dim(name, min=low, max=high)
        for name, (low, high) in ranges.items()
        if low < high
    }
    dynamic = tuple(
        {axis: dims[size] for axis, size in enumerate(spec.shape) if size in dims}
        for spec in entry.inputs
    )
    with torch.no_grad():
        return torch.export.export(model, tuple(inputs), dynamic_shapes=dynamic)


def inductor_options(built: Uncompiled, *, weights_in_package: bool) -> dict[str, Any]:
    """The Inductor settings the package is compiled with: the build's ``options`` (less
    those of CUDA graphs, which the server records itself), ``max_autotune`` for the
    modes that tune, and whether the weights go in the package."""
    from torch._inductor import config  # the compiler: only where a package is made

    given = built.options
    options: dict[str, Any] = {
        k: v for k, v in dict(given.get("options") or {}).items() if "cudagraph" not in k
    }
    if given.get("mode") in AUTOTUNE_MODES:
        options["max_autotune"] = True
    if hasattr(config.aot_inductor, CONSTANTS_IN_SO.rpartition(".")[2]):
        options[CONSTANTS_IN_SO] = weights_in_package
    return options


def wants_graphs(built: Uncompiled) -> bool:
    """Whether the build's ``torch.compile`` asked for CUDA graphs (its mode, or
    ``triton.cudagraphs`` in its options)."""
    given = built.options
    options = dict(given.get("options") or {})
    return bool(given.get("mode") in GRAPH_MODES or options.get("triton.cudagraphs"))


def constant_names(program: Any) -> list[str]:
    """The names of the weights a package takes from the server's module: parameters,
    buffers and tensor attributes, as the module names them."""
    signature = program.graph_signature
    found = {
        *signature.inputs_to_parameters.values(),
        *signature.inputs_to_buffers.values(),
        *signature.inputs_to_lifted_tensor_constants.values(),
    }
    return sorted(found)


def weight_shapes(program: Any, module: Any) -> dict[str, tuple[list[int], str]]:
    """Each weight the package takes from the module: its shape and dtype's name."""
    tensors = {name: module_tensor(module, name) for name in constant_names(program)}
    return {
        name: (list(t.shape), str(t.dtype).removeprefix("torch."))
        for name, t in tensors.items()
        if t is not None
    }


def _compile(program: Any, path: Path, options: dict[str, Any]) -> None:
    from torch._inductor import aoti_compile_and_package  # the compiler: only here

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".partial-{path.name}")  # the compiler wants a .pt2 name
    aoti_compile_and_package(program, package_path=str(partial), inductor_configs=dict(options))
    partial.replace(path)


def _triton_version() -> str:
    try:
        import triton  # triton loads on first use; a CPU build may lack it

        return str(triton.__version__)
    except ImportError:
        return "none"


def _gpu(device: Any) -> str:
    import torch  # torch loads on first use

    if getattr(device, "type", device) != "cuda":
        return ""
    return str(torch.cuda.get_device_name(device))


def _one_line(error: BaseException) -> str:
    return first_line(error, 500)
