"""``registry ls`` and ``registry show``: the store's entries and the compiled models
stored beside them (the Inductor family, ``registry.caches.inductor_cache``), as tables or JSON."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from registry.caches import inductor_cache
from registry.cli.common import existing, select_entries, table
from registry.core.entry import Entry
from registry.core.errors import BadInput, RegistryError
from registry.core.fingerprint import Fingerprint
from registry.core.volume import Volume
from registry.families.declared import FOLDER as DECLARED_FOLDER
from registry.storage.store import Store


def add_commands(
    cmds: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    """``ls`` and ``show``: the store's entries and the compiled models stored beside them."""
    parser = cmds.add_parser("ls", help="list entries and compiled models", parents=common)
    parser.add_argument("--kernel", help="only this kernel's entries (and no models)")
    parser.add_argument("--model", help="only this compiled model (and no entries)")
    _family_option(parser)
    parser.set_defaults(handler=ls)

    parser = cmds.add_parser(
        "show",
        help="show one entry with every measured config, or one compiled model's index",
        parents=common,
    )
    parser.add_argument(
        "selector",
        help="part of the entry's path, e.g. 'ag_gemm/' or 'M4096', or of the model "
        "index's (models/<model>/<gpu>/<software>/<key>.json), e.g. 'models/mlp/'",
    )
    _family_option(parser)
    parser.set_defaults(handler=show)


def _family_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inductor",
        type=Path,
        help="the compiled models' family to read (default: <volume>/inductor of --volume "
        "or of the store's volume; none for a --store outside a volume)",
    )


def ls(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """``ls``: the store's entries, then the compiled models of its volume's family: ``--kernel``
    keeps to entries, ``--model`` to models."""
    with_entries = args.model is None or args.kernel is not None
    with_models = args.kernel is None or args.model is not None
    rows = [_row(e) for e in select_entries(store, args.kernel)] if with_entries else []
    family = _family(args) if with_models else None
    models, unreadable = _select_models(family, args.model) if with_models else ([], [])
    if not args.json:
        if with_entries:
            table(
                [{**r, "median_ms": _ms(r["median_ms"])} for r in rows],
                ["kernel", "shape", "gpu", "software", "best", "median_ms", "source", "created"],
            )
            print(
                f"{len(rows)} entries in {store.root}"
                + (f"; {store.quarantined} quarantined" if store.quarantined else "")
            )
        if with_models:
            _print_models(models, unreadable, family)
    others = _other_families(args) if with_models and args.model is None else {}
    if not args.json:
        for noun, (found, bad, folder) in others.items():
            _print_models(found, bad, folder, noun=noun)
    listed = {noun.replace(" ", "_"): found for noun, (found, _, _) in others.items()}
    return {"entries": rows, "models": models, "unreadable_models": unreadable, **listed}


def _other_families(
    args: argparse.Namespace,
) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, str]], Path]]:
    """The volume's other keyed families, indexed as the compiled models' are: the models'
    packages and the declared folders (by noun); none for a --store outside a volume."""
    volume: Path | None = args.named_volume
    if volume is None:
        return {}
    found = {}
    for noun, folder in (
        ("compiled packages", Volume(volume).packages),
        ("declared folders", Volume(volume).root / DECLARED_FOLDER),
    ):
        rows, bad = _select_models(folder, None)
        if rows or bad:  # a family the volume does not use stays quiet
            found[noun] = (rows, bad, folder)
    return found


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


def show(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """``show``: the one entry or compiled model's index whose path holds the selector."""
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
        table(rows, ["config", "median_ms", "p20_ms", "p80_ms", "error"])
    return entry.to_json()


# ---- compiled models (the Inductor family, registry.caches.inductor_cache) ----------------------


def _family(args: argparse.Namespace) -> Path | None:
    """The compiled models' family that ``ls`` and ``show`` read: ``--inductor`` (it
    must be there); else the one of the volume the command names
    (:func:`registry.cli.common.named_volume`); None for a ``--store`` that is no
    volume's ``registry`` folder."""
    if args.inductor is not None:
        expected = "the compiled models' family of a volume (<volume>/inductor)"
        return existing(args.inductor, folder=True, what="--inductor", expected=expected)
    volume: Path | None = args.named_volume
    return None if volume is None else Volume(volume).inductor


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
        raise BadInput(
            "--model reads the compiled models of a volume; give --volume or --inductor."
        )
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
    rows: list[dict[str, Any]],
    unreadable: list[dict[str, str]],
    family: Path | None,
    *,
    noun: str = "compiled models",
) -> None:
    if family is None:
        print("compiled models: not read (--store is no volume's registry; give --volume)")
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
        table(shown, ["model", "key", "fingerprint", "gpu", "shapes", "files", "size", "age"])
    bad = ", ".join(u["path"] for u in unreadable[:3]) + (", ..." if len(unreadable) > 3 else "")
    print(
        f"{len(rows)} {noun} in {family}"
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
        table(rows, ["folder", "files", "size"])
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
