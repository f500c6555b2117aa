"""``triton-warmup registry ...``: inspect and move tuned configs. Needs no torch except
to detect this machine's fingerprint."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from registry import bundle, importers
from registry.entry import Entry
from registry.errors import RegistryError
from registry.fingerprint import Fingerprint, MatchPolicy, cpu_fingerprint
from registry.store import Store


def add_parser(subparsers: Any, *, default_store: Path, default_cache: Path) -> None:
    """Register ``registry`` and its commands on the top-level CLI."""
    top = subparsers.add_parser("registry", help="inspect and move tuned configs")
    top.add_argument(
        "--store",
        type=Path,
        default=default_store,
        help=f"registry folder (default {default_store})",
    )
    top.add_argument("--json", action="store_true", help="machine-readable output")
    cmds = top.add_subparsers(dest="registry_cmd", required=True, metavar="COMMAND")

    ls = cmds.add_parser("ls", help="list entries")
    ls.add_argument("--kernel", help="only this kernel")
    ls.set_defaults(handler=_ls)

    show = cmds.add_parser("show", help="show one entry with every measured config")
    show.add_argument("selector", help="part of the entry's path, e.g. 'ag_gemm/' or 'M4096'")
    show.set_defaults(handler=_show)

    imp = cmds.add_parser("import", help="import Triton or Triton-distributed tuning caches")
    imp.add_argument("format", choices=["triton-autotune", "triton-dist"])
    imp.add_argument("source", type=Path, help="a TRITON_CACHE_DIR or ~/.triton_dist/autotune")
    _fingerprint_option(imp)
    imp.set_defaults(handler=_import)

    fp = cmds.add_parser("fingerprint", help="print this machine's fingerprint")
    _fingerprint_option(fp)
    fp.set_defaults(handler=_fingerprint)

    rb = cmds.add_parser("rollback", help="undo the latest bundle install")
    rb.set_defaults(handler=_rollback)

    bun = cmds.add_parser("bundle", help="create, verify, install and list bundles")
    bcmds = bun.add_subparsers(dest="bundle_cmd", required=True, metavar="COMMAND")
    create = bcmds.add_parser("create", help="write the store's entries to an archive")
    create.add_argument("out", type=Path)
    create.add_argument("--name", required=True)
    create.add_argument("--version", required=True)
    create.add_argument("--kernel", help="only this kernel")
    create.add_argument("--triton-cache", type=Path, help="also carry these compile artifacts")
    create.set_defaults(handler=_bundle_create)
    ver = bcmds.add_parser("verify", help="check an archive without installing it")
    ver.add_argument("file", type=Path)
    ver.set_defaults(handler=_bundle_verify)
    ins = bcmds.add_parser("install", help="verify, then merge into the store atomically")
    ins.add_argument("file", type=Path)
    ins.add_argument("--force", action="store_true", help="install despite fingerprint mismatches")
    ins.add_argument(
        "--policy", type=MatchPolicy, default=MatchPolicy.EXACT, choices=list(MatchPolicy)
    )
    ins.add_argument(
        "--triton-cache",
        type=Path,
        default=default_cache,
        help=f"where artifacts go (default {default_cache})",
    )
    _fingerprint_option(ins, allow_none=True)
    ins.set_defaults(handler=_bundle_install)
    lst = bcmds.add_parser("list", help="bundles installed in the store")
    lst.set_defaults(handler=_bundle_list)


def _fingerprint_option(parser: argparse.ArgumentParser, *, allow_none: bool = False) -> None:
    extra = ", 'none' (no check)" if allow_none else ""
    parser.add_argument(
        "--fingerprint",
        default="detect",
        help=f"'detect' (this machine, imports torch), 'cpu', a JSON file{extra}",
    )


def run(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace, Store], Any] = args.handler
    result = handler(args, Store(args.store))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


def _resolve_fingerprint(spec: str) -> Fingerprint | None:
    if spec == "none":
        return None
    if spec == "cpu":
        return cpu_fingerprint()
    if spec == "detect":
        try:
            from registry.fingerprint import detect

            return detect()
        except ImportError:
            raise RegistryError(
                "Fingerprint 'detect' needs torch; pass --fingerprint FILE "
                "(from 'registry fingerprint --json' on a GPU node)."
            ) from None
    try:
        return Fingerprint.from_json(json.loads(Path(spec).read_text()))
    except (OSError, ValueError) as e:
        raise RegistryError(f"Fingerprint file '{spec}' unreadable: {e}") from None


def _ls(args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    entries = [e for e in store.entries() if not args.kernel or e.kernel == args.kernel]
    rows = [_row(e) for e in entries]
    if not args.json:
        _table(
            rows, ["kernel", "shape", "gpu", "software", "best", "median_ms", "source", "created"]
        )
        print(
            f"{len(rows)} entries in {store.root}"
            + (f"; {store.quarantined} quarantined" if store.quarantined else "")
        )
    return rows


def _row(e: Entry) -> dict[str, Any]:
    best = next((m for m in e.measurements if m.config == e.best and m.ok), None)
    return {
        "kernel": e.kernel,
        "shape": e.key_json,
        "gpu": e.fingerprint.gpu_slug(),
        "software": e.fingerprint.software_slug(),
        "best": e.best.label(),
        "median_ms": f"{best.median_ms:.4f}" if best else "-",
        "source": e.source,
        "created": e.created,
        "path": e.relpath().as_posix(),
    }


def _show(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    matches = [e for e in store.entries() if args.selector in e.relpath().as_posix()]
    if len(matches) != 1:
        paths = ", ".join(e.relpath().as_posix() for e in matches[:5]) or "none"
        raise RegistryError(
            f"Selector '{args.selector}' matches {len(matches)} entries (need 1): {paths}"
        )
    entry = matches[0]
    if not args.json:
        print(
            f"{entry.relpath()}\nkernel {entry.kernel}  key {entry.key_json}\n"
            f"source {entry.source}  host {entry.host}  created {entry.created}  "
            f"tuning {entry.tuning_seconds:.2f} s\nbest {entry.best.label()}"
        )
        rows = [
            {
                "config": m.config.label(),
                "median_ms": _ms(m.median_ms),
                "p20_ms": _ms(m.p20_ms),
                "p80_ms": _ms(m.p80_ms),
                "error": m.error or "",
            }
            for m in entry.measurements
        ]
        _table(rows, ["config", "median_ms", "p20_ms", "p80_ms", "error"])
    return entry.to_json()


def _ms(value: float) -> str:
    return "-" if value == float("inf") else f"{value:.4f}"


def _import(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    fingerprint = _resolve_fingerprint(args.fingerprint)
    assert fingerprint is not None
    load = (
        importers.import_triton_autotune
        if args.format == "triton-autotune"
        else importers.import_triton_dist
    )
    result = load(args.source, fingerprint)
    for error in result.errors:
        print(f"skipped {error}", file=sys.stderr)
    store.put_many(result.entries)
    if not result.entries and result.errors:
        raise RegistryError(f"Nothing imported from {args.source}: {len(result.errors)} bad files.")
    if not args.json:
        print(f"imported {len(result.entries)} entries from {args.source} into {store.root}")
    return {"imported": len(result.entries), "errors": result.errors}


def _fingerprint(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    fingerprint = _resolve_fingerprint(args.fingerprint)
    assert fingerprint is not None
    if not args.json:
        for name, value in fingerprint.flat().items():
            print(f"{name:28} {value}")
    return fingerprint.to_json()


def _rollback(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    info = store.rollback()
    if not args.json:
        print(
            f"rolled back {info['undoes']} ({(info.get('bundle') or {}).get('name')}); "
            f"current generation {info['id']}"
        )
    return info


def _bundle_create(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    entries = [e for e in store.entries() if not args.kernel or e.kernel == args.kernel]
    manifest = bundle.create(
        args.out,
        name=args.name,
        version=args.version,
        entries=entries,
        triton_cache=args.triton_cache,
    )
    if not args.json:
        print(
            f"wrote {args.out}: {len(entries)} entries, "
            f"{len(manifest['members']) - len(entries)} artifacts"
        )
    return manifest


def _bundle_verify(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    verified = bundle.verify(args.file)
    if not args.json:
        print(
            f"{args.file}: OK  {verified.name} {verified.version}  {len(verified.entries)} "
            f"entries  {len(verified.artifacts)} artifacts  sha256 {verified.sha256[:16]}"
        )
        for fp in verified.manifest.get("fingerprints", []):
            print(f"  covers {fp.get('gpu')} / {fp.get('software')}")
    return verified.manifest


def _bundle_install(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    info = bundle.install(
        args.file,
        store,
        expect=_resolve_fingerprint(args.fingerprint),
        policy=args.policy,
        force=args.force,
        triton_cache=args.triton_cache,
    )
    if not args.json:
        print(
            f"installed {info['bundle']['name']} {info['bundle']['version']} as generation "
            f"{info['id']}: {info['entries']} entries, {info['artifacts']} artifacts"
        )
    return info


def _bundle_list(args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    rows = []
    for g in bundle.installed(store):
        b = g.get("bundle") or {}
        rows.append(
            {
                "generation": g["id"],
                "kind": g["kind"],
                "bundle": b.get("name", ""),
                "version": b.get("version", ""),
                "created": g["created"],
                "current": "*" if g["current"] else "",
            }
        )
    if not args.json:
        _table(rows, ["generation", "kind", "bundle", "version", "created", "current"])
    return rows


def _table(rows: Sequence[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max([len(c), *(len(str(r[c])) for r in rows)]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in columns))
