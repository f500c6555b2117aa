"""Peak memory of installing hostile and large bundles, each in a fresh process.

    .venv/bin/python bench/bundle_memory.py

Builds each bundle in a temp folder (removed at the end), then runs ``bundle.install``
on it in a new ``python -c`` process with an empty store and Triton cache. The child
resets its high-water mark after the imports, reads its idle RSS (VmRSS), installs,
reads its peak RSS (VmHWM, the high-water mark of its own address space: ``ru_maxrss``
would also count the parent's pages that the fork copied before exec) and prints
them as JSON. Target: every case at most 128 MiB above idle, whatever the bundle holds.
About 90 s on 2 cores; needs ~4 GiB of free disk.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Entry, KernelConfig, cpu_fingerprint  # noqa: E402
from registry.bundles import bundle  # noqa: E402
from tests import tar_blocks as blocks  # noqa: E402

MIB = 2**20
GIB = 2**30
TARGET_MIB = 128
BLOCK = tarfile.BLOCKSIZE

CHILD = """
import json, resource, sys, time
from pathlib import Path
from registry import RegistryError, Store, bundle
from registry.trust.signing import Trust
UNCHECKED = Trust(allow_unsigned=True)

def status_kib(field):
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

path, work = Path(sys.argv[1]), Path(sys.argv[2])
try:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: imports' peak forgotten
except OSError:
    pass
idle = status_kib("VmRSS")
start = time.perf_counter()
try:
    store = Store(work / "store", create=True)
    info = bundle.install(  # the opt-out: the limits are measured, not trust
        path, store, expect=None, roots={"triton-kernels": work / "cache"}, trust=UNCHECKED
    )
    outcome = f"installed: {info['entries']} entries, {info['artifacts']} artifacts"
except RegistryError as e:
    outcome = "rejected: " + getattr(e, "reason", str(e))
seconds = time.perf_counter() - start
print(json.dumps({"outcome": outcome, "seconds": seconds, "idle_kib": idle,
                  "peak_kib": status_kib("VmHWM"), "maxrss_kib": resource.getrusage(
                      resource.RUSAGE_SELF).ru_maxrss}))
"""


# ---- archive pieces ------------------------------------------------------------------


def header(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, size, 0o644
    return info.tobuf(format=tarfile.GNU_FORMAT)


def zeros(size: int) -> Iterator[bytes]:
    """``size`` zero bytes padded to whole tar blocks, in 1 MiB pieces."""
    left = -(-size // BLOCK) * BLOCK
    while left:
        yield bytes(min(MIB, left))
        left -= min(MIB, left)


def member(name: str, data: bytes) -> Iterator[bytes]:
    yield header(name, size=len(data))
    yield data + bytes(-len(data) % BLOCK)


def manifest(members: dict[str, tuple[str, int]], **extra: object) -> bytes:
    listed = {n: {"sha256": sha, "size": size} for n, (sha, size) in members.items()}
    body = {
        "format": bundle.FORMAT,
        "schema": bundle.SCHEMA,
        "name": "bench",
        "version": "1",
        "created": "2026-01-01T00:00:00+00:00",
        "fingerprints": [],
        "members": listed,
        **extra,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def write(path: Path, pieces: Iterable[bytes]) -> Path:
    """A gzip file of ``pieces`` then the tar end marker; level 6, as gzip's default."""
    with gzip.open(path, "wb", compresslevel=6) as f:
        for piece in pieces:
            f.write(piece)
        f.write(bytes(2 * BLOCK))
    return path


# ---- the cases -----------------------------------------------------------------------


def gnu_long_name(path: Path) -> Path:
    return write(path, [header("././@LongLink", tarfile.GNUTYPE_LONGNAME, GIB), *zeros(GIB)])


def pax_header(path: Path) -> Path:
    return write(path, [header("pax", tarfile.XHDTYPE, GIB), *zeros(GIB)])


