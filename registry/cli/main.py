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
from collections.abc import Callable, Mapping
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


def add_parser(
    subparsers: Any,
    *,
    default_store: Path,
    default_roots: Mapping[str, Path],
    default_trust: tuple[Path | None, bool] = (None, False),
) -> None:
    """Register ``registry`` and its commands on the top-level CLI. ``default_roots``:
    each family's folder that ``bundle install`` and ``rollback`` use unless told
    (:func:`registry.cli.common.default_roots`). ``default_trust``:
    the trusted keys folder of bundles and the opt-out (TRITON_WARMUP_TRUSTED_BUNDLE_KEYS,
    else TRITON_WARMUP_TRUSTED_KEYS; TRITON_WARMUP_ALLOW_UNSIGNED) that ``bundle verify``
    and ``install`` use unless told."""
    top = subparsers.add_parser(
        "registry", help="inspect and move tuned configs and compiled models"
    )
    _store_options(top, default_store)
    top.set_defaults(default_inductor=default_roots.get("inductor"))  # registry ls, show
    common = [_json_flag()]
    cmds = top.add_subparsers(dest="registry_cmd", required=True, metavar="COMMAND")
    cli_listing.add_commands(cmds, common)
    _add_entry_commands(cmds, common)
    rb = cmds.add_parser("rollback", help="undo the latest bundle install", parents=common)
    cli_common.family_options(rb, default_roots, undone=True)
    rb.set_defaults(handler=_rollback)
    cli_bundle.add_commands(
        cmds,
        common,
        default_roots=default_roots,
        default_trust=default_trust,
    )


def _store_options(top: argparse.ArgumentParser, default_store: Path) -> None:
    """The options of ``registry`` itself: which store, and how to print."""
    top.add_argument("--store", type=Path, help=f"registry folder (default {default_store})")
    top.add_argument(
        "--create-store",
        action="store_true",
        help="make the store's folder if it is not there (default: exit 2 for a command "
        "that reads or writes it)",
    )
    top.set_defaults(default_store=default_store)
    top.add_argument("--json", action="store_true", help="machine-readable output")


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


def run(args: argparse.Namespace) -> int:
    """Run the parsed command: 0 done. Its errors propagate to the caller
    (``warmup.cli``), which ends by their class: :class:`BadInput` exits 2, a
    :class:`RegistryError` 1, each one line on stderr (``--debug``: its traceback)."""
    handler: Callable[[argparse.Namespace, Store], Any] = args.handler
    # _store_root refused every store the command may not make; a write makes the rest
    result = handler(args, Store(_store_root(args), create=True))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


def _store_root(args: argparse.Namespace) -> Path:
    """The store's folder. A command that reads or writes the store needs it there, or
    ``--create-store``: a mistyped path must not read as an empty store, nor start a new
    one. The store of a volume that is there may be missing (nothing stored yet): the
    default store, or a ``--store`` that is a volume's ``registry`` folder. A writer
    (import, install) makes it on its first write; those that never open it do not care."""
    root: Path = args.store or args.default_store
    if args.handler not in (*_READERS, *_WRITERS) or (
        args.handler is cli_bundle.create and cli_bundle.carries_more(args)
    ):
        return root
    of_a_volume = args.store is None or root == Volume(root.parent).registry
    if of_a_volume and not args.create_store and root.parent.is_dir():
        return root
    given = args.store is not None
    what = "--store" if given else "the default store"
    check = "the path" if given else "TRITON_WARMUP_VOLUME (or TRITON_WARMUP_REGISTRY_DIR)"
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
