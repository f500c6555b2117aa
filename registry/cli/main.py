"""``triton-warmup registry ...``: inspect and move tuned configs and compiled models'
artifacts. Needs no torch except to detect this machine's fingerprint.

The commands live beside: ``ls`` and ``show`` in :mod:`registry.cli.listing`, ``bundle``
and ``keys`` in :mod:`registry.cli.bundle`; what they share in :mod:`registry.cli.common`.
This module wires them (:func:`add_parser`), runs them (:func:`run`) and holds the small
ones: ``import``, ``fingerprint`` and ``rollback``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry.bundles import bundle
from registry.cli import bundle as cli_bundle
from registry.cli import common as cli_common
from registry.cli import listing as cli_listing
from registry.core.errors import BadInput
from registry.core.volume import MissingFolder, Volume, existing_folder
from registry.storage import importers
from registry.storage.store import Store

IMPORTS = {  # format -> (importer, what its source folder holds)
    "triton-autotune": (
        importers.import_triton_autotune,
        "a TRITON_CACHE_DIR folder with *.autotune.json files",
    ),
    "triton-dist": (
        importers.import_triton_dist,
        "a folder like ~/.triton_dist/autotune with <fn>/<hash>.json files",
    ),
}


def add_parser(subparsers: Any, *, default_trust: tuple[Path | None, bool] = (None, False)) -> None:
    """Register ``registry`` and its commands on the top-level CLI. ``default_trust``:
    the trusted keys folder of bundles and the opt-out (TRITON_WARMUP_TRUSTED_BUNDLE_KEYS,
    else TRITON_WARMUP_TRUSTED_KEYS; TRITON_WARMUP_ALLOW_UNSIGNED) that ``bundle verify``
    and ``install`` use unless told. Where the commands work (the store, each family's
    folder) is decided when one runs (:func:`run`)."""
    top = subparsers.add_parser(
        "registry", help="inspect and move tuned configs and compiled models"
    )
    common = [_json_flag(), _store_options()]
    _store_options(top)
    cmds = top.add_subparsers(dest="registry_cmd", required=True, metavar="COMMAND")
    cli_listing.add_commands(cmds, common)
    _add_entry_commands(cmds, common)
    rb = cmds.add_parser("rollback", help="undo the latest bundle install", parents=common)
    cli_common.family_options(rb, undone=True)
    rb.set_defaults(handler=_rollback, family_defaults="put")
    cli_bundle.add_commands(cmds, common, default_trust=default_trust)


def _store_options(top: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The store's options, on ``registry`` and (``top`` None: as a parent parser) on
    each of its commands, so that they are taken before or after the command; SUPPRESS
    keeps a command from undoing one given before it."""
    parser = top or argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--store",
        type=Path,
        default=argparse.SUPPRESS,
        help="the registry folder (default <volume>/registry: --volume, "
        "TRITON_WARMUP_VOLUME or TRITON_WARMUP_REGISTRY_DIR); a volume's registry folder "
        "also names its volume",
    )
    parser.add_argument(
        "--create-store",
        action="store_true",
        default=argparse.SUPPRESS,
        help="make the store's folder if it is not there (default: exit 2 for a command "
        "that reads or writes it)",
    )
    if top is not None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _json_flag() -> argparse.ArgumentParser:
    """The parent parser that gives every command ``--json`` too; SUPPRESS keeps it from
    undoing a ``--json`` given before the command."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    return flags


def _add_entry_commands(
    cmds: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    """``import`` and ``fingerprint``: entries from other tuning caches, this machine's
    fingerprint."""
    imp = cmds.add_parser(
        "import", help="import Triton or Triton-distributed tuning caches", parents=common
    )
    imp.add_argument("format", choices=list(IMPORTS))
    imp.add_argument("source", type=Path, help="a TRITON_CACHE_DIR or ~/.triton_dist/autotune")
    cli_common.fingerprint_option(imp)
    imp.set_defaults(handler=_import)

    fp = cmds.add_parser("fingerprint", help="print this machine's fingerprint", parents=common)
    cli_common.fingerprint_option(fp)
    fp.set_defaults(handler=_fingerprint)


def run(args: argparse.Namespace, place: cli_common.Place | None = None) -> int:
    """Run the parsed command where ``place`` says unless its options say
    (:class:`registry.cli.common.Place`): 0 done. Its errors propagate to the caller
    (``warmup.cli``), which ends by their class: :class:`BadInput` exits 2, a
    :class:`RegistryError` 1, each one line on stderr (``--debug``: its traceback)."""
    place = place or cli_common.Place()
    args.store = getattr(args, "store", None)
    args.create_store = getattr(args, "create_store", False)
    args.named_volume = cli_common.named_volume(args, place)
    cli_common.fill_family_defaults(args, place)
    handler: Callable[[argparse.Namespace, Store | None], Any] = args.handler
    root = _store_root(args, place)
    # _store_root refused every store the command may not make; a write makes the rest
    result = handler(args, None if root is None else Store(root, create=True))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


NO_VOLUME = (
    "no volume named: give --volume VOLUME (or --store REGISTRY), or set TRITON_WARMUP_VOLUME"
)


def _store_root(args: argparse.Namespace, place: cli_common.Place) -> Path | None:
    """The store's folder; None for a command that needs none. A command that reads or
    writes the store needs it named and there, or ``--create-store``: a mistyped path
    must not read as an empty store, nor start a new one. The store of a volume that is
    there may be missing (nothing stored yet): the volume's own, or a ``--store`` that is
    a volume's ``registry`` folder. A writer (import, install) makes it on its first
    write; those that never open it do not care."""
    root: Path | None = args.store or place.store
    if args.handler not in (*_READERS, *_WRITERS):
        return root
    if args.handler is cli_bundle.create and cli_bundle.carries_more(args):
        return root  # the caches alone make a bundle: a store, if any, adds its entries
    if root is None:
        raise BadInput(NO_VOLUME + ".")
    of_a_volume = args.store is None or root == Volume(root.parent).registry
    if of_a_volume and not args.create_store and root.parent.is_dir():
        return root
    option = getattr(args, "volume", None) is not None
    what = "--store" if args.store else "the store of --volume" if option else "the default store"
    check = (
        "the path"
        if args.store or option
        else "TRITON_WARMUP_VOLUME (or TRITON_WARMUP_REGISTRY_DIR)"
    )
    fix = f"check {check}, or create an empty store with --create-store"
    writes = args.handler in _WRITERS
    try:
        return existing_folder(root, what=what, create=args.create_store and not writes, fix=fix)
    except MissingFolder as e:
        if writes and args.create_store and not root.exists():
            return root  # made by its first write: an import of nothing leaves none
        raise BadInput(str(e)) from None


def _import(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """Import each good file, skip each bad one with one line on stderr; exit 0 when
    every file imported, 2 (bad input) when any was skipped, after the good ones."""
    load, holds = IMPORTS[args.format]
    source = cli_common.existing(args.source, folder=True, what="import source", expected=holds)
    cli_common.creatable(store.root, folder=True, what="--store")
    result = load(source, cli_common.resolve_fingerprint(args.fingerprint))
    for error in result.errors:
        print(f"skipped {error}", file=sys.stderr)
    if result.entries:
        store.put_many(result.entries)
    skipped = len(result.errors)
    report = {"imported": len(result.entries), "files": result.files, "errors": result.errors}
    if args.json:
        if skipped:  # run() prints it on success only
            print(json.dumps(report, indent=2, sort_keys=True))
    elif result.entries or skipped:
        names = ", ".join(e.split(": ", 1)[0].rsplit("/", 1)[-1] for e in result.errors[:5])
        more = f" and {skipped - 5} more" if skipped > 5 else ""
        print(
            f"imported {len(result.entries)} entries from {result.files} files in {source} "
            f"into {store.root}" + (f"; skipped {skipped} files: {names}{more}" if skipped else "")
        )
    else:
        print(f"nothing to import from {source}: expected {holds}; store unchanged")
    if skipped:
        raise BadInput(
            f"{skipped} files in {source} skipped (each named above), "
            f"{len(result.entries)} entries imported."
        )
    return report


def _fingerprint(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    fingerprint = cli_common.resolve_fingerprint(args.fingerprint)
    if not args.json:
        for name, value in fingerprint.flat().items():
            print(f"{name:28} {value}")
    return fingerprint.to_json()


def _rollback(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    info = bundle.rollback(store, roots=cli_common.roots(args))
    if not args.json:
        print(
            f"rolled back {info['undoes']} ({(info.get('bundle') or {}).get('name')}); "
            f"current generation {info['id']}"
        )
    return info


_READERS = (  # read the store's entries
    cli_listing.ls,
    cli_listing.show,
    cli_bundle.create,
    cli_bundle.list_installed,
    _rollback,
)
_WRITERS = (_import, cli_bundle.install)  # write entries: never into a store nobody asked for