def sparse_map(path: Path) -> Path:
    """An old GNU sparse header with 1 GiB of extension blocks, 21 (offset, size) each."""
    head = bytearray(header("sparse", tarfile.GNUTYPE_SPARSE))
    head[482] = 1  # isextended
    head[148:156] = b" " * 8
    head[148:155] = b"%06o\0" % sum(head)
    block = bytearray(b"00000000001\0" * 42 + bytes(8))
    block[504] = 1
    blocks = bytes(block) * (MIB // BLOCK)
    return write(path, [bytes(head), *(blocks for _ in range(GIB // MIB))])


def zero_members(path: Path) -> Path:
    """7 members of 250 MiB of zeros, listed with their true sizes and hashes."""
    size = 250 * MIB
    sha = hashlib.sha256()
    for piece in zeros(size):
        sha.update(piece)
    names = [f"triton-cache/{i:032x}/kernel.cubin" for i in range(7)]
    head = manifest({n: (sha.hexdigest(), size) for n in names})

    def pieces() -> Iterator[bytes]:
        yield from member(bundle.MANIFEST, head)
        for name in names:
            yield header(name, size=size)
            yield from zeros(size)

    return write(path, pieces())


def tiny_members(path: Path) -> Path:
    """300,000 one-byte members, every one listed: the listing is the bomb."""
    names = [f"triton-cache/{i % 1000:032x}/{i}.bin" for i in range(300_000)]
    sha = hashlib.sha256(b"x").hexdigest()
    head = manifest({n: (sha, 1) for n in names})

    def pieces() -> Iterator[bytes]:
        yield from member(bundle.MANIFEST, head)
        for name in names:
            yield from member(name, b"x")

    return write(path, pieces())


def folders(path: Path) -> Path:
    """A small manifest, then 300,000 folder members, which need no listing."""

    def pieces() -> Iterator[bytes]:
        yield from member(bundle.MANIFEST, manifest({}))
        for i in range(300_000):
            yield header(f"triton-cache/{i:08x}", tarfile.DIRTYPE)

    return write(path, pieces())


def huge_manifest(path: Path) -> Path:
    return write(path, [header(bundle.MANIFEST, size=GIB), *zeros(GIB)])


def valid(path: Path, work: Path, *, files: int = 4, size: int = 50 * MIB) -> Path:
    """A real bundle: one entry and ``files`` artifacts of random bytes."""
    cache = work / "src-cache" / ("a" * 32)
    cache.mkdir(parents=True)
    for i in range(files):
        with open(cache / f"kernel{i}.cubin", "wb") as f:
            for _ in range(size // MIB):
                f.write(os.urandom(MIB))
    bundle.create(
        path, name="big", version="1", entries=[entry(1)], roots={"triton-kernels": cache.parent}
    )
    return path


def entry(m: int) -> Entry:
    return Entry.make(
        "ag_gemm",
        {"M": m, "N": 32, "K": 32},
        cpu_fingerprint(),
        KernelConfig.make({"BLOCK_M": 16}),
        created="2026-01-01T00:00:00+00:00",
        host="bench",
    )


def dense_entries(path: Path) -> Path:
    """Entries of empty measurements ``{}`` up to the JSON value limits: 3 bytes each in
    the bundle, ~1 KiB each once parsed and written to the store."""
    limits = bundle.Limits()
    per_entry = (limits.max_entry_values - 200) // 2  # "{}," counts '{' and ','
    count = limits.max_entries_values // limits.max_entry_values
    members: dict[str, bytes] = {}
    fingerprints = {}
    for m in range(count):
        e = entry(m + 1)
        body = {**e.to_json(), "measurements": [{}] * per_entry}
        members[f"entries/{e.relpath().as_posix()}"] = json.dumps(body).encode()
        fingerprints[e.fingerprint.digest()] = {
            "digest": e.fingerprint.digest(),
            "gpu": e.fingerprint.gpu_slug(),
            "software": e.fingerprint.software_slug(),
        }
    listed = {n: (hashlib.sha256(d).hexdigest(), len(d)) for n, d in members.items()}
    head = manifest(listed, fingerprints=list(fingerprints.values()))
    pieces = [*member(bundle.MANIFEST, head)]
    for name, data in members.items():
        pieces += member(name, data)
    return write(path, pieces)


def everything_at_its_limit(path: Path) -> Path:
    """MANIFEST.json at its byte and value limits, entries at theirs: 16 of 1 MiB each,
    mostly one long string, with empty measurements up to the value limits."""
    limits = bundle.Limits()
    count = limits.max_entries_bytes // limits.max_entry_bytes
    per_entry = (limits.max_entries_values // count - 200) // 2
    members: dict[str, bytes] = {}
    fingerprints = []
    for m in range(count):
        e = entry(m + 1)
        body = {**e.to_json(), "measurements": [{}] * per_entry, "host": ""}
        room = limits.max_entry_bytes - len(json.dumps(body)) - 16
        body["host"] = "h" * room
        members[f"entries/{e.relpath().as_posix()}"] = json.dumps(body).encode()
        fp = e.fingerprint
        described = {"digest": fp.digest(), "gpu": fp.gpu_slug(), "software": fp.software_slug()}
        if described not in fingerprints:
            fingerprints.append(described)
    listed = {n: (hashlib.sha256(d).hexdigest(), len(d)) for n, d in members.items()}
    pad: list[dict[str, str]] = [{}] * ((limits.max_manifest_values - 2000) // 2)
    head = manifest(listed, fingerprints=fingerprints, pad=pad, note="")
    room = limits.max_manifest_bytes - len(head) - 16
    head = manifest(listed, fingerprints=fingerprints, pad=pad, note="n" * room)
    pieces = [*member(bundle.MANIFEST, head)]
    for name, data in members.items():
        pieces += member(name, data)
    return write(path, pieces)


def negative_size(path: Path, *, pax: bool) -> Path:
    """MANIFEST.json of size -1 (a base-256 size field, or a PAX ``size=-1`` record), then
    1 GiB of zeros: ``read(-1)`` would decompress all of it."""
    if not pax:
        return write(path, [blocks.negative_size(bundle.MANIFEST), *zeros(GIB)])
    return write(path, [blocks.pax(b"size=-1"), header(bundle.MANIFEST), *zeros(GIB)])


def big_group_file(path: Path) -> Path:
    """A 200 MiB Triton group file, listed with its true size and hash: relocating it
    after the install would parse all of it."""
    data = b'{"child_paths": {}, "pad": "' + b"a" * (200 * MIB) + b'"}'
    name = "triton-cache/" + "a" * 32 + "/__grp__k.json"
    head = manifest({name: (hashlib.sha256(data).hexdigest(), len(data))})
    return write(path, [*member(bundle.MANIFEST, head), *member(name, data)])


def trailing_zeros(path: Path, work: Path) -> Path:
    """A valid bundle, then 20 MiB of zeros after its gzip stream (gzip reads such
    padding one byte a call)."""
    valid(path, work / "z", files=1, size=MIB)
    with open(path, "ab") as f:
        f.write(bytes(20 * MIB))
    return path


def truncated(path: Path, work: Path) -> Path:
    good = valid(work / "good-t.tgz", work / "t", files=1, size=8 * MIB)
    data = good.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def bit_flipped(path: Path, work: Path) -> Path:
    good = valid(work / "good-f.tgz", work / "f", files=1, size=8 * MIB)
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    return path


CASES: list[tuple[str, Callable[[Path, Path], Path]]] = [
    ("GNU long-name header, 1 GiB", lambda p, w: gnu_long_name(p)),
    ("PAX header, 1 GiB", lambda p, w: pax_header(p)),
    ("GNU sparse map, 1 GiB", lambda p, w: sparse_map(p)),
    ("7 x 250 MiB members of zeros", lambda p, w: zero_members(p)),
    ("300,000 tiny members", lambda p, w: tiny_members(p)),
    ("300,000 folders", lambda p, w: folders(p)),
    ("MANIFEST.json, 1 GiB", lambda p, w: huge_manifest(p)),
    ("valid, 200 MiB of artifacts", lambda p, w: valid(p, w / "v")),
    ("entries at the JSON value limits", lambda p, w: dense_entries(p)),
    ("manifest and entries at every limit", lambda p, w: everything_at_its_limit(p)),
    ("truncated gzip", truncated),
    ("bit-flipped gzip", bit_flipped),
    ("negative size (base-256), then 1 GiB", lambda p, w: negative_size(p, pax=False)),
    ("negative size (PAX size=-1), then 1 GiB", lambda p, w: negative_size(p, pax=True)),
    ("Triton group file, 200 MiB", lambda p, w: big_group_file(p)),
    ("20 MiB of zeros after the gzip stream", trailing_zeros),
]


def run(path: Path, work: Path) -> tuple[str, float, float]:
    """Install ``path`` in a fresh process: (outcome, seconds, peak MiB above idle)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(work)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"crashed ({done.returncode}): {last}", 0.0, float("nan")
    result = json.loads(done.stdout)
    peak = (result["peak_kib"] - result["idle_kib"]) / 1024
    return str(result["outcome"]), float(result["seconds"]), peak


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bundle-memory-") as tmp:
        for i, (label, build) in enumerate(CASES):
            work = Path(tmp) / f"case{i}"
            work.mkdir()
            path = build(work / "bundle.tgz", work)
            rows.append((label, path.stat().st_size, *run(path, work / "target")))
            print(f"{label}: {rows[-1][2]}", file=sys.stderr, flush=True)
            shutil.rmtree(work)
    print("| case | bundle bytes | outcome | seconds | peak MiB above idle |")
    print("|---|---:|---|---:|---:|")
    for label, size, outcome, seconds, peak in rows:
        short = outcome if len(outcome) <= 110 else outcome[:107] + "..."
        print(f"| {label} | {size:,} | {short} | {seconds:.2f} | {peak:.1f} |")
    over = [r[0] for r in rows if not r[4] <= TARGET_MIB]  # NaN: crashed
    verdict = (
        f"every case within {TARGET_MIB} MiB" if not over else f"OVER {TARGET_MIB} MiB: {over}"
    )
    print(f"\n{verdict}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
