"""The ``triton-warmup`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from registry import cli as registry_cli
from registry.errors import RegistryError
from warmup.settings import Settings


def build_parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-warmup", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cache = settings.triton_cache_dir or settings.paths.triton_cache
    registry_cli.add_parser(sub, default_store=settings.paths.registry, default_cache=cache)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = Settings()
    except ValidationError as e:
        print(f"triton-warmup: error: bad settings: {_one_line(e)}", file=sys.stderr)
        return 2
    args = build_parser(settings).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return registry_cli.run(args)
    except RegistryError as e:
        print(f"triton-warmup: error: {e}", file=sys.stderr)
        return 1


def _one_line(error: ValidationError) -> str:
    return "; ".join(
        f"TRITON_WARMUP_{'_'.join(map(str, d['loc'])).upper()}: {d['msg']} (got {d.get('input')!r})"
        for d in error.errors()
    )


if __name__ == "__main__":
    sys.exit(main())
