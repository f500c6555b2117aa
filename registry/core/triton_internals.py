"""Every piece of Triton's internals the project touches, in one place (Triton 3.4–3.9).

Knobs (the interpreter, autotune-result caching, the JIT's compile hook), the
autotuner class the compile guard wraps, ahead-of-time compiles for a target, the
compiler's cache key and ptxas version of the fingerprint, and the C compiler Triton
builds its driver stubs with. When a Triton release moves one of them, this module is
the one to change. Triton is imported inside each function: importing this module costs
nothing (the sidecar's registry imports it).
"""

from __future__ import annotations

import json
import os
import pkgutil
import shutil
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Called as hook(key=, repr=, fn=, compile=, is_manual_warmup=, already_compiled=).
JITHook = Callable[..., Any]


def interpreting() -> bool:
    """True when ``@triton.jit`` makes interpreted kernels (TRITON_INTERPRET): they run on
    CPU tensors. Triton reads it at each decoration, its own library's included, which
    happen when ``triton`` is imported: so it must be on before that."""
    if "triton" not in sys.modules:
        return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
    from triton import knobs  # triton loads on first use

    return bool(knobs.runtime.interpret)


def enable_interpreter() -> None:
    """Turn the interpreter on for this process (and its children). Only effective while
    ``triton`` is not imported yet: ValueError otherwise."""
    if "triton" in sys.modules and not interpreting():
        raise ValueError("triton is already imported without TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"


def autotune_results_cached() -> bool | None:
    """Whether Triton's own ``@triton.autotune`` results are cached on disk
    (TRITON_CACHE_AUTOTUNING); None when this Triton has no such knob."""
    try:
        from triton import knobs  # triton loads on first use

        return bool(knobs.autotuning.cache)
    except (ImportError, AttributeError):
        return None


def cache_autotune_results() -> bool:
    """Turn Triton's autotune-result caching on; False when this Triton cannot."""
    try:
        from triton import knobs  # triton loads on first use

        knobs.autotuning.cache = True
        return True
    except (ImportError, AttributeError):
        return False


def jit_cache_hook() -> JITHook | None:
    """The hook the JIT calls before each compile (``knobs.runtime.jit_cache_hook``);
    returning True skips the compile."""
    from triton import knobs  # triton loads on first use

    return knobs.runtime.jit_cache_hook  # type: ignore[no-any-return]


def set_jit_cache_hook(hook: JITHook | None) -> None:
    from triton import knobs  # triton loads on first use

    knobs.runtime.jit_cache_hook = hook


def compilation_listener() -> Any:
    """The listener ``triton.compile`` calls with whether its disk cache had the kernel
    (``knobs.compilation.listener``); None where this Triton has none."""
    from triton import knobs  # triton loads on first use

    return getattr(knobs.compilation, "listener", None)


def set_compilation_listener(listener: Any) -> None:
    from triton import knobs  # triton loads on first use

    if hasattr(knobs.compilation, "listener"):
        knobs.compilation.listener = listener


def describe_jit_compile(hook: Mapping[str, Any], limit: int = 400) -> str:
    """What the JIT hands its hook, compactly: argument types with their alignment
    attributes, constexpr values, launch options (the key when the layout is unknown)."""
    try:
        info = hook["compile"]
        names = list(info["signature"])
        consts = {_arg(names, path): value for path, value in info["constants"].items()}
        attrs = {_arg(names, path): attr for path, attr in (info["configs"] or [{}])[0].items()}
        args = [
            f"{n}={consts[n]}"
            if n in consts
            else f"{n}: {kind}" + "".join(f" {k}={v}" for k, v in attrs.get(n, ()))
            for n, kind in info["signature"].items()
        ] + [f"{n}={v}" for n, v in consts.items() if n not in names]  # inside tuple arguments
        options = (f"{k}={info[k]}" for k in ("num_warps", "num_stages", "num_ctas") if k in info)
        text = f"{', '.join(args)}; {' '.join(options)}"
    except (KeyError, TypeError, ValueError, IndexError):  # a layout we do not know
        text = str(hook.get("key"))
    manual = "; explicit kernel.warmup" if hook.get("is_manual_warmup") else ""
    return text[:limit] + manual


def _arg(names: list[str], path: tuple[int, ...]) -> str:
    return names[path[0]] + "".join(f"[{i}]" for i in path[1:])


def hooked_specialization(hook: Mapping[str, Any]) -> str:
    """The JIT's serialised specialisation in a compile hook's arguments (JSON text that
    :func:`compile_specialization` compiles again, in another process)."""
    return str(hook["compile"]["specialization_data"])


def compile_specialization(data: str, target: Any) -> None:
    """Rebuild the JIT's ``ASTSource`` from its serialised specialisation and compile it
    for ``target`` into TRITON_CACHE_DIR."""

    import triton.language as tl  # triton loads on first use

    spec = json.loads(data)

    def decode(value: Any) -> Any:
        if isinstance(value, str) and tl.dtype.is_dtype(value):
            return tl.dtype(value)
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(_tuples(value["constexpr"]))
        if isinstance(value, dict) and "jit_function" in value:
            return pkgutil.resolve_name(value["jit_function"])
        return _tuples(value)

    compile_for(
        pkgutil.resolve_name(spec["name"]),
        signature={k: _tuples(v) for k, v in spec["signature"].items()},
        constexprs={
            tuple(k): decode(v)
            for k, v in zip(spec["constant_keys"], spec["constant_vals"], strict=True)
        },
        attrs=dict(zip(map(tuple, spec["attrs_keys"]), spec["attrs_vals"], strict=True)),
        target=target,
        options={k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()},
    )


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def autotuner_class() -> type:
    """``triton.runtime.autotuner.Autotuner``, whose ``run`` and ``_bench`` the compile
    guard wraps."""
    from triton.runtime.autotuner import Autotuner  # triton loads on first use

    return Autotuner  # type: ignore[no-any-return]


def current_target() -> Any:
    """The active driver's target (this process's GPU)."""
    from triton.runtime import driver  # triton loads on first use

    return driver.active.get_current_target()


def compile_for(
    fn: Any,
    *,
    signature: Mapping[str, Any],
    constexprs: Mapping[Any, Any],
    target: Any,
    options: Mapping[str, Any],
    attrs: Mapping[Any, Any] | None = None,
) -> Any:
    """Compile a ``@triton.jit`` function for ``target`` (a ``GPUTarget``; no GPU needed)
    into TRITON_CACHE_DIR, as the JIT would for the same specialisation."""
    import triton  # triton loads on first use
    from triton.compiler import ASTSource  # triton loads on first use

    source = ASTSource(fn, dict(signature), dict(constexprs), dict(attrs or {}))
    return triton.compile(source, target=target, options=dict(options))


def gpu_target(arch: int, warp_size: int = 32) -> Any:
    """``GPUTarget("cuda", arch, warp_size)``: compile for a GPU this machine need not have."""
    from triton.backends.compiler import GPUTarget  # triton loads on first use

    return GPUTarget("cuda", arch, warp_size)


def bound_specialization(
    kernel: Any, args: Sequence[Any], options: Mapping[str, Any], target: Any
) -> str:
    """The specialisation the JIT would compile ``kernel(*args, **options)`` as, for
    ``target``, asked of Triton's own binder (no GPU, no compile): two launches with the
    same answer share one variant."""

    from triton.compiler import make_backend  # triton loads on first use
    from triton.runtime.jit import create_function_from_signature  # triton loads on first use

    binder = create_function_from_signature(kernel.signature, kernel.params, make_backend(target))
    _, specialization, bound = binder(*args, **options)
    return json.dumps([kernel.__name__, specialization, sorted(bound.items())], default=str)


def compiler_key() -> str | None:
    """``triton_key()``: the hash of Triton's own sources in every cache key; None for
    builds that have none."""
    try:
        from triton.runtime.cache import triton_key  # triton loads on first use

        return str(triton_key())
    except Exception:  # older or vendor builds
        return None


def cache_env() -> dict[str, str]:
    """The environment knobs set in this process that enter Triton's cache keys (its
    ``get_cache_invalidating_env_vars``); {} where Triton does not say."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars  # triton loads on first use

        return {str(k): str(v) for k, v in get_cache_invalidating_env_vars().items()}
    except Exception:
        return {}


def libdevice_path() -> str:
    """The libdevice file Triton names in every CUDA kernel's options, and so in its
    cache key: a Triton installed at another path compiles every kernel again."""
    try:
        from triton import knobs  # triton loads on first use
        from triton.backends.nvidia import compiler  # triton loads on first use

        configured = knobs.nvidia.libdevice_path
        return str(configured or Path(compiler.__file__).parent / "lib" / "libdevice.10.bc")
    except Exception:
        return ""


def ptxas_version(arch: int) -> str | None:
    """The ptxas version Triton compiles ``sm_<arch>`` with (Triton memoises it per arch
    and asks with the device's: ask the same and share it)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version  # triton loads on first use

        try:
            version = get_ptxas_version(arch)
        except TypeError:  # Triton 3.4 takes no arch
            version = get_ptxas_version()
        return str(version).strip().splitlines()[-1]
    except Exception:
        return None


def c_compiler(env: Mapping[str, str]) -> str | None:
    """The C compiler Triton would run: ``$CC`` as given (even if it is not a compiler),
    else ``gcc``, else ``clang`` on PATH; None where Triton raises "Failed to find C compiler".

    Same rule throughout 3.4 to 3.9: early releases decide it inline in ``_build``, 3.9 in
    ``_find_compiler(language)`` (cached per process). All put ``knobs.build.impl`` (set only
    by code) first.
    """
    if "CC" in env:
        return env["CC"]
    path = env.get("PATH")
    return shutil.which("gcc", path=path) or shutil.which("clang", path=path)


def python_includes() -> list[str]:
    """Where Python.h is looked for: Triton's ``-I`` (the default scheme's ``include``, with
    Debian's ``posix_local`` read as ``posix_prefix``), then ``platinclude``."""
    scheme = sysconfig.get_default_scheme()
    paths = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)
    return list(dict.fromkeys([paths["include"], paths["platinclude"]]))


def stub_build_command(cc: str, src: Path, so: Path, includes: Sequence[str]) -> list[str]:
    """Triton's compile line for a stub, less the CUDA libraries (linked at launch)."""
    return [cc, str(src), "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", str(so)] + [
        f"-I{d}" for d in includes
    ]
