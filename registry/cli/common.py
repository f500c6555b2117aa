"""What the ``registry`` commands share (:mod:`registry.cli.main`, :mod:`registry.cli.listing`,
:mod:`registry.cli.bundle`): their common options, the checks of the paths and
fingerprints they are given, the store's entries they pick, and their tables."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry import families
from registry.core import atomic
from registry.core.entry import Entry
from registry.core.errors import BadInput, RegistryError
from registry.core.fingerprint import Fingerprint, cpu_fingerprint, detect
from registry.core.volume import Volume
from registry.storage.store import Store

MAX_FINGERPRINT_BYTES = 64 * 2**10  # a fingerprint's JSON is ~1 KiB


@dataclass(frozen=True)
class Place:
    """Where the ``registry`` commands work unless an option says: the store and the
    volume the settings name (None: none named, TRITON_WARMUP_VOLUME unset), and the pod
    folders given to the settings, by their setting's name (``triton_cache_dir``)."""

    store: Path | None = None
    volume: Path | None = None
    pod: Mapping[str, Path] = field(default_factory=dict)


def named_volume(args: argparse.Namespace, place: Place) -> Path | None:
    """The volume whose family folders the command reads and fills: ``--volume``; else
    that of ``--store`` when it is a volume's ``registry`` folder (none for another);
    else the settings' (TRITON_WARMUP_VOLUME)."""
    given: Path | None = getattr(args, "volume", None)
    store = args.store
    if (
        given is not None
        and store is not None
        and store.resolve() != Volume(given).registry.resolve()
    ):
        raise BadInput(
            f"--store {args.store} is not the registry of --volume {given} "
            f"({Volume(given).registry}): give one of them, or the two of one volume"
        )
    if given is not None:
        return given
    if args.store is not None:
        return args.store.parent if args.store == Volume(args.store.parent).registry else None
    return place.volume


def fill_family_defaults(args: argparse.Namespace, place: Place) -> None:
    """Each family folder option not given, set from the volume the command names
    (:func:`named_volume`): ``install`` and ``rollback`` put files in its folder (or, with
    neither ``--volume`` nor ``--store``, in the pod folder a setting gives), ``create``
    carries what its folders hold unless left out (``--without``, ``--configs-only``)."""
    use = getattr(args, "family_defaults", None)  # "put" (install, rollback) or "carry"
    volume = named_volume(args, place)
    if use is None or volume is None:
        return
    told = getattr(args, "volume", None) is not None or args.store is not None
    defaults = default_roots(volume, {} if told else place.pod)
    left_out = set(getattr(args, "without", None) or ())
    carrying = use == "carry"  # only the folders that hold something
    for family in families.with_option():
        assert family.option is not None
        dest = family.option.dest
        if getattr(args, dest, None) is not None:
            continue
        if carrying and (args.configs_only or dest.replace("_", "-") in left_out):
            continue
        default = defaults.get(family.name)
        if default is not None and (not carrying or default.is_dir()):
            setattr(args, dest, default)


def default_roots(volume: Path, pod: Mapping[str, Path]) -> dict[str, Path]:
    """Where ``bundle install`` and ``rollback`` put each family's files unless told:
    its folder on the volume at ``volume``, or the pod folder its option names where
    ``pod`` (the pod folders given to the settings, by name) has it."""
    found = {}
    for family in families.with_option():
        assert family.option is not None
        root = family.volume_root(Volume(volume))
        if family.option.pod in pod:
            root = pod[family.option.pod]
        if root is not None:
            found[family.name] = root
    return found


def family_options(parser: argparse.ArgumentParser, *, undone: bool = False) -> None:
    """Each family's folder option where its files go (``bundle install``), by default
    its folder on the volume (:func:`fill_family_defaults`); ``undone``: only the
    families whose install a rollback puts back, and said so."""
    for family in families.with_option():
        assert family.option is not None and family.bundled is not None
        if undone and not family.bundled.record_keys():
            continue
        what = f"{family.name}: whose indexes are put back" if undone else family.option.goes
        where = _on_volume(family)
        pod = f", or TRITON_WARMUP_{family.option.pod.upper()} if set" if family.option.pod else ""
        parser.add_argument(
            family.option.flag, type=Path, help=f"{what} (default {where} of the volume{pod})"
        )


def _on_volume(family: families.Family) -> str:
    """The family's folder on a volume, for a help line: ``<volume>/inductor``."""
    root = family.volume_root(Volume(Path("<volume>")))
    return "its folder" if root is None else root.as_posix()


def fingerprint_option(parser: argparse.ArgumentParser, *, allow_none: bool = False) -> None:
    """``--fingerprint``: whose fingerprint, read by :func:`resolve_fingerprint`."""
    extra = ", 'none' (no check)" if allow_none else ""
    parser.add_argument(
        "--fingerprint",
        default="detect",
        help=f"'detect' (this machine, imports torch), 'cpu', a JSON file{extra}",
    )


def resolve_fingerprint(spec: str) -> Fingerprint:
    """The fingerprint ``--fingerprint`` names: 'detect', 'cpu' or a JSON file."""
    if spec == "none":
        raise BadInput(
            "--fingerprint 'none' only applies to 'bundle install'; "
            "here use 'detect', 'cpu' or a JSON file."
        )
    if spec == "cpu":
        return cpu_fingerprint()
    if spec == "detect":
        try:
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


def existing(path: Path, *, folder: bool, what: str, expected: str) -> Path:
    """``path`` if it is an existing folder (``folder``) or file; else :class:`BadInput`."""
    if path.is_dir() if folder else path.is_file():
        return path
    state = "is a folder" if path.is_dir() else "is a file" if path.exists() else "does not exist"
    raise BadInput(f"{what} '{path}' {state}; expected {expected}.")


def creatable(path: Path, *, folder: bool, what: str) -> Path:
    """``path`` if it is, or can be made, a folder (``folder``) or file; else :class:`BadInput`."""
    kind = "folder" if folder else "file"
    if path.exists() and path.is_dir() != folder:
        other = "file" if folder else "folder"
        raise BadInput(f"{what} '{path}' is a {other}; expected a {kind} (existing or new).")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise BadInput(f"{what} '{path}' lies under the file '{above}'; expected a {kind} path.")
    return path


def select_entries(store: Store, kernel: str | None) -> list[Entry]:
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


def roots(args: argparse.Namespace) -> dict[str, Path]:
    """The folders the options give each cache family a bundle carries."""
    given = {f.name: getattr(args, f.option.dest, None) for f in families.with_option() if f.option}
    return {family: path for family, path in given.items() if path is not None}


def table(rows: Sequence[dict[str, Any]], columns: list[str]) -> None:
    """Print ``rows`` as a table of ``columns``, each as wide as its widest cell."""
    widths = {c: max([len(c), *(len(str(r[c])) for r in rows)]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in columns))
