"""Issue 40's hostile inputs against the readers, remote calls and restores they target.

    .venv/bin/python bench/hostile_inputs.py [--only readers|trust]

Target (issue 40): every reader at most 64 MiB above idle, every remote call within its
deadline + 0.5 s, restore writes within the declared and bounded size; nothing lost.

The parent builds each hostile input in a temp folder (removed at the end), starting a
redis-server on a free port (``bench.fleet.redis_server``) for the oversized values and
a server that answers one byte every 0.5 s (``tests.registry._trickle``) for the
deadlines. Each case then runs in a fresh ``python -c`` process, as in
``bench/bundle_memory.py``: the child imports what it needs, resets its high-water mark
(``/proc/self/clear_refs`` = 5, so VmHWM := VmRSS), reads its idle VmRSS and ``wchar``
(bytes it passed to ``write``), runs the one operation, reads VmHWM and ``wchar`` again
and prints JSON: peak MiB above idle, seconds, bytes written, warnings logged and the
outcome (what was refused, skipped or written). Checks that read the result back (an
index against its blobs, a store's entries) run after the measurement. One case at a
time; the parent prints one JSON object with every case and its ``target_met``.
About a minute on 2 cores; needs ~4 GiB of free disk.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 2**20
GIB = 2**30
TARGET_MIB = 64  # a reader's peak above idle
SLACK_S = 0.5  # a remote call's time past its deadline
MODEL = "mlp"
KEY_DIGEST = "0123456789abcdef"
ENTRY_KEY = {"M": 4096, "N": 6656, "K": 16384, "dtype": "bf16", "world": 2}
TRITON_KEY = "HOSTILEBENCHKEY0123456789"
LOCK_TTL_S = 60.0  # the product's default lock ttl (settings.locks.ttl_s)
LOCK_TIMEOUT_S = 1.0
CHILD_LIMIT_S = 300

# ---- the child ---------------------------------------------------------------------------

HEAD = """
import json, logging, os, sys, time
from pathlib import Path

def kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field + " missing from /proc/self/status")

def wchar():
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0

class Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []
    def emit(self, record):
        if len(self.lines) < 12:
            self.lines.append(record.getMessage()[:400])

kept = Kept()
logging.getLogger().addHandler(kept)
logging.getLogger().setLevel(logging.WARNING)
ARGS = json.loads(sys.argv[1])

def after(outcome):
    return {}
"""

MEASURE = """
try:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the imports' peak forgotten
    reset = True
except OSError:
    reset = False
idle, written = kib("VmRSS"), wchar()
start = time.perf_counter()
outcome = op()
seconds = time.perf_counter() - start
peak, written = kib("VmHWM"), wchar() - written
outcome.update(after(outcome))
print(json.dumps({"idle_kib": idle, "peak_kib": peak, "seconds": seconds, "wchar": written,
                  "hwm_reset": reset, "warnings": kept.lines, "outcome": outcome}, default=str))
