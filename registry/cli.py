"""``triton-warmup registry ...``: inspect and move tuned configs and compiled models'
artifacts. Needs no torch except to detect this machine's fingerprint."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from registry import atomic, bundle, bundle_inductor, importers, inductor_cache, signing
from registry.entry import Entry
from registry.errors import BadInput, RegistryError
from registry.fingerprint import Fingerprint, MatchPolicy, cpu_fingerprint
from registry.store import Store
from registry.volume import MissingFolder, Volume, existing_folder

MAX_FINGERPRINT_BYTES = 64 * 2**10  # a fingerprint's JSON is ~1 KiB
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
    default_cache: Path,
    default_inductor: Path,
    default_trust: tuple[Path | None, bool] = (None, False),
) -> None:
    """Register ``registry`` and its commands on the top-level CLI. ``default_trust``:
    the trusted keys folder of bundles and the opt-out (TRITON_WARMUP_TRUSTED_BUNDLE_KEYS,
    else TRITON_WARMUP_TRUSTED_KEYS; TRITON_WARMUP_ALLOW_UNSIGNED) that ``bundle verify``
    and ``install`` use unless told."""
    top = subparsers.add_parser(
        "registry", help="inspect and move tuned configs and compiled models"
    )
    _store_options(top, default_store)
    top.set_defaults(default_inductor=default_inductor)
    common = [_json_flag()]
    cmds = top.add_subparsers(dest="registry_cmd", required=True, metavar="COMMAND")
    _add_entry_commands(cmds, common)
    rb = cmds.add_parser("rollback", help="undo the latest bundle install", parents=common)
    _inductor_option(rb, default_inductor, "whose compiled models' indexes are put back")
    rb.set_defaults(handler=_rollback)
    bun = cmds.add_parser("bundle", help="create, verify, install and list bundles", parents=common)
    bcmds = bun.add_subparsers(dest="bundle_cmd", required=True, metavar="COMMAND")
    _add_bundle_create(bcmds, common)
    ver = bcmds.add_parser("verify", help="check an archive without installing it", parents=common)
    ver.add_argument("file", type=Path)
    _trust_options(ver, default_trust)
    ver.set_defaults(handler=_bundle_verify)
    ins = _add_bundle_install(bcmds, common, default_cache=default_cache, inductor=default_inductor)
    _trust_options(ins, default_trust)
    sig = bcmds.add_parser("sign", help="sign a bundle with an Ed25519 key", parents=common)
    sig.add_argument("file", type=Path)
    sig.add_argument("--key", type=Path, required=True, help="the private key (PEM)")
    sig.add_argument("--out", type=Path, help="the signed bundle (default: FILE, replaced)")
    sig.set_defaults(handler=_bundle_sign)
    lst = bcmds.add_parser("list", help="bundles installed in the store", parents=common)
    lst.set_defaults(handler=_bundle_list)
    keys = cmds.add_parser("keys", help="signing keys", parents=common)
    kcmds = keys.add_subparsers(dest="keys_cmd", required=True, metavar="COMMAND")
    gen = kcmds.add_parser(
        "generate", help="write a new Ed25519 key pair: NAME.key and NAME.pub", parents=common
    )
    gen.add_argument("--out", type=Path, required=True, help="the folder to write them in")
    gen.add_argument("--name", default="signing", help="the files' name (default signing)")
    gen.set_defaults(handler=_keys_generate)


def _trust_options(parser: argparse.ArgumentParser, defaults: tuple[Path | None, bool]) -> None:
    folder, allow = defaults
    parser.add_argument(
        "--trusted-keys",
        type=Path,
        default=folder,
        help="a folder of trusted public keys (*.pub): the bundle must be signed by one "
        "(default TRITON_WARMUP_TRUSTED_BUNDLE_KEYS, else TRITON_WARMUP_TRUSTED_KEYS: "
        f"{folder or 'unset, signatures not required'})",
    )
    parser.add_argument(
        "--allow-unsigned",
        action="store_true",
        default=allow,
        help="accept an unsigned bundle even with --trusted-keys (TRITON_WARMUP_ALLOW_UNSIGNED)",
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
    """``ls``, ``show``, ``import`` and ``fingerprint``: the commands about entries (and
    the compiled models stored beside them)."""
    ls = cmds.add_parser("ls", help="list entries and compiled models", parents=common)
    ls.add_argument("--kernel", help="only this kernel's entries (and no models)")
    ls.add_argument("--model", help="only this compiled model (and no entries)")
    _family_option(ls)
    ls.set_defaults(handler=_ls)

    show = cmds.add_parser(
        "show",
        help="show one entry with every measured config, or one compiled model's index",
        parents=common,
    )
    show.add_argument(
        "selector",
        help="part of the entry's path, e.g. 'ag_gemm/' or 'M4096', or of the model "
        "index's (models/<model>/<gpu>/<software>/<key>.json), e.g. 'models/mlp/'",
    )
    _family_option(show)
    show.set_defaults(handler=_show)

    imp = cmds.add_parser(
        "import", help="import Triton or Triton-distributed tuning caches", parents=common
    )
    imp.add_argument("format", choices=list(IMPORTS))
    imp.add_argument("source", type=Path, help="a TRITON_CACHE_DIR or ~/.triton_dist/autotune")
    _fingerprint_option(imp)
    imp.set_defaults(handler=_import)

    fp = cmds.add_parser("fingerprint", help="print this machine's fingerprint", parents=common)
    _fingerprint_option(fp)
    fp.set_defaults(handler=_fingerprint)


def _add_bundle_create(
    bcmds: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    """``bundle create``: which entries, artifacts and compiled models go in the archive."""
    create = bcmds.add_parser(
        "create", help="write the store's entries to an archive", parents=common
    )
    create.add_argument("out", type=Path)
    create.add_argument("--name", required=True)
    create.add_argument("--version", required=True)
    create.add_argument("--kernel", help="only this kernel")
    create.add_argument("--triton-cache", type=Path, help="also carry these compile artifacts")
    create.add_argument(
        "--inductor",
        type=Path,
        help="also carry the compiled models stored in this family (<volume>/inductor)",
    )
    create.add_argument("--model", help="with --inductor: only this model")
    create.add_argument("--sign-key", type=Path, help="sign it with this private key (PEM)")
    create.set_defaults(handler=_bundle_create)


def _add_bundle_install(
    bcmds: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
    *,
    default_cache: Path,
    inductor: Path,
) -> argparse.ArgumentParser:
    """``bundle install``: how strictly to check, and where artifacts and compiled models go."""
    ins = bcmds.add_parser(
        "install", help="verify, then merge into the store atomically", parents=common
    )
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
    _inductor_option(ins, inductor, "where compiled models' artifacts go")
    _fingerprint_option(ins, allow_none=True)
    ins.set_defaults(handler=_bundle_install)
    return ins


def _inductor_option(parser: argparse.ArgumentParser, default: Path, what: str) -> None:
    parser.add_argument(
        "--inductor", type=Path, default=default, help=f"the family {what} (default {default})"
    )


def _family_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inductor",
        type=Path,
        help="the compiled models' family to read (default: <volume>/inductor of the "
        "store's volume; none for a --store outside a volume)",
    )


def _fingerprint_option(parser: argparse.ArgumentParser, *, allow_none: bool = False) -> None:
    extra = ", 'none' (no check)" if allow_none else ""
    parser.add_argument(
        "--fingerprint",
        default="detect",
        help=f"'detect' (this machine, imports torch), 'cpu', a JSON file{extra}",
    )


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
        args.handler is _bundle_create and _carries_more(args)
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


def _carries_more(args: argparse.Namespace) -> bool:
    """A bundle that carries a compile cache or compiled models needs no store entries."""
    return args.triton_cache is not None or args.inductor is not None


def _resolve_fingerprint(spec: str) -> Fingerprint:
    if spec == "none":
        raise BadInput(
            "--fingerprint 'none' only applies to 'bundle install'; "
            "here use 'detect', 'cpu' or a JSON file."
        )
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
        text = atomic.read_bounded(Path(spec), MAX_FINGERPRINT_BYTES, follow_links=True)
        return Fingerprint.from_json(atomic.loads(text))
    except (OSError, ValueError, RegistryError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not a fingerprint JSON object"
        if isinstance(e, atomic.TooBig):
            reason = f"over {MAX_FINGERPRINT_BYTES} bytes"
        raise BadInput(
            f"--fingerprint '{spec}' is unusable ({reason}); expected 'detect', 'cpu', "
            "or a JSON file from 'registry fingerprint --json'."
        ) from None


def _existing(path: Path, *, folder: bool, what: str, expected: str) -> Path:
    """``path`` if it is an existing folder (``folder``) or file; else :class:`BadInput`."""
    if path.is_dir() if folder else path.is_file():
        return path
    state = "is a folder" if path.is_dir() else "is a file" if path.exists() else "does not exist"
    raise BadInput(f"{what} '{path}' {state}; expected {expected}.")


def _creatable(path: Path, *, folder: bool, what: str) -> Path:
    """``path`` if it is, or can be made, a folder (``folder``) or file; else :class:`BadInput`."""
    kind = "folder" if folder else "file"
    if path.exists() and path.is_dir() != folder:
        other = "file" if folder else "folder"
        raise BadInput(f"{what} '{path}' is a {other}; expected a {kind} (existing or new).")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise BadInput(f"{what} '{path}' lies under the file '{above}'; expected a {kind} path.")
    return path


def _select(store: Store, kernel: str | None) -> list[Entry]:
    """The store's entries, of ``kernel`` only when one is given: it must have some."""
    entries = store.entries()
    if kernel is None:
        return entries
    chosen = [e for e in entries if e.kernel == kernel]
    if not chosen:
        known = ", ".join(sorted({e.kernel for e in entries})) or "none, the store is empty"
        raise BadInput(
            f"--kernel '{kernel}' matches no entry in {store.root}; kernels there: {known}."
        )
    return chosen


