"""The ``triton-warmup`` command line.

triton-warmup run       warm every manifest shape (init container); exit 0 when ready
triton-warmup serve     the sidecar: /healthz /readyz /metrics, bundle hot reload
triton-warmup validate  check a manifest, write nothing
triton-warmup registry  inspect and move tuned configs
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from registry import cli as registry_cli
from registry.errors import RegistryError
from warmup import logs
from warmup.manifest import ManifestError, load_manifest
from warmup.settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def build_parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-warmup", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="warm every manifest shape, then exit")
    _common(run, settings)
    run.add_argument("--world-size", type=int, help="ranks (default: from the manifest)")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], help="where to warm")

    serve = sub.add_parser("serve", help="the sidecar: probes, metrics, bundle reload")
    _common(serve, settings)
    serve.add_argument("--host", help=f"bind address (default {settings.metrics_host})")
    serve.add_argument("--port", type=int, help=f"port (default {settings.metrics_port})")

    validate = sub.add_parser("validate", help="check a manifest and print what it expands to")
    validate.add_argument("manifest", type=Path)
    validate.add_argument("--json", action="store_true")

    cache = settings.triton_cache_dir or settings.paths.triton_cache
    registry_cli.add_parser(sub, default_store=settings.registry_path, default_cache=cache)
    return parser


def _common(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument("--manifest", type=Path, help=f"default {settings.manifest}")
    parser.add_argument("--volume", type=Path, help=f"default {settings.volume}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = Settings()
    except ValidationError as e:
        print(f"triton-warmup: error: bad settings: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args = build_parser(settings).parse_args(argv)
    overrides = {
        k: v
        for k, v in (
            ("manifest", getattr(args, "manifest", None)),
            ("volume", getattr(args, "volume", None)),
            ("world_size", getattr(args, "world_size", None)),
            ("device", getattr(args, "device", None)),
        )
        if v is not None
    }
    settings = settings.model_copy(update=overrides)
    quiet = args.command not in ("run", "serve")  # registry commands print their own output
    logs.configure(settings.log_format, level=10 if args.verbose else 30 if quiet else 20)
    try:
        if args.command == "run":
            return _run(settings)
        if args.command == "serve":
            return _serve(settings, args)
        if args.command == "validate":
            return _validate(args)
        return registry_cli.run(args)
    except ManifestError as e:
        print(f"triton-warmup: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RegistryError as e:
        print(f"triton-warmup: error: {e}", file=sys.stderr)
        return EXIT_FAILED


def _run(settings: Settings) -> int:
    manifest = load_manifest(settings.manifest)  # before any GPU work or write
    from warmup.launch import RunError, run

    try:
        status = run(settings, manifest)
    except RunError as e:
        print(f"triton-warmup: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(summary(status))
    return EXIT_OK if status["state"] == "ready" else EXIT_FAILED


def summary(status: dict[str, Any]) -> str:
    sources = ", ".join(f"{n} {s}" for s, n in sorted(status.get("sources", {}).items()))
    line = (
        f"warmup {status['state']}: {len(status.get('shapes', []))} shape-rank results "
        f"({sources or 'none'}), {status.get('benchmark_runs', 0)} benchmark runs, "
        f"{status.get('duration_s', 0):.1f} s"
    )
    failures = status.get("failures", [])
    return line + "".join(f"\n  FAILED {f}" for f in failures)


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from warmup.server import Sidecar

    sidecar = Sidecar(settings)
    port = sidecar.start(host=args.host, port=args.port)
    print(
        f"serving /healthz /readyz /metrics on {args.host or settings.metrics_host}:{port}; "
        f"watching {settings.bundles}",
        flush=True,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    sidecar.stop()
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.manifest, check_kernels=True)
    rows = [
        {
            "kernel": e.kernel,
            "dtype": e.dtype,
            "world_size": e.world_size,
            "policy": e.policy,
            "shapes": e.expand(),
        }
        for e in manifest.entries
    ]
    if args.json:
        print(json.dumps({"digest": manifest.digest(), "entries": rows}, indent=2))
    else:
        for row in rows:
            print(
                f"{row['kernel']:32} {row['dtype']} world {row['world_size']} "
                f"policy {row['policy']}: {len(row['shapes'])} shapes"
            )
        print(f"manifest {args.manifest} is valid (digest {manifest.digest()})")
    return EXIT_OK


def _one_line(error: ValidationError) -> str:
    return "; ".join(
        f"TRITON_WARMUP_{'_'.join(map(str, d['loc'])).upper()}: {d['msg']} (got {d.get('input')!r})"
        for d in error.errors()
    )


if __name__ == "__main__":
    sys.exit(main())