"""


def child_source(body: str) -> str:
    """The program a case runs: the common head, the case's ``body`` (its imports and
    setup, then ``op()`` and optionally ``after(outcome)``), then the measurement."""
    return HEAD + textwrap.dedent(body) + MEASURE


def run_child(body: str, args: dict[str, Any], env: dict[str, str] | None = None) -> dict:
    """Run one case in a fresh process; its JSON, or ``{"crashed": ...}``."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", child_source(body), json.dumps(args)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            capture_output=True,
            text=True,
            timeout=CHILD_LIMIT_S,
        )
    except subprocess.TimeoutExpired:
        return {"crashed": f"killed after {CHILD_LIMIT_S} s"}
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:] or ["no output"]
        return {"crashed": f"exit {done.returncode}: " + " | ".join(tail)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_mib(result: dict) -> float:
    if "crashed" in result:
        return float("nan")
    return round((result["peak_kib"] - result["idle_kib"]) / 1024, 1)


def within_memory(result: dict) -> bool:
    return "crashed" not in result and peak_mib(result) <= TARGET_MIB


# ---- verdicts: pure, on a child's result --------------------------------------------------


def verdict_oversized_index(result: dict) -> bool:
    """Case 1: refused (a miss, no file written), the size named, within the memory."""
    if not within_memory(result):
        return False
    out = result["outcome"]
    named = any("skipped" in w and "limit" in w for w in result["warnings"])
    return out["fetched"] is False and out["files_written"] == 0 and named


def verdict_oversized_field(result: dict) -> bool:
    """Case 2: both lookups a miss, the field named as too big, within the memory."""
    if not within_memory(result):
        return False
    out = result["outcome"]
    named = any("limit" in w for w in result["warnings"])
    return out["exact"] is None and out["any"] is None and named


def verdict_deadline(result: dict, deadline_s: float, failed: Callable[[Any], bool]) -> bool:
    """Case 3: the call ended within its deadline + :data:`SLACK_S`, as a failure
    (``failed(result)``: a miss or outage, not a hang nor an answer)."""
    if "crashed" in result:
        return False
    return result["seconds"] <= deadline_s + SLACK_S and failed(result["outcome"]["result"])


def verdict_learned(result: dict) -> bool:
    """Case 4: within the memory, and every valid dims of every file read was merged."""
    return within_memory(result) and not result["outcome"]["lost_from_files_read"]


def verdict_growing(result: dict) -> bool:
    """Case 5: within the memory; each size the index gives is its blob's; the growing
    file skipped or stored at the size stored; the other files stored."""
    if not within_memory(result):
        return False
    out = result["outcome"]
    grower_ok = out["grower_in_index"] is None or out["grower_in_index"] == out["grower_blob_bytes"]
    return not out["sizes_not_their_blobs"] and grower_ok and not out["others_missing"]


def verdict_import(result: dict, valid: str, bad: int) -> bool:
    """Case 6: within the memory; the valid file's entry in the store, each bad file
    skipped with its line, exit 2 (bad input after the good ones), nothing quarantined."""
    if not within_memory(result):
        return False
    out = result["outcome"]
    report = out.get("report") or {}
    return (
        out["exit_code"] == 2
        and out["store_entries"] == [valid]
        and report.get("imported") == 1
        and len(report.get("errors", [])) == bad
        and out["quarantined"] == 0
    )


def verdict_bundle(result: dict, declared: int) -> bool:
    """Case 7: refused, nothing left in the target folders, the bytes written on the way
    within what the bundle declares, within the memory."""
    if not within_memory(result):
        return False
    out = result["outcome"]
    return (
        out["installed"] is False
        and out["bytes_left_in_targets"] == 0
        and result["wchar"] <= declared
    )


# ---- builders: the hostile inputs -----------------------------------------------------------


def allowed_dims(largest_batch: int = 16, largest_seq: int = 8) -> list[dict[str, int]]:
    """Dims a harvest keeps for the bench's model (declared: batch 2 and 16 at seq 8):
    each size from 1 to the largest declared, the declared ones left out."""
    declared = [{"batch": 2, "seq": 8}, {"batch": 16, "seq": 8}]
    every = [
        {"batch": b, "seq": s}
        for s in range(1, largest_seq + 1)
        for b in range(1, largest_batch + 1)
    ]
    return [d for d in every if d not in declared]


def learned_file(path: Path, valid: dict[str, int], size: int, junk: int) -> None:
    """A serving process's learned file of exactly ``size`` bytes: ``junk`` dims out of
    range (parsed, then filtered), then ``valid`` last, and a string under a model the
    manifest lacks filling the rest."""
    dims = [{"batch": 1_000_000 + i, "seq": 8} for i in range(junk)] + [valid]

    def text(pad: int) -> bytes:
        body = {"models": {MODEL: dims, "unknown-model": "p" * pad}}
        return json.dumps(body, separators=(",", ":")).encode()

    room = size - len(text(0))
    if room < 0:
        raise ValueError(f"{junk} dims do not fit in {size} bytes")
    data = text(room)
    assert len(data) == size
    path.write_bytes(data)


def learned_folder(folder: Path, count: int, size: int, junk: int) -> dict[str, dict[str, int]]:
    """``count`` learned files, each with one valid dims of its own; file name -> dims."""
    folder.mkdir(parents=True)
    dims = allowed_dims()
    offered = {}
    for i in range(count):
        name = f"learned-{i % 4}-{20_000 + i}.json"
        learned_file(folder / name, dims[i % len(dims)], size, junk)
        offered[name] = dims[i % len(dims)]
    return offered


MANIFEST = """\
version: 1
models:
  - name: {model}
    build: tests.warmup.compiled.models:mlp
    dims: {{batch: [2, 16], seq: [8]}}
    inputs:
      - {{shape: [batch, seq, 32], dtype: fp32}}
      - {{shape: [batch], dtype: int64, high: 3}}
"""


def autotune_config(block: int) -> dict[str, Any]:
    """A config as Triton's autotuner writes ``config.__dict__``."""
    return {"kwargs": {"BLOCK": block}, "num_warps": 4, "num_ctas": 1, "num_stages": 2,
            "maxnreg": None, "pre_hook": None, "ir_override": None}  # fmt: skip


def autotune_folder(
    source: Path,
    outside: Path,
    *,
    sparse_bytes: int = 2 * GIB,
    configs: int = 300_000,
    depth: int = 100_000,
) -> dict[str, Path]:
    """A TRITON_CACHE_DIR to import: one valid file, a sparse file of ``sparse_bytes``,
    a file of ``configs`` configs, a nest ``depth`` deep, a link to a file outside and a
    link to a folder outside. Name -> path."""
    made: dict[str, Path] = {}

    def put(rel: str, data: bytes) -> Path:
        path = source / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    valid = {"key": [4096, "torch.float16"], "configs_timings": [
        [autotune_config(64), [0.031, 0.030, 0.033]],
        [autotune_config(128), [0.024, 0.023, 0.026]],
    ]}  # fmt: skip
    made["valid"] = put("V/valid_kernel.autotune.json", json.dumps(valid).encode())
    sparse = source / "S" / "sparse_kernel.autotune.json"
    sparse.parent.mkdir(parents=True)
    with sparse.open("wb") as f:
        f.truncate(sparse_bytes)  # no block written
    made["sparse"] = sparse
    # compact configs, so that the file stays under the byte limit: its values refuse it
    many = (
        b'{"key":[1],"configs_timings":['
        + b",".join(b'[{"num_warps":%d},[1,1,1]]' % (i % 8 + 1) for i in range(configs))
        + b"]}"
    )
    made["many"] = put("M/many_kernel.autotune.json", many)
    made["deep"] = put("D/deep_kernel.autotune.json", b"[" * depth + b"]" * depth)
    target = outside / "X" / "outside_kernel.autotune.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(valid))
    link = source / "L" / "outside_kernel.autotune.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    made["link"] = link
    (source / "F").symlink_to(target.parent, target_is_directory=True)
    made["folder_link"] = source / "F"
    return made


def growing_cache(cache: Path) -> tuple[str, list[str]]:
    """An Inductor cache folder: a 10-byte file that the child grows while it is saved
    (the first the walk reaches) and three others; (its path, theirs)."""
    files = {
        "aa/caa.py": b"# generated",
        "fxgraph/fa/fabc/entry": b"graph" * 100,
        "aotautograd/aq/entry": b"autograd" * 100,
        "zz/czz.so": b"\x7fELF" + bytes(4000),
    }
    for rel, data in files.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    grower = "aa/caa.py"
    (cache / grower).write_bytes(b"0123456789")
    return grower, [r for r in files if r != grower]


def one_blob_many_paths(out: Path, copies: int, size: int, byte: bytes = b"\xa5") -> int:
    """A bundle as a hostile author writes it: a compiled model's index naming one blob
    of ``size`` bytes (each ``byte``) under ``copies`` paths, the blob carried once,
    members in the order ``bundle create`` writes them (the blob before the index). Its
    writer (``bundle create``) refuses such an index, so the archive is made here. The
    bytes its manifest declares."""
    from registry.bundles import bundle
    from registry.caches import inductor_cache
    from registry.core.fingerprint import cpu_fingerprint
    from registry.families import named

    fp = cpu_fingerprint()
    sha = hashlib.sha256()
    for _ in range(size // MIB):
        sha.update(byte * MIB)
    sha.update(byte * (size % MIB))
    blob = sha.hexdigest()
    index = {
        "format": inductor_cache.FORMAT,
        "model": MODEL,
        "key_digest": KEY_DIGEST,
        "key": {},
        "fingerprint": fp.to_json(),
        "files": {f"fxgraph/c{i}/entry": [blob, size] for i in range(copies)},
        "created": "2026-01-01T00:00:00+00:00",
        "host": "hostile",
    }
    index_text = json.dumps(index, sort_keys=True).encode()
    index_name = named("inductor").bundled.prefix + inductor_cache.index_relpath(
        MODEL, KEY_DIGEST, fp
    )
    blob_name = named("inductor").bundled.prefix + inductor_cache.blob_relpath(blob)
    members = {
        blob_name: {"sha256": blob, "size": size},
        index_name: {"sha256": hashlib.sha256(index_text).hexdigest(), "size": len(index_text)},
    }
    manifest = {
        "format": bundle.FORMAT,
        "schema": bundle.SCHEMA,
        "name": "hostile",
        "version": "1",
        "created": "2026-01-01T00:00:00+00:00",
        "fingerprints": [
            {"digest": fp.digest(), "gpu": fp.gpu_slug(), "software": fp.software_slug()}
        ],
        "members": members,
    }
    manifest_text = json.dumps(manifest, sort_keys=True).encode()

    class Repeated(io.RawIOBase):  # the blob's bytes, made as tarfile reads them
        def __init__(self) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            n = min(len(buffer), self.left)
            buffer[:n] = byte * n
            self.left -= n
            return n

    def add(tar: tarfile.TarFile, name: str, data: io.RawIOBase | io.BytesIO, n: int) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = n, 0o644, 1_767_225_600
        tar.addfile(info, data)

    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tar:
        add(tar, bundle.MANIFEST, io.BytesIO(manifest_text), len(manifest_text))
        add(tar, blob_name, io.BufferedReader(Repeated(), MIB), size)
        add(tar, index_name, io.BytesIO(index_text), len(index_text))
    return size + len(index_text)


# ---- the cases ------------------------------------------------------------------------------

MODEL_INDEX = """
from registry.remote import models as remote_models
from registry.core.fingerprint import cpu_fingerprint
from registry.remote.tier import RemoteTier
from registry.trust.signing import Trust  # the opt-out: the readers are measured, not trust

tier = RemoteTier(ARGS["url"], timeout_s=1.0, trust=Trust(allow_unsigned=True))
root = Path(ARGS["work"]) / "inductor"
fp = cpu_fingerprint()  # once, at a pod's start (it imports torch for the versions)

def op():
    fetched = remote_models.fetch(
        tier, root, model=ARGS["model"], key_digest=ARGS["key"], fingerprint=fp
    )
    return {"fetched": fetched, "misses": tier.stats.misses, "errors": tier.stats.errors}

def after(outcome):
    return {"files_written": sum(1 for p in root.rglob("*") if p.is_file())}
"""

ENTRY_FIELD = """
from registry import MatchPolicy
from registry.core.fingerprint import cpu_fingerprint
from registry.remote.tier import RemoteTier
from registry.trust.signing import Trust  # the opt-out: the readers are measured, not trust

tier = RemoteTier(ARGS["url"], timeout_s=1.0, trust=Trust(allow_unsigned=True))
fp = cpu_fingerprint()

def op():
    exact = tier.fetch("ag_gemm", ARGS["key"], fp, now=True)
    any_fp = tier.fetch("ag_gemm", ARGS["key"], fp, MatchPolicy.ANY, now=True)
    return {"exact": exact, "any": any_fp, "misses": tier.stats.misses,
            "errors": tier.stats.errors}
"""

TRICKLE_ENTRY = """
from registry.core.fingerprint import cpu_fingerprint
from registry.remote.tier import RemoteTier
from registry.trust.signing import Trust  # the opt-out: the readers are measured, not trust

tier = RemoteTier(ARGS["url"], timeout_s=ARGS["timeout_s"], trust=Trust(allow_unsigned=True))
fp = cpu_fingerprint()

def op():
    found = tier.fetch("ag_gemm", ARGS["key"], fp, now=True)
    return {"result": found, "errors": tier.stats.errors}
"""

TRICKLE_MODEL = """
from registry.remote import models as remote_models
from registry.core.fingerprint import cpu_fingerprint
from registry.remote.tier import RemoteTier
from registry.trust.signing import Trust  # the opt-out: the readers are measured, not trust

tier = RemoteTier(ARGS["url"], timeout_s=ARGS["timeout_s"], trust=Trust(allow_unsigned=True))
fp = cpu_fingerprint()

def op():
    fetched = remote_models.fetch(tier, Path(ARGS["work"]) / "inductor", model=ARGS["model"],
                                  key_digest=ARGS["key"], fingerprint=fp)
    return {"result": fetched, "errors": tier.stats.errors}
"""

TRICKLE_TRITON = """
from registry.remote import triton as remote_triton
from registry.remote.tier import RemoteTier
from registry.trust.signing import Trust  # the opt-out: the readers are measured, not trust

tier = RemoteTier(ARGS["url"], timeout_s=ARGS["timeout_s"], trust=Trust(allow_unsigned=True))

def op():
    got = remote_triton.fetch(tier, ARGS["cache_key"], ["k.cubin", "k.json"])
    return {"result": sorted(got), "errors": tier.stats.errors}
"""

TRICKLE_LOCK = """
from registry.locks import LockServerUnreachable, LockTimeout, lock
from registry.locks.redis_lock import RedisLockBackend

backend = RedisLockBackend(ARGS["url"])

def op():
    try:
        with lock("bench/hostile", ttl=ARGS["ttl"], timeout=ARGS["timeout"], backend=backend):
            return {"result": "acquired"}
    except (LockServerUnreachable, LockTimeout) as e:
        return {"result": type(e).__name__ + ": " + str(e)[:300]}
"""

LEARNED = """
from warmup.compiled import learned
from warmup.core.manifest import load_manifest

manifest = load_manifest(Path(ARGS["manifest"]))
folder, root = Path(ARGS["folder"]), Path(ARGS["root"])

def op():
    return {"new_dims": learned.merge(folder, root, manifest)}

def after(outcome):
    dims = learned.learned_dims(root, manifest.model(ARGS["model"]))
    return {"merged": dims}
"""

GROWING = """
import threading
from registry.caches import inductor_cache
from registry.core.fingerprint import cpu_fingerprint

cache, root = Path(ARGS["cache"]), Path(ARGS["root"])
grower = cache / ARGS["grower"]
fp = cpu_fingerprint()
piece = b"g" * 2**20  # the appender's buffer, allocated before the reset
stop = threading.Event()
appended = [0]

def append():
    with open(grower, "ab", buffering=0) as f:
        while not stop.is_set() and appended[0] < ARGS["grow_bytes"]:
            appended[0] += f.write(piece)

def op():
    thread = threading.Thread(target=append)
    thread.start()
    try:
        saved = inductor_cache.save(cache, root, model=ARGS["model"], key_digest=ARGS["key"],
                                    key={"bench": 1}, fingerprint=fp)
    finally:
        stop.set()
        thread.join()
    return {"files_in_index": saved.files, "new_blobs": saved.new_blobs,
            "blob_bytes_stored": saved.bytes, "skipped": saved.skipped,
            "bytes_appended": appended[0]}

def after(outcome):
    (path,) = inductor_cache.index_files(root / "models")
    files = json.loads(path.read_text())["files"]
    def held(sha):
        blob = inductor_cache.blob_path(root, sha)
        return blob.stat().st_size if blob.is_file() else None
    wrong = [rel for rel, (sha, size) in files.items() if held(sha) != size]
    mine = files.get(ARGS["grower"])
    return {
        "index_files": sorted(files),
        "sizes_not_their_blobs": wrong,
        "grower_in_index": None if mine is None else mine[1],
        "grower_blob_bytes": None if mine is None else held(mine[0]),
        "grower_final_bytes": grower.stat().st_size,
        "largest_blob_bytes": max(
            (p.stat().st_size for p in (root / "blobs").rglob("*") if p.is_file()), default=0),
        "others_missing": [rel for rel in ARGS["others"] if rel not in files],
    }
"""

IMPORT = """
import contextlib, io
from registry.storage.store import Store
from warmup.cli import main

work = Path(ARGS["work"])
os.chdir(work)
empty = work / "empty"
empty.mkdir()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    # the command's lazy imports, made before the reset: an import of an empty folder
    main(["registry", "--store", str(work / "warm-store"), "--create-store", "import",
          "triton-autotune", str(empty), "--fingerprint", "cpu"])
out, err = io.StringIO(), io.StringIO()

def op():
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["registry", "--store", str(work / "store"), "--create-store", "--json",
                     "import", "triton-autotune", ARGS["source"], "--fingerprint", "cpu"])
    return {"exit_code": code}

def after(outcome):
    try:
        report = json.loads(out.getvalue())
    except ValueError:
        report = {"stdout": out.getvalue()[-400:]}
    store = Store(work / "store")
    return {
        "report": report,
        "stderr": [line[:300] for line in err.getvalue().splitlines()[:10]],
        "store_entries": sorted(e.kernel for e in store.entries()),
        "quarantined": store.quarantined_files(),
    }
"""

BUNDLE = """
from registry import Store, bundle
from registry.trust.signing import Trust  # the opt-out: the limits are measured, not trust
from registry.core.errors import RegistryError

targets = Path(ARGS["targets"])
store = Store(targets / "store", create=True)

def size(folder):
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file())

before = size(targets)

def op():
    try:
        roots = {"triton-kernels": targets / "triton", "inductor": targets / "inductor"}
        info = bundle.install(
            Path(ARGS["bundle"]), store, expect=None, roots=roots, trust=Trust(allow_unsigned=True)
        )
    except RegistryError as e:
        return {"installed": False, "reason": getattr(e, "reason", str(e))[:400]}
    return {"installed": True, "models": info.get("models"), "artifacts": info.get("artifacts")}

def after(outcome):
    return {"bytes_left_in_targets": size(targets) - before,
            "files_in_targets": sorted(str(p.relative_to(targets))
                                       for p in targets.rglob("*") if p.is_file())[:10]}
"""


def row(case: str, call: str, given: str, target: str, result: dict, met: bool, **more) -> dict:
    shown = {k: v for k, v in result.items() if k not in ("idle_kib", "peak_kib", "seconds")}
    return {
        "case": case,
        "call": call,
        "input": given,
        "target": target,
        "peak_mib_over_idle": peak_mib(result),
        "seconds": round(result.get("seconds", float("nan")), 3),
        **more,
        **shown,
        "target_met": met,
    }


def memory_row(
    case: str, call: str, given: str, then: str, result: dict, met: bool, **more
) -> dict:
    """A :func:`row` whose target is the reader's memory bound, ``then`` what it does."""
    return row(
        case, call, given, f"peak <= {TARGET_MIB} MiB over idle; {then}", result, met, **more
    )


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def redis_cases(tmp: Path) -> list[dict]:
    import redis as redis_py

    from bench.fleet import redis_server
    from registry.core.entry import canonical_key
    from registry.core.fingerprint import cpu_fingerprint
    from registry.remote import models as remote_models
    from registry.remote.tier import slot_name

    rows = []
    fp = cpu_fingerprint()
    with redis_server(shutil.which("redis-server"), tmp / "redis") as url:
        client = redis_py.Redis.from_url(url)
        name = remote_models.index_key(MODEL, KEY_DIGEST, fp)
        client.setrange(name, 400 * MIB - 1, b"}")  # 400 MiB at the model's index key
        work = tmp / "case1"
        work.mkdir()
        args = {"url": url, "work": str(work), "model": MODEL, "key": KEY_DIGEST}
        result = run_child(MODEL_INDEX, args)
        rows.append(
            memory_row(
                "1. 400 MiB value at a compiled model's index key",
                "registry.remote.models.fetch",
                f"{client.strlen(name)} bytes at {name}",
                "refused (a miss, nothing written)",
                result,
                verdict_oversized_index(result),
            )
        )
        say(f"case 1: {rows[-1]['peak_mib_over_idle']} MiB, {rows[-1]['target_met']}")
        client.delete(name)
        slot = slot_name("ag_gemm", canonical_key(ENTRY_KEY))
        client.hset(slot, fp.digest(), b" " * (40 * MIB))  # 40 MiB in the entry's field
        result = run_child(ENTRY_FIELD, {"url": url, "key": ENTRY_KEY})
        rows.append(
            memory_row(
                "2. 40 MiB value in a tuned entry's field",
                "registry.remote.tier.RemoteTier.fetch (EXACT, then ANY: all the slot's fields)",
                f"{client.hstrlen(slot, fp.digest())} bytes at {slot} field {fp.digest()[:16]}...",
                "refused (a miss)",
                result,
                verdict_oversized_field(result),
            )
        )
        say(f"case 2: {rows[-1]['peak_mib_over_idle']} MiB, {rows[-1]['target_met']}")
        client.flushall()
        client.close()
    return rows


def trickle_cases(tmp: Path) -> list[dict]:
    from registry.locks.redis_lock import io_timeout
    from tests.registry._trickle import trickling

    folder = tmp / "trickle"
    folder.mkdir()
    timeout_s = 1.0  # the remote tier's default deadline
    lock_deadline = LOCK_TIMEOUT_S + io_timeout(LOCK_TTL_S)
    calls: list[tuple[str, str, dict, float, str, Callable[[Any], bool]]] = [
        (
            "registry.remote.tier.RemoteTier.fetch",
            TRICKLE_ENTRY,
            {"timeout_s": timeout_s, "key": ENTRY_KEY},
            timeout_s,
            "the tier's timeout_s (1 s), the whole call",
            lambda r: r is None,
        ),
        (
            "registry.remote.models.fetch",
            TRICKLE_MODEL,
            {"timeout_s": timeout_s, "model": MODEL, "key": KEY_DIGEST, "work": str(folder)},
            timeout_s,
            "the tier's timeout_s (1 s): the index read, no blob reached",
            lambda r: r is False,
        ),
        (
            "registry.remote.triton.fetch",
            TRICKLE_TRITON,
            {"timeout_s": timeout_s, "cache_key": TRITON_KEY},
            timeout_s,
            "the tier's timeout_s (1 s): the pointers' read, no blob reached",
            lambda r: r == [],
        ),
        (
            "registry.locks.lock (redis backend) acquire",
            TRICKLE_LOCK,
            {"ttl": LOCK_TTL_S, "timeout": LOCK_TIMEOUT_S},
            lock_deadline,
            f"timeout ({LOCK_TIMEOUT_S} s) + one call in flight, min(ttl/4, 2 s) at ttl "
            f"{LOCK_TTL_S:.0f} s (docs/locks-and-fleet.md)",
            lambda r: isinstance(r, str) and r.startswith("LockServerUnreachable"),
        ),
    ]
    rows = []
    with trickling("tcp", folder) as server:
        for i, (call, body, args, deadline, why, failed) in enumerate(calls):
            result = run_child(body, {"url": server.url, **args})
            rows.append(
                row(
                    f"3{'abcd'[i]}. redis server trickling one byte every 0.5 s",
                    call,
                    f"{server.url}: '$100000000\\r\\n' then x..., a byte each 0.5 s",
                    f"seconds <= deadline + {SLACK_S} s = {deadline + SLACK_S:.1f} s; "
                    "a miss or an outage",
                    result,
                    verdict_deadline(result, deadline, failed),
                    deadline_s=deadline,
                    deadline_is=why,
                    limit_s=deadline + SLACK_S,
                )
            )
            say(f"case 3{'abcd'[i]}: {rows[-1]['seconds']} s, {rows[-1]['target_met']}")
    return rows


def learned_case(tmp: Path) -> dict:
    from warmup.compiled import learned

    work = tmp / "case4"
    folder = work / "metrics"
    junk = 12_000  # ~60,000 JSON values a file: under its limit, so each file is parsed
    offered = learned_folder(folder, 60, MIB, junk)
    manifest = work / "manifest.yaml"
    manifest.write_text(MANIFEST.format(model=MODEL))
    args = {"manifest": str(manifest), "folder": str(folder), "root": str(work / "learned"),
            "model": MODEL}  # fmt: skip
    result = run_child(LEARNED, args)
    more: dict[str, Any] = {}
    if "crashed" not in result:
        # the merge names the first file it did not read (its total read bound)
        unread_from = next(
            (
                m[0]
                for w in result["warnings"]
                for m in [re.findall(r"learned-[0-9-]+\.json", w)]
                if m and "not read" in w
            ),
            None,
        )
        read = [n for n in sorted(offered) if unread_from is None or n < unread_from]
        merged = result["outcome"]["merged"]
        lost = [n for n in read if offered[n] not in merged]
        result["outcome"].update(
            files=len(offered),
            files_read=len(read),
            files_not_read=len(offered) - len(read),
            valid_dims_offered=len(offered),
            merged=len(merged),
            lost_from_files_read=lost,
        )
        more["not_read_because"] = (
            f"learned.MAX_READ_BYTES = {learned.MAX_READ_BYTES} bytes a merge (by design: "
            "their dims are learned again at their next compile)"
        )
    met = "crashed" not in result and verdict_learned(result)
    shutil.rmtree(work)
    return memory_row(
        "4. 60 learned-*.json files of 1 MiB each",
        "warmup.compiled.learned.merge (the sidecar harvest's reader)",
        f"60 files of {MIB} bytes: {junk} out-of-range dims, one valid dims each, a 1 MiB "
        "string under an undeclared model",
        "every valid dims of the files read merged",
        result,
        met,
        **more,
    )


def growing_case(tmp: Path, grow: int = GIB, label: str = "5a") -> dict:
    work = tmp / f"case{label}"
    grower, others = growing_cache(work / "cache")
    args = {"cache": str(work / "cache"), "root": str(work / "family"), "grower": grower,
            "others": others, "grow_bytes": grow, "model": MODEL, "key": KEY_DIGEST}  # fmt: skip
    result = run_child(GROWING, args)
    if "crashed" not in result:  # wchar counts the appender's writes too
        out = result["outcome"]
        out["written_by_save_bytes"] = result["wchar"] - out["bytes_appended"]
    met = verdict_growing(result)
    shutil.rmtree(work)
    return memory_row(
        f"{label}. an Inductor cache file growing while it is saved",
        "registry.caches.inductor_cache.save",
        f"{grower}: 10 bytes, a thread appending 1 MiB at a time (up to {grow // MIB} MiB) from "
        "the start of the save; 3 other files",
        "each index size = its blob's bytes (or the file skipped); the other files stored",
        result,
        met,
    )


def import_case(tmp: Path) -> dict:
    work = tmp / "case6"
    made = autotune_folder(work / "source", work / "outside")
    env = {"TRITON_WARMUP_VOLUME": str(work / "volume"),
           "TRITON_WARMUP_WORK_DIR": str(work / "work")}  # fmt: skip
    sizes = {k: p.lstat().st_size for k, p in made.items() if not p.is_symlink()}
    result = run_child(IMPORT, {"work": str(work), "source": str(work / "source")}, env)
    bad = len(made) - 1
    met = verdict_import(result, "valid_kernel", bad)
    shutil.rmtree(work)
    return memory_row(
        "6. registry import triton-autotune on a hostile folder",
        "warmup.cli.main(['registry', ..., 'import', 'triton-autotune', ...])",
        f"valid file; {sizes['sparse']}-byte sparse file; 300,000 configs "
        f"({sizes['many']} bytes); [ x 100,000 nest; a link to a file outside; a link "
        "to a folder outside",
        f"the valid file imported, the {bad} others skipped each with its reason, exit 2",
        result,
        met,
    )


def bundle_case(tmp: Path) -> dict:
    from registry.bundles import bundle

    work = tmp / "case7"
    out = work / "hostile.tgz"
    work.mkdir()
    declared = one_blob_many_paths(out, copies=40, size=64 * MIB)
    targets = work / "targets"
    targets.mkdir()
    result = run_child(BUNDLE, {"bundle": str(out), "targets": str(targets)})
    restore = 40 * 64 * MIB
    met = verdict_bundle(result, declared)
    size = out.stat().st_size
    shutil.rmtree(work)
    return memory_row(
        "7. a small bundle whose index names one 64 MiB blob under 40 paths",
        "registry.bundles.bundle.install",
        f"{size}-byte bundle: members declare {declared} bytes; its index would restore "
        f"{restore} bytes (limit {bundle.MAX_TOTAL_BYTES})",
        f"refused; 0 bytes left in the target folders; written <= declared ({declared})",
        result,
        met,
        bundle_bytes=size,
        declared_bytes=declared,
        restore_bytes_named=restore,
    )


def readers_cases(tmp: Path) -> list[dict]:
    """Issue 40's cases: the readers' memory and the remote calls' deadlines."""
    rows = [*redis_cases(tmp), *trickle_cases(tmp)]
    small = functools.partial(growing_case, grow=8 * MIB, label="5b")
    for case in (learned_case, growing_case, small, import_case, bundle_case):
        rows.append(case(tmp))
        last = rows[-1]
        say(f"{last['case']}: {last['peak_mib_over_idle']} MiB, {last['target_met']}")
    return rows


def main() -> int:
    from bench import hostile_trust

    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    started = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hostile-inputs-") as name:
        tmp = Path(name)
        if only in ("", "readers"):
            rows += readers_cases(tmp)
        if only in ("", "trust"):
            for found in hostile_trust.cases(tmp):  # issue [5.3]: trust, rollback, replay
                rows.append(found)
                say(f"{found['case']}: {found['target_met']}")
    missed = [r["case"] for r in rows if not r["target_met"]]
    report = {
        "bench": "bench/hostile_inputs.py",
        "issue": "40 (readers), 54 [5.3] (trust)",
        "target": "Hostile inputs: every reader <= 64 MiB over idle, every remote call <= "
        "its deadline + 0.5 s, restore writes <= the declared and bounded size; nothing lost; "
        "0 tampered artifacts executed, 0 rollbacks or replays accepted",
        "method": "each case in a fresh python -c process: VmHWM reset after imports "
        "(/proc/self/clear_refs = 5), peak = VmHWM - idle VmRSS; wchar = bytes passed to "
        "write() during the operation",
        "python": sys.version.split()[0],
        "cases": rows,
        "all_targets_met": not missed,
        "missed": missed,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report, indent=2, default=str))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
