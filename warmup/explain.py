"""``triton-warmup explain``: before anything compiles, predict for each cache family
whether this host hits what the volume, the bundles and the remote tier hold, and name
the factor that makes a miss.

    triton-warmup explain --manifest M --volume V           # one line per family
    triton-warmup explain --manifest M --volume V --json    # the same, for machines

One line per cache family (``registry.families``, each module says what it compares;
``registry.core.explain.FACTORS`` lists the factors, in the order named): tuned configs,
Triton's kernels and autotune results, each declared model's Inductor artifacts, each
declared folder.

The init container runs it before it warms (``triton-warmup run``): each line is
logged, and ``triton_warmup_cache_prediction{family,outcome}`` is 1 for each family's
outcome. Outcomes: hit (everything stored is usable here), partial, miss (nothing is),
empty (nothing stored).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from registry.families import Host
from warmup.caches.explain import detect_host, explain, volume_problem
from warmup.core.manifest import Manifest, load_manifest
from warmup.core.services import Services
from warmup.core.settings import Settings

__all__ = ["Host", "explain"]

# ---- the command, the log and the metric --------------------------------------------------


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], settings: Settings
) -> None:
    """Register ``explain`` on the top-level CLI."""
    parser = sub.add_parser(
        "explain", help="predict each cache family's hit or miss on this host, and why"
    )
    parser.add_argument(
        "--manifest", type=Path, help="the shape manifest (TRITON_WARMUP_MANIFEST); required"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help=f"whose Triton cache is read beside the volume's (default {settings.paths.work_dir})",
    )
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], help=f"default {settings.run.device}"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(settings: Settings, args: argparse.Namespace) -> int:
    """Print the predictions; 0 whatever they are (a miss is information, not an error).
    A manifest given (``--manifest``, TRITON_WARMUP_MANIFEST) must be readable
    (:class:`warmup.core.manifest.ManifestError`: exit 2); a volume that is no volume is
    predicted all the same, with a warning on stderr that says so."""
    manifest = _manifest(settings)
    problem = volume_problem(settings.paths.volume)
    if problem:
        print(f"triton-warmup: warning: {problem}", file=sys.stderr)
    services = Services(settings)  # the command's, built once: its entry point
    predictions = explain(
        services,
        manifest,
        detect_host(settings, manifest),
        remote=services.remote,
    )
    if args.json:
        print(json.dumps({"predictions": [p.to_json() for p in predictions]}, indent=2))
    else:
        print("\n".join(p.line() for p in predictions))
    return 0


def _manifest(settings: Settings) -> Manifest | None:
    """The manifest; None when none was given and the default one is not there."""
    if settings.given("manifest") or settings.paths.manifest.exists():
        return load_manifest(settings.paths.manifest)  # a missing or unreadable one: bad input
    return None