def _ls(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """The store's entries, then the compiled models of its volume's family: ``--kernel``
    keeps to entries, ``--model`` to models."""
    with_entries = args.model is None or args.kernel is not None
    with_models = args.kernel is None or args.model is not None
    rows = [_row(e) for e in _select(store, args.kernel)] if with_entries else []
    family = _family(args) if with_models else None
    models, unreadable = _select_models(family, args.model) if with_models else ([], [])
    if not args.json:
        if with_entries:
            _table(
                [{**r, "median_ms": _ms(r["median_ms"])} for r in rows],
                ["kernel", "shape", "gpu", "software", "best", "median_ms", "source", "created"],
            )
            print(
                f"{len(rows)} entries in {store.root}"
                + (f"; {store.quarantined} quarantined" if store.quarantined else "")
            )
        if with_models:
            _print_models(models, unreadable, family)
    return {"entries": rows, "models": models, "unreadable_models": unreadable}


def _row(e: Entry) -> dict[str, Any]:
    best = next((m for m in e.measurements if m.config == e.best and m.ok), None)
    return {
        "kernel": e.kernel,
        "shape": e.key_json,
        "gpu": e.fingerprint.gpu_slug(),
        "software": e.fingerprint.software_slug(),
        "best": e.best.label(),
        "median_ms": best.median_ms if best else None,
        "source": e.source,
        "created": e.created,
        "path": e.relpath().as_posix(),
    }


def _show(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """The one entry or compiled model's index whose path holds the selector."""
    matches = [e for e in store.entries() if args.selector in e.relpath().as_posix()]
    family = _family(args)
    indexes = [rel for rel, _ in _index_files(family) if args.selector in rel]
    if len(matches) + len(indexes) != 1:
        found = [*(e.relpath().as_posix() for e in matches), *indexes]
        raise BadInput(
            f"Selector '{args.selector}' matches {len(found)} entries or compiled models "
            f"(need 1): {', '.join(found[:5]) or 'none'}"
        )
    if indexes:
        assert family is not None  # indexes are found in a family only
        return _show_model(args, family, indexes[0])
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


# ---- compiled models (the Inductor family, registry.inductor_cache) ----------------------


def _family(args: argparse.Namespace) -> Path | None:
    """The compiled models' family that ``ls`` and ``show`` read: ``--inductor`` (it
    must be there); else the one of the store's volume; None for a ``--store`` that is
    no volume's ``registry`` folder."""
    if args.inductor is not None:
        expected = "the compiled models' family of a volume (<volume>/inductor)"
        return _existing(args.inductor, folder=True, what="--inductor", expected=expected)
    if args.store is None:
        return Path(args.default_inductor)
    volume = Volume(args.store.parent)
    return volume.inductor if args.store == volume.registry else None


def _index_files(family: Path | None) -> list[tuple[str, Path]]:
    """Every model index of ``family`` as (path under the family, path), in order."""
    if family is None:
        return []
    found = inductor_cache.index_files(family / "models")
    return [(path.relative_to(family).as_posix(), path) for path in found]


def _select_models(
    family: Path | None, model: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """A row per readable index of ``family`` (of ``model`` only, when given: it must
    have one), and each index that cannot be read or lies where a restore never looks."""
    if model is not None and family is None:
        raise BadInput("--model reads the compiled models of a volume; give --inductor.")
    rows, unreadable = [], []
    for rel, path in _index_files(family):
        try:
            index = inductor_cache.read_index(path)
            if inductor_cache.placed(index) != rel:
                raise RegistryError(f"it belongs at {inductor_cache.placed(index)}")
            rows.append(_model_row(rel, path, index))
        except (OSError, RegistryError) as e:  # listed, never fatal: ls reads, it repairs nothing
            unreadable.append({"path": rel, "error": str(e)})
    if model is None:
        return rows, unreadable
    chosen = [r for r in rows if r["model"] == model]
    if not chosen:
        known = ", ".join(sorted({r["model"] for r in rows})) or "none"
        raise BadInput(
            f"--model '{model}' matches no compiled model in {family}; models there: {known}."
        )
    return chosen, [u for u in unreadable if u["path"].startswith(f"models/{model}/")]


def _model_row(rel: str, path: Path, index: Mapping[str, Any]) -> dict[str, Any]:
    """What ``ls`` says of one index: the model, its key, the fingerprint's short id (the
    end of its software folder's name), the declared dims, its files and their bytes."""
    fingerprint = Fingerprint.from_json(index["fingerprint"])
    created = _created(index, path)
    key = index.get("key")
    dims = key.get("dims") if isinstance(key, Mapping) else None
    return {
        "model": index["model"],
        "key": index["key_digest"],
        "fingerprint": fingerprint.digest()[:10],
        "gpu": fingerprint.gpu_slug(),
        "shapes": dict(dims) if isinstance(dims, Mapping) else None,
        "files": len(index["files"]),
        "bytes": sum(_blobs(index).values()),
        "created": created.isoformat(timespec="seconds"),
        "age_s": round(max(0.0, time.time() - created.timestamp()), 1),
        "path": rel,
    }


def _blobs(index: Mapping[str, Any]) -> dict[str, int]:
    """The blobs an index names, each once (files of equal content share one), by size."""
    return {sha: size for sha, size in index["files"].values()}


def _created(index: Mapping[str, Any], path: Path) -> datetime:
    """When the index was written: its ``created`` field, else its file's time."""
    text = index.get("created")
    try:
        when = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        when = None
    if when is None:
        return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _print_models(
    rows: list[dict[str, Any]], unreadable: list[dict[str, str]], family: Path | None
) -> None:
    if family is None:
        print("compiled models: not read (--store is no volume's registry; give --inductor)")
        return
    if rows:
        shown = [
            {
                **r,
                "key": r["key"][:12],
                "shapes": _shapes(r["shapes"]),
                "size": _size(r["bytes"]),
                "age": _age(r["age_s"]),
            }
            for r in rows
        ]
        _table(shown, ["model", "key", "fingerprint", "gpu", "shapes", "files", "size", "age"])
    bad = ", ".join(u["path"] for u in unreadable[:3]) + (", ..." if len(unreadable) > 3 else "")
    print(
        f"{len(rows)} compiled models in {family}"
        + (f"; {len(unreadable)} unreadable indexes: {bad}" if unreadable else "")
    )


def _show_model(args: argparse.Namespace, family: Path, rel: str) -> dict[str, Any]:
    """One index: its key's parts, its fingerprint, its files by folder, the blobs the
    family lacks (their files recompile on a restore)."""
    path = family / rel
    index = inductor_cache.read_index(path)
    row = _model_row(rel, path, index)
    blobs = _blobs(index)
    missing = sorted(s for s in blobs if not inductor_cache.blob_path(family, s).is_file())
    folders: dict[str, dict[str, int]] = {}
    for file, (_, size) in sorted(index["files"].items()):
        folder = folders.setdefault(_folder(file), {"files": 0, "bytes": 0})
        folder["files"] += 1
        folder["bytes"] += size
    if not args.json:
        software = Fingerprint.from_json(index["fingerprint"]).software_slug()
        print(
            f"{rel}\nmodel {row['model']}  key {row['key']}  fingerprint {row['fingerprint']}"
            f"\ngpu {row['gpu']}  software {software}\nhost {index.get('host', '-')}  "
            f"created {row['created']} ({_age(row['age_s'])} ago)\n"
            f"{row['files']} files in {len(blobs)} blobs ({_size(row['bytes'])} stored)"
            + (f"; {len(missing)} blobs missing from {family}" if missing else "")
        )
        key = index.get("key")
        for name, value in sorted(key.items() if isinstance(key, Mapping) else []):
            print(f"key {name}: {json.dumps(value, sort_keys=True)}")
        rows = [
            {"folder": name, "files": f["files"], "size": _size(f["bytes"])}
            for name, f in folders.items()
        ]
        _table(rows, ["folder", "files", "size"])
    return {
        **index,
        "path": rel,
        "fingerprint_id": row["fingerprint"],
        "age_s": row["age_s"],
        "bytes": row["bytes"],
        "blobs": len(blobs),
        "missing_blobs": missing,
        "folders": folders,
    }


def _folder(file: str) -> str:
    """A cache file's top folder, for a summary ("." for a file at the top). Inductor
    writes its generated code in folders named by two characters of a hash: one row."""
    top, _, rest = file.partition("/")
    if not rest:
        return "."
    return "??/ (generated code)" if len(top) == 2 else f"{top}/"


def _shapes(dims: Mapping[str, Any] | None) -> str:
    """A model's declared dims for a table: ``batch=[1,8] seq=128``, '-' for none."""
    if not dims:
        return "-"
    return " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in dims.items())


def _size(count: int) -> str:
    """Bytes for a person: 512 B, 1.5 KiB, 3.2 MiB, 1.1 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _age(seconds: float) -> str:
    """An age for a person: 42s, 7m, 3.5h, 12.0d."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _ms(value: float | None) -> str:
    """A time for a table: milliseconds to 4 places, or '-' when there is none."""
    return "-" if value is None or value == float("inf") else f"{value:.4f}"


def _import(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """Import each good file, skip each bad one with one line on stderr; exit 0 when
    every file imported, 2 (bad input) when any was skipped, after the good ones."""
    load, holds = IMPORTS[args.format]
    source = _existing(args.source, folder=True, what="import source", expected=holds)
    _creatable(store.root, folder=True, what="--store")
    result = load(source, _resolve_fingerprint(args.fingerprint))
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
    fingerprint = _resolve_fingerprint(args.fingerprint)
    if not args.json:
        for name, value in fingerprint.flat().items():
            print(f"{name:28} {value}")
    return fingerprint.to_json()


def _rollback(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    info = bundle.rollback(store, inductor=args.inductor)
    if not args.json:
        print(
            f"rolled back {info['undoes']} ({(info.get('bundle') or {}).get('name')}); "
            f"current generation {info['id']}"
        )
    return info


def _bundle_create(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    for flag, value in (("--name", args.name), ("--version", args.version)):
        if not value:
            raise BadInput(f"{flag} is empty; expected a non-empty {flag[2:]} for the bundle.")
    _creatable(args.out, folder=False, what="bundle file")
    inductor = "the compiled models' family of a volume (<volume>/inductor)"
    for flag, path, expected in (
        ("--triton-cache", args.triton_cache, "a Triton cache folder (TRITON_CACHE_DIR)"),
        ("--inductor", args.inductor, inductor),
    ):
        if path is not None:
            _existing(path, folder=True, what=flag, expected=expected)
    if args.model is not None and args.inductor is None:
        raise BadInput("--model picks among the compiled models of --inductor; give --inductor.")
    signer = None
    if args.sign_key is not None:
        signer = signing.SigningKey.load(_key_file(args.sign_key))
    entries = _select(store, args.kernel)
    manifest = bundle.create(
        args.out,
        name=args.name,
        version=args.version,
        entries=entries,
        triton_cache=args.triton_cache,
        inductor=args.inductor,
        model=args.model,
        signer=signer,
    )
    if not args.json:
        members = list(manifest["members"])
        models = sum(map(bundle_inductor.is_index, members))
        blobs = sum(map(bundle_inductor.is_member, members)) - models
        artifacts = len(members) - len(entries) - models - blobs
        print(
            f"wrote {args.out}: {len(entries)} entries, {artifacts} artifacts, "
            f"{models} compiled model indexes ({blobs} files)"
            + (f", signed by key {signer.key_id}" if signer else "")
        )
    return manifest


def _bundle_verify(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    trust = _trust(args)
    verified = bundle.verify(_bundle_file(args.file), trust=trust)
    if not args.json:
        print(
            f"{args.file}: OK  {verified.name} {verified.version}  {len(verified.entries)} "
            f"entries  {len(verified.artifacts)} artifacts  {len(verified.indexes)} compiled "
            f"model indexes ({len(verified.blobs)} files)  sha256 {verified.sha256[:16]}"
        )
        print(f"  {_signed(verified.signed_by, trust)}")
        for fp in verified.manifest.get("fingerprints", []):
            print(f"  covers {fp.get('gpu')} / {fp.get('software')}")
    return {**verified.manifest, "signed_by": verified.signed_by}


def _trust(args: argparse.Namespace) -> signing.Trust:
    folder = args.trusted_keys
    if folder is not None:
        _existing(folder, folder=True, what="--trusted-keys", expected="a folder of *.pub keys")
    return signing.Trust.load(folder, allow_unsigned=args.allow_unsigned)


def _signed(key: str | None, trust: signing.Trust) -> str:
    if key is None:
        return "unsigned (" + trust.describe() + ")"
    if key in trust.keys_for(signing.BUNDLE):
        return f"signed by trusted key {key}"
    return f"signed by key {key}, not checked ({trust.describe()})"


def _key_file(path: Path) -> Path:
    return _existing(path, folder=False, what="key file", expected="an Ed25519 key (PEM)")


def _bundle_sign(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    key = signing.SigningKey.load(_key_file(args.key))
    source = _bundle_file(args.file)
    if args.out is not None:
        _creatable(args.out, folder=False, what="--out")
    signed = bundle.sign(source, key, out=args.out)
    if not args.json:
        print(f"signed {signed.path} ({signed.name} {signed.version}) with key {key.key_id}")
    return {"file": str(signed.path), "key": key.key_id, "sha256": signed.sha256}


def _keys_generate(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    private, public = signing.generate(args.out, args.name)
    key = signing.SigningKey.load(private)
    if not args.json:
        print(f"wrote {private} (private: keep it in a Secret) and {public} (key {key.key_id})")
    return {"private": str(private), "public": str(public), "key": key.key_id}


def _bundle_file(path: Path) -> Path:
    expected = "a bundle archive made by 'registry bundle create'"
    return _existing(path, folder=False, what="bundle file", expected=expected)


def _bundle_install(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    path = _bundle_file(args.file)
    _creatable(store.root, folder=True, what="--store")
    _creatable(args.triton_cache, folder=True, what="--triton-cache")
    _creatable(args.inductor, folder=True, what="--inductor")
    trust = _trust(args)
    info = bundle.install(
        path,
        store,
        trust=trust,
        expect=None if args.fingerprint == "none" else _resolve_fingerprint(args.fingerprint),
        policy=args.policy,
        force=args.force,
        triton_cache=args.triton_cache,
        inductor=args.inductor,
    )
    if not args.json and info.get("unchanged"):
        print(f"{path} is installed already as generation {info['id']}: nothing changed")
    elif not args.json:
        print(
            f"installed {info['bundle']['name']} {info['bundle']['version']} as generation "
            f"{info['id']}: {info['entries']} entries, {info['artifacts']} artifacts, "
            f"{info['models']} compiled model indexes"
        )
    return info


def _bundle_list(args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    rows = []
    for g in bundle.installed(store):
        rows.append(
            {
                "generation": g.record.id,
                "kind": g.record.kind,
                "bundle": g.bundle.get("name", ""),
                "version": g.bundle.get("version", ""),
                "created": g.record.created,
                "current": "*" if g.current else "",
            }
        )
    if not args.json:
        _table(rows, ["generation", "kind", "bundle", "version", "created", "current"])
    return rows


_READERS = (_ls, _show, _bundle_create, _bundle_list, _rollback)  # read the store's entries
_WRITERS = (_import, _bundle_install)  # write entries: never into a store nobody asked for


def _table(rows: Sequence[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max([len(c), *(len(str(r[c])) for r in rows)]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in columns))
