"""A scope over a volume in a temporary folder, without settings or a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.core.fingerprint import cpu_fingerprint
from registry.core.volume import Volume
from registry.families import Scope
from registry.families.base import Declared
from registry.storage.store import Store

FP = cpu_fingerprint().with_kernel("")


def make_scope(root: Path, *, folders=(), models=(), fingerprint=FP, **extra) -> Scope:
    volume = Volume(root / "volume")
    return Scope(
        volume=volume,
        pod={
            "triton_cache_dir": root / "pod" / "triton",
            "inductor_cache_dir": root / "pod" / "inductor",
        },
        store=lambda: Store(volume.registry, create=True),
        models=models,
        folders=folders,
        fingerprint=fingerprint,
        **extra,
    )


def write(folder: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def read(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def engine(tmp_path) -> Declared:
    """A declared engine folder with a few files, as the server left it."""
    folder = write(
        tmp_path / "engine",
        {"torch_compile_cache/abc/rank_0/model.py": b"graph", "config.json": b"{}"},
    )
    return Declared("vllm", "a" * 32, {"key": "qwen tp2"}, folder=folder)


def fake_kernel(cache: Path, key: str = "KEYABC", *, arch: int = 90, triton: str = "3.6.0") -> Path:
    """A kernel's folder as Triton leaves it in ``cache`` (a cubin, its metadata, its
    group file written last); returns the group file."""
    folder = cache / key
    folder.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"target": {"arch": arch}, "triton_version": triton}).encode()
    write(folder, {"k.cubin": b"cubin bytes", "k.json": meta})
    children = {name: str(folder / name) for name in ("k.cubin", "k.json")}
    group = folder / "__grp__k.json"
    group.write_text(json.dumps({"child_paths": children}))
    return group
