"""``registry bundle ...`` and ``registry keys generate``: make, check, sign, install and
list bundles of tuned configs and caches, and the keys that sign them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from registry import families
from registry.bundles import bundle
from registry.bundles.reader import MAX_SEQUENCE
from registry.cli.common import (
    creatable,
    existing,
    family_options,
    fingerprint_option,
    resolve_fingerprint,
    roots,
    select_entries,
    table,
)
from registry.core.errors import BadInput
from registry.core.fingerprint import MatchPolicy
from registry.storage.store import Store
from registry.trust import signing


def add_commands(
    cmds: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
    *,
    default_trust: tuple[Path | None, bool],
) -> None:
    """``bundle`` (``create``, ``verify``, ``install``, ``sign``, ``list``) and ``keys
    generate``; ``default_trust`` as :func:`registry.cli.main.add_parser` takes it."""
    bun = cmds.add_parser("bundle", help="create, verify, install and list bundles", parents=common)
    bcmds = bun.add_subparsers(dest="bundle_cmd", required=True, metavar="COMMAND")
    _add_create(bcmds, common)
    ver = bcmds.add_parser("verify", help="check an archive without installing it", parents=common)
    ver.add_argument("file", type=Path)
    _trust_options(ver, default_trust)
    ver.set_defaults(handler=_verify)
    ins = _add_install(bcmds, common)
    _trust_options(ins, default_trust)
    sig = bcmds.add_parser("sign", help="sign a bundle with an Ed25519 key", parents=common)
    sig.add_argument("file", type=Path)
    sig.add_argument("--key", type=Path, required=True, help="the private key (PEM)")
    sig.add_argument("--out", type=Path, help="the signed bundle (default: FILE, replaced)")
    sig.set_defaults(handler=_sign)
    lst = bcmds.add_parser("list", help="bundles installed in the store", parents=common)
    lst.set_defaults(handler=list_installed)
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
        f"{folder or 'unset: a bundle that carries code is refused, tuned configs alone pass'})",
    )
    parser.add_argument(
        "--allow-unsigned",
        action="store_true",
        default=allow,
        help="accept an unsigned bundle, code included, with --trusted-keys or without "
        "(TRITON_WARMUP_ALLOW_UNSIGNED; logged)",
    )


def _add_create(
    bcmds: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    """``bundle create``: which entries, artifacts and compiled models go in the archive."""
    parser = bcmds.add_parser(
        "create", help="write the store's entries to an archive", parents=common
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True, help="its label, for people")
    parser.add_argument(
        "--sequence",
        type=int,
        help="its place among the bundles of --name: an install refuses one lower than the "
        "installed (default: the time in milliseconds, so later bundles come after)",
    )
    parser.add_argument("--kernel", help="only this kernel's entries")
    flags = [f.option.flag.removeprefix("--") for f in families.with_option() if f.option]
    for family in families.with_option():
        assert family.option is not None
        parser.add_argument(
            family.option.flag,
            type=Path,
            help=family.option.carries.replace("also carry", "carry", 1)
            + ": from this folder instead of the volume's",
        )
    parser.add_argument(
        "--without",
        action="append",
        choices=flags,
        metavar="FAMILY",
        help=f"leave this family's files out (repeatable): {', '.join(flags)}",
    )
    parser.add_argument(
        "--configs-only",
        action="store_true",
        help="the tuned configs alone: no Triton kernels, compiled models, packages or "
        "declared folders",
    )
    parser.add_argument("--model", help="only this compiled model (or declared folder) by name")
    parser.add_argument("--sign-key", type=Path, help="sign it with this private key (PEM)")
    # the volume's folders that hold something are carried (registry.cli.common)
    parser.set_defaults(handler=create, family_defaults="carry")


def _add_install(
    bcmds: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """``bundle install``: how strictly to check, and where artifacts and compiled models go."""
    ins = bcmds.add_parser(
        "install", help="verify, then merge into the store atomically", parents=common
    )
    ins.add_argument("file", type=Path)
    ins.add_argument("--force", action="store_true", help="install despite fingerprint mismatches")
    ins.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="install a bundle older than the one of its name installed, or another with "
        "the same sequence (logged, kept in the generation's record); 'registry rollback' "
        "undoes the latest install",
    )
    ins.add_argument(
        "--policy",
        default=MatchPolicy.EXACT.value,
        choices=[p.value for p in MatchPolicy],
        help="which fingerprints of the bundle's entries this store's machines take "
        "(default exact)",
    )
    family_options(ins)
    fingerprint_option(ins, allow_none=True)
    ins.set_defaults(handler=install, family_defaults="put")
    return ins


def carries_more(args: argparse.Namespace) -> bool:
    """A bundle that carries a compile cache or compiled models needs no store entries."""
    return bool(roots(args))


def _named_options() -> str:
    """The options of the families that keep things by name: "--inductor or --caches"."""
    flags = [f.option.flag for f in families.with_option() if f.option and f.needs_host]
    return " or ".join(flags)


def create(args: argparse.Namespace, store: Store | None) -> dict[str, Any]:
    """``bundle create``: the store's entries and every cache family's files (from the
    volume's folders, or those the options name; less those left out) in one archive,
    signed when given a key; its manifest."""
    for flag, value in (("--name", args.name), ("--version", args.version)):
        if not value:
            raise BadInput(f"{flag} is empty; expected a non-empty {flag[2:]} for the bundle.")
    if args.sequence is not None and not 0 <= args.sequence <= MAX_SEQUENCE:
        raise BadInput(
            f"--sequence is {args.sequence}; expected a whole number 0 to {MAX_SEQUENCE}."
        )
    creatable(args.out, folder=False, what="bundle file")
    chosen = roots(args)
    for family in families.with_option():
        if family.name in chosen and family.option is not None:
            expected = family.option.carries.removeprefix("also carry ")
            existing(chosen[family.name], folder=True, what=family.option.flag, expected=expected)
    named = [f.name for f in families.with_option() if f.needs_host]
    if args.model is not None and not any(name in chosen for name in named):
        options = _named_options()
        raise BadInput(
            f"--model picks among the things stored by name in {options}; give one (none "
            "is carried: the volume has none, or they were left out)."
        )
    signer = None
    if args.sign_key is not None:
        signer = signing.SigningKey.load(_key_file(args.sign_key))
    if store is None and args.kernel is not None:
        raise BadInput("--kernel picks the store's entries: give --volume (or --store).")
    entries = [] if store is None else select_entries(store, args.kernel)
    manifest = bundle.create(
        args.out,
        name=args.name,
        version=args.version,
        entries=entries,
        roots=roots(args),
        only=args.model,
        signer=signer,
        sequence=args.sequence,
    )
    if not args.json:
        print(
            f"wrote {args.out}: {len(entries)} entries, {bundle.describe(manifest['members'])}, "
            f"sequence {manifest['sequence']}"
            + (f", signed by key {signer.key_id}" if signer else "")
        )
    return manifest


def _verify(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    trust = _trust(args)
    verified = bundle.verify(_bundle_file(args.file), trust=trust)
    if not args.json:
        print(
            f"{args.file}: OK  {verified.name} {verified.version}  {len(verified.entries)} "
            f"entries  {bundle.describe(verified.manifest['members'], sep='  ')}  "
            f"sha256 {verified.sha256[:16]}"
        )
        print(f"  sequence {verified.sequence}")
        print(f"  {_signed(verified.signed_by, trust)}")
        for fp in verified.manifest.get("fingerprints", []):
            print(f"  covers {fp.get('gpu')} / {fp.get('software')}")
    return {**verified.manifest, "sequence": verified.sequence, "signed_by": verified.signed_by}


def _trust(args: argparse.Namespace) -> signing.Trust:
    folder = args.trusted_keys
    if folder is not None:
        existing(folder, folder=True, what="--trusted-keys", expected="a folder of *.pub keys")
    return signing.Trust.load(folder, allow_unsigned=args.allow_unsigned)


def _signed(key: str | None, trust: signing.Trust) -> str:
    if key is None:
        return "unsigned (" + trust.describe() + ")"
    if key in trust.keys_for(signing.BUNDLE):
        return f"signed by trusted key {key}"
    return f"signed by key {key}, not checked ({trust.describe()})"


def _key_file(path: Path) -> Path:
    return existing(path, folder=False, what="key file", expected="an Ed25519 key (PEM)")


def _sign(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    key = signing.SigningKey.load(_key_file(args.key))
    source = _bundle_file(args.file)
    if args.out is not None:
        creatable(args.out, folder=False, what="--out")
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
    return existing(path, folder=False, what="bundle file", expected=expected)


def install(args: argparse.Namespace, store: Store) -> dict[str, Any]:
    """``bundle install``: verify the archive, then merge it into the store (and the
    caches' folders) as a new generation."""
    path = _bundle_file(args.file)
    creatable(store.root, folder=True, what="--store")
    for family in families.with_option():
        if family.option is not None and getattr(args, family.option.dest) is not None:
            creatable(getattr(args, family.option.dest), folder=True, what=family.option.flag)
    trust = _trust(args)
    info = bundle.install(
        path,
        store,
        trust=trust,
        expect=None if args.fingerprint == "none" else resolve_fingerprint(args.fingerprint),
        policy=MatchPolicy(args.policy),
        force=args.force,
        roots=roots(args),
        allow_downgrade=args.allow_downgrade,
    )
    if not args.json and info.get("unchanged"):
        print(f"{path} is installed already as generation {info['id']}: nothing changed")
    elif not args.json:
        print(
            f"installed {info['bundle']['name']} {info['bundle']['version']} as generation "
            f"{info['id']}: {info['entries']} entries, {info['artifacts']} artifacts, "
            f"{info['models']} compiled model indexes, {info.get('packages', 0)} compiled "
            f"package indexes, {info.get('caches', 0)} declared folder indexes; "
            f"sequence {info['bundle'].get('sequence', 0)}"
            + (" (downgrade allowed)" if info.get("allowed_downgrade") else "")
        )
    return info


def list_installed(args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    """``bundle list``: the store's generations, the bundle each installed."""
    rows = []
    for g in bundle.installed(store):
        rows.append(
            {
                "generation": g.record.id,
                "kind": g.record.kind,
                "bundle": g.bundle.get("name", ""),
                "version": g.bundle.get("version", ""),
                "sequence": g.bundle.get("sequence", 0) if g.bundle else "",
                "created": g.record.created,
                "current": "*" if g.current else "",
                "note": "downgrade allowed" if g.record.extra.get("allowed_downgrade") else "",
            }
        )
    if not args.json:
        columns = ["generation", "kind", "bundle", "version", "sequence", "created", "current"]
        table(rows, [*columns, "note"] if any(r["note"] for r in rows) else columns)
    return rows
