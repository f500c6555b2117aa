"""Issue [5.3]'s attacks on trust, run by ``bench/hostile_inputs.py`` beside its readers'.

    .venv/bin/python bench/hostile_inputs.py --only trust

Each case is what an attacker (or an unlucky operator) does, through the product's own
entry points (the CLI in a fresh process where a restart matters), and what it counts:

- T1 tampered code with **no** trusted key configured (the default): the issue's
  payloads (a generated module, a launcher ``.so`` and a cubin that each write a marker
  when run) in a bundle unsigned, signed by a stranger, and behind an honest bundle's
  signature, installed with ``registry bundle install``; then everything installed is
  run as a server would. Target: 0 installed, 0 executed. The opt-out
  (``--allow-unsigned``) is the control: the same payload installs and runs.
- T2 the same payload on the Redis tier, unsigned and stranger-signed, fetched by a pod
  with no key and by one that trusts the fleet's key. Target: 0 fetched, 0 executed.
- T3 rollback: a bundle older than the installed one of its name, and another at the same
  sequence, each signed by the trusted key, each installed in a fresh process. Target: 0
  accepted without ``--allow-downgrade``; accepted with it.
- T4 a 200 MiB compiled-model blob published and fetched with 2 busy processes beside
  (``bench/remote_blobs.py``). Target: each <= 64 MiB over idle, within its deadline; a
  server slower than the stated rate cut at the deadline.
- T8 (with T2, on the redis-server) replay: a tuned entry, a Triton pointer, a model
  index and a host record, each signed by the fleet, replaced by newer ones a pod read,
  then written back at their own keys; the pod restarted on its volume reads them.
  Target: 0 of 4 taken.
- T5 a signing key of mode 0644 given to ``run``. Target: exit 2, one line.
- T6 an install killed mid-staging, then the next install. Target: 0 stages left.
- T7 links in the sidecar's bundle folder to ``/etc/passwd`` and to a bundle outside it,
  beside a ConfigMap's own link. Target: 0 files outside opened or installed.

The remaining cases (rollback, replay, large blobs, staging folders, links) are added by
:func:`cases` from the modules that implement them. Every case returns a row as
``bench/hostile_inputs.py`` prints them: ``case``, ``call``, ``input``, ``target``,
what was seen, ``target_met``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def payload(work: Path, marker: Path) -> dict[str, bytes]:
    """The attacker's files, each writing to ``marker`` when run (the tests' own)."""
    from tests.test_tampered_code import build_payload

    return build_payload(work, marker)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``triton-warmup ARGS`` in a fresh process, as an operator or a pod runs it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_WARMUP_")}
    return subprocess.run(
        [sys.executable, "-m", "warmup", *args],
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def row(case: str, call: str, given: str, target: str, met: bool, **seen: Any) -> dict:
    return {"case": case, "call": call, "input": given, "target": target, **seen,
            "target_met": met}  # fmt: skip


def tampered_bundles(tmp: Path) -> dict:
    """T1: the payload's bundles installed with no key configured, then run."""
    from registry.trust import signing
    from tests import test_tampered_code as attack

    work, marker = tmp / "t1", tmp / "t1" / "MARKER"
    work.mkdir()
    trusted = signing.SigningKey.load(signing.generate(work / "release", "release")[0])
    bundles = attack.hostile_bundles(work, payload(work, marker), trusted)
    volume = work / "volume"
    store = ["registry", "--store", str(volume / "registry"), "--create-store"]
    folders = [
        "--triton-cache",
        str(volume / "triton-cache"),
        "--inductor",
        str(volume / "inductor"),
    ]
    installed, lines = 0, {}
    for name, path in bundles.items():
        done = cli(*store, "bundle", "install", str(path), "--fingerprint", "cpu", *folders)
        installed += done.returncode == 0
        lines[name] = (done.stderr.strip().splitlines() or [""])[-1][:300]
    attack.run_everything(volume / "inductor", volume / "triton-cache", work)
    executed = len(marker.read_text().split()) if marker.exists() else 0
    opted = cli(*store, "bundle", "install", str(bundles["tampered"]), "--allow-unsigned",
                "--fingerprint", "cpu", *folders)  # fmt: skip
    attack.run_everything(volume / "inductor", volume / "triton-cache", work)
    control = sorted(set(marker.read_text().split())) if marker.exists() else []
    refused_all = all("no trusted keys are configured" in line for line in lines.values())
    return row(
        "T1. tampered code in a bundle, no trusted key configured (the default)",
        "triton-warmup registry bundle install (a fresh process each), then the server's "
        "imports and loads",
        "a module, a launcher .so and a cubin that write a marker when run: unsigned, "
        "signed by a stranger, and behind an honest bundle's signature",
        "0 installed, 0 executed; each refusal says how to configure keys or opt out; the "
        "opt-out (--allow-unsigned) installs it and it runs (the control)",
        installed == 0
        and executed == 0
        and refused_all
        and opted.returncode == 0
        and control == ["cubin", "module", "so"],
        installed=installed,
        executed=executed,
        refusals=lines,
        control_with_opt_out=control,
    )


def tampered_remote(tmp: Path, url: str) -> dict:
    """T2: the payload on the Redis tier, fetched by a pod with no key and one with keys."""
    import itertools

    from registry.core.fingerprint import cpu_fingerprint
    from registry.remote import models as remote_models
    from registry.remote import triton as remote_triton
    from registry.remote.tier import RemoteTier
    from registry.trust import signing
    from tests import test_tampered_code as attack

    work, marker = tmp / "t2", tmp / "t2" / "MARKER"
    work.mkdir()
    family, triton = attack._sources(work / "attacker", payload(work, marker))
    where = {"model": attack.MODEL, "key_digest": attack.KEY, "fingerprint": cpu_fingerprint()}
    files = {p.name: p.read_bytes() for p in (triton / attack.HASH).iterdir()}
    stranger = signing.generate(work / "stranger", "stranger")[0]
    signing.generate(work / "fleet", "fleet")
    writers = (signing.Trust(allow_unsigned=True), signing.Trust.load(None, signing_key=stranger))
    readers = {"no key": signing.Trust(), "fleet key": signing.Trust.load(work / "fleet")}
    fetched = 0
    for (n, writer), (label, trust) in itertools.product(enumerate(writers), readers.items()):
        tier = RemoteTier(url, timeout_s=1.0, trust=writer)
        remote_models.publish(tier, family, **where)
        for name, data in files.items():
            remote_triton.publish(tier, attack.HASH, name, data)
        pod = work / f"pod-{n}-{label.replace(' ', '-')}"
        reader = RemoteTier(url, timeout_s=1.0, trust=trust)
        fetched += bool(remote_models.fetch(reader, pod / "inductor", **where))
        kernels = remote_triton.fetch(reader, attack.HASH, list(files))
        fetched += len(kernels)
        for name, data in kernels.items():
            (pod / "triton-cache" / attack.HASH).mkdir(parents=True, exist_ok=True)
            (pod / "triton-cache" / attack.HASH / name).write_bytes(data)
        attack.run_everything(pod / "inductor", pod / "triton-cache", work)
    executed = len(marker.read_text().split()) if marker.exists() else 0
    return row(
        "T2. tampered code on the Redis tier",
        "registry.remote.models.fetch, registry.remote.triton.fetch, then the server's "
        "imports and loads",
        "the payload's model index, blobs and Triton files published unsigned and signed "
        "by a stranger; read by a pod with no key and by one trusting the fleet's key",
        "0 fetched, 0 executed",
        fetched == 0 and executed == 0,
        fetched=fetched,
        executed=executed,
    )


def loose_private_key(tmp: Path) -> dict:
    """T5: ``run`` given a signing key others can read."""
    from registry.trust import signing

    work = tmp / "t5"
    private, _ = signing.generate(work / "keys", "fleet")
    private.chmod(0o644)
    (work / "volume").mkdir()
    start = time.monotonic()
    done = cli(
        "run",
        "--manifest", str(ROOT / "examples" / "demo.yaml"),
        env={"TRITON_WARMUP_VOLUME": str(work / "volume"),
             "TRITON_WARMUP_WORK_DIR": str(work / "work"),
             "TRITON_WARMUP_SIGNING_KEY": str(private),
             "TRITON_WARMUP_ALLOW_UNSIGNED": "true"},
    )  # fmt: skip
    seconds = time.monotonic() - start
    lines = done.stderr.strip().splitlines()
    return row(
        "T5. a private signing key of mode 0644",
        "triton-warmup run (TRITON_WARMUP_SIGNING_KEY)",
        f"{private.name} chmod 0644",
        "exit 2 in one line, before any rank",
        done.returncode == 2
        and len(lines) == 1
        and "others can read it" in lines[0]
        and not (work / "work" / "status.json").exists(),
        exit_code=done.returncode,
        stderr=lines[:3],
        seconds=round(seconds, 2),
    )


def signed_bundle(work: Path, key: Any, name: str, sequence: int, m: int) -> Path:
    """A bundle ``name`` at ``sequence`` holding one tuned entry (M = ``m``), signed."""
    from registry import Entry, KernelConfig, cpu_fingerprint
    from registry.bundles import bundle

    entry = Entry.make("ag_gemm", {"M": m}, cpu_fingerprint(), KernelConfig.make({"BLOCK_M": 16}))
    out = work / f"{name}-{sequence}-{m}.tgz"
    bundle.create(out, name=name, version=str(sequence), sequence=sequence, entries=[entry],
                  signer=key)  # fmt: skip
    return out


def rollback(tmp: Path) -> dict:
    """T3: an older signed bundle, and another at the same sequence, after a newer one."""
    from registry.trust import signing

    work = tmp / "t3"
    private, _ = signing.generate(work / "keys", "release")
    key = signing.SigningKey.load(private)
    newer, older = signed_bundle(work, key, "tp2", 10, 64), signed_bundle(work, key, "tp2", 9, 32)
    same = signed_bundle(work, key, "tp2", 10, 128)  # the same sequence, other content
    store = ["registry", "--store", str(work / "registry"), "--create-store"]
    env = {"TRITON_WARMUP_TRUSTED_KEYS": str(work / "keys")}

    def install(path: Path, *more: str) -> subprocess.CompletedProcess[str]:
        return cli(*store, "bundle", "install", str(path), "--fingerprint", "cpu", *more, env=env)

    first = install(newer)
    attempts = [install(older), install(older), install(same)]  # each a fresh process: a restart
    accepted = sum(done.returncode == 0 for done in attempts)
    override = install(older, "--allow-downgrade")
    lines = [(done.stderr.strip().splitlines() or [""])[-1][:300] for done in attempts]
    return row(
        "T3. rollback: an older signed bundle of the same name, and another at its sequence",
        "triton-warmup registry bundle install (a fresh process each: a pod's restart)",
        "tp2 sequence 10 installed; then tp2 sequence 9 twice, tp2 sequence 10 with other "
        "content; all signed by the trusted release key",
        "0 accepted without --allow-downgrade (exit 2, one line each); accepted with it",
        first.returncode == 0
        and accepted == 0
        and override.returncode == 0
        and all(done.returncode == 2 for done in attempts),
        accepted_without_override=accepted,
        refusals=lines,
        with_allow_downgrade=override.returncode,
    )


def killed_install(tmp: Path) -> dict:
    """T6: an install killed mid-staging, then the next install."""
    import signal

    from tests.registry.bundles.test_bundle import _hanging_install, _models_bundle

    work = tmp / "t6"
    work.mkdir()
    path, store, folder = _models_bundle(work), work / "registry", work / "inductor"
    proc, stage = _hanging_install(path, store, folder, work)
    proc.send_signal(signal.SIGKILL)  # as a pod is killed
    proc.wait()
    left = len(list(folder.glob(".bundle-*")))
    done = cli("registry", "--store", str(store), "bundle", "install", str(path),
               "--allow-unsigned", "--fingerprint", "cpu", "--inductor", str(folder))  # fmt: skip
    after = len(list(folder.glob(".bundle-*")))
    return row(
        "T6. an install killed (kill -9) while staging a compiled model",
        "triton-warmup registry bundle install, after the kill",
        f"{stage.name} left in {folder.name}/ by the killed install",
        "the next install removes it: 0 staging folders left",
        left == 1 and after == 0 and done.returncode == 0,
        stages_after_kill=left,
        stages_after_next_install=after,
    )


def bundle_folder_links(tmp: Path) -> dict:
    """T7: links in the sidecar's bundle folder to files outside it."""
    from warmup.sidecar.watcher import BundleWatcher

    work = tmp / "t7"
    folder, elsewhere = work / "bundles", work / "elsewhere"
    (folder / "..2026_12_08").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "good.tgz").write_bytes(b"a bundle outside the folder")
    (folder / "..2026_12_08" / "inside.tgz").write_bytes(b"a bundle the ConfigMap holds")
    os.symlink("..2026_12_08", folder / "..data")
    os.symlink("..data/inside.tgz", folder / "inside.tgz")
    os.symlink("/etc/passwd", folder / "passwd.tgz")
    os.symlink(elsewhere / "good.tgz", folder / "x.tgz")
    opened: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str | bytes | Path):
            opened.append(os.fsdecode(args[0]))

    installed: list[str] = []
    watcher = BundleWatcher(folder, lambda path, digest: installed.append(path.name) or "installed")
    sys.addaudithook(audit)  # hooks stay for the process: this case's list is its own
    watcher.scan()
    outside = [p for p in opened if p.startswith("/etc") or str(elsewhere) in p]
    return row(
        "T7. links in the sidecar's bundle folder",
        "warmup.sidecar.watcher.BundleWatcher.scan",
        "inside.tgz -> ..data/inside.tgz (a ConfigMap's layout), passwd.tgz -> /etc/passwd, "
        "x.tgz -> a bundle outside the folder",
        "the ConfigMap's link followed; 0 files outside the folder opened, 0 installed",
        installed == ["inside.tgz"] and not outside,
        installed=installed,
        opened_outside=outside,
    )


def large_blob(mib: int = 200, busy: int = 2) -> dict:
    """T4: a large blob published and fetched on a loaded machine (``bench/remote_blobs.py``
    in a process of its own, ``busy`` spinning processes beside it)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "remote_blobs.py"), "--mib", str(mib),
         "--busy", str(busy), "--json"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    found = done.stdout[done.stdout.index("[") :] if "[" in done.stdout else "[]"
    rows = json.loads(found)
    seen = {r["case"]: {k: r.get(k) for k in ("ok", "s", "deadline_s", "peak_mib")} for r in rows}
    return row(
        f"T4. a {mib} MiB compiled-model blob through the remote tier, {busy} busy processes",
        "registry.remote.models.publish / fetch (bench/remote_blobs.py)",
        f"{mib} MiB blob; a server at 3x the stated rate; one at 0.46x",
        "published and fetched, each <= 64 MiB over idle and within its deadline "
        "(1 s + bytes at the stated rate); the slow server cut at the deadline + 0.5 s",
        done.returncode == 0 and bool(rows),
        cases=seen,
    )


REPLAY_READER = r"""
import json, sys
from pathlib import Path
from registry import cpu_fingerprint
from registry.remote import models as remote_models, triton as remote_triton
from registry.remote.freshness import FILE_NAME, Freshness
from registry.remote.tier import RemoteTier
from registry.storage import hosts
from registry.trust.signing import Trust
url, work, phase, kernel = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
seen = Freshness(work / "volume" / FILE_NAME)  # the pod's volume: what it saw survives
tier = RemoteTier(url, timeout_s=1.0, trust=Trust.load(work / "keys"), freshness=seen)
fp = cpu_fingerprint()
where = {"model": "mlp", "key_digest": "0123456789abcdef", "fingerprint": fp}
taken = {
    "entry": tier.fetch("ag_gemm", {"M": 64, "N": 32, "K": 32}, fp) is not None,
    "triton_pointer": bool(remote_triton.fetch(tier, kernel, ["k.cubin"])),
    "model_index": bool(remote_models.fetch(tier, work / phase, **where)),
    "host_record": hosts.fetch_record(tier, hosts.probe("cpu", 0)) is not None,
}
seen.save()
print(json.dumps({"taken": taken, "refused": tier.stats.refused}))
"""
TRITON_KEY = "CZ4VKGKEWFV6MYQ5X5TRDJHUJU3GNRTX4GLYL7SUUERN3NQAXEGA"


def replay(tmp: Path, url: str) -> dict:
    """T8: older signed values written back at their own keys, one per family, read by a
    pod that saw the newer ones, restarted (a new process on the same volume)."""
    from dataclasses import replace

    import redis as redis_py

    from registry import Entry, KernelConfig, cpu_fingerprint
    from registry.remote import models as remote_models
    from registry.remote import triton as remote_triton
    from registry.remote.tier import RemoteTier, slot_name
    from registry.storage import hosts
    from registry.trust import signing
    from tests.registry.families.test_bundle_indexed import FILES, family

    work = tmp / "t8"
    (work / "volume").mkdir(parents=True)
    client = redis_py.Redis.from_url(url)
    client.flushall()
    private, _ = signing.generate(work / "keys", "fleet")
    fleet = signing.Trust.load(work / "keys", signing_key=private)
    pod = RemoteTier(url, timeout_s=1.0, trust=fleet)
    fp = cpu_fingerprint()
    key = {"M": 64, "N": 32, "K": 32}
    old, new = (Entry.make("ag_gemm", key, fp, KernelConfig.make({"BLOCK_M": m})) for m in (16, 32))
    where = {"model": "mlp", "key_digest": "0123456789abcdef", "fingerprint": fp}
    probe = hosts.probe("cpu", 0)
    record = hosts.HostRecord(probe=probe.to_json(), fingerprint=fp)
    names = {"entry": (slot_name("ag_gemm", old.key_json), fp.digest()),
             "triton_pointer": (remote_triton.name_key(TRITON_KEY, "k.cubin"), None),
             "model_index": (remote_models.index_key(**where), None),
             "host_record": (hosts.remote_key(probe), None)}  # fmt: skip
    pod.publish(old)  # the older values, signed by the fleet, kept by an attacker
    remote_triton.publish(pod, TRITON_KEY, "k.cubin", b"\x7fELF old" * 20)
    remote_models.publish(pod, family(work / "a"), **where)
    hosts.publish_record(pod, probe, record)
    kept = {what: client.hget(n, f) if f else client.get(n) for what, (n, f) in names.items()}
    client.hdel(*names["entry"])  # the fleet replaces each with a newer one
    pod.publish(new)
    remote_triton.publish(pod, TRITON_KEY, "k.cubin", b"\x7fELF new" * 20)
    remote_models.publish(
        pod, family(work / "b", {**FILES, "aotautograd/aq/entry": b"v2"}), **where
    )
    hosts.publish_record(pod, probe, replace(record, kernel_hashes={"k": "2"}))

    def reader(phase: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", REPLAY_READER, url, str(work), phase, TRITON_KEY],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the reader failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    newer = reader("r1")
    for what, (n, f) in names.items():  # the attacker writes the older values back
        client.hset(n, f, kept[what]) if f else client.set(n, kept[what])
    restarted = reader("r2")  # a new process on the same volume
    taken = sum(restarted["taken"].values())
    client.close()
    return row(
        "T8. replay: older signed values written back at their own Redis keys",
        "RemoteTier.fetch, registry.remote.triton.fetch, registry.remote.models.fetch, "
        "registry.storage.hosts.fetch_record, in a pod restarted on its volume",
        "a tuned entry, a Triton pointer, a model index and a host record, each signed by "
        "the fleet's key, replaced by newer ones that the pod read, then written back",
        "0 of 4 taken after the restart (each refused, counted)",
        all(newer["taken"].values()) and taken == 0 and restarted["refused"] >= 4,
        newer_read=newer["taken"],
        taken_after_replay=restarted["taken"],
        refused=restarted["refused"],
    )


def cases(tmp: Path) -> list[dict]:
    """Every [5.3] case; a redis-server on a free port for those that need one."""
    from bench.fleet import redis_server

    rows = [tampered_bundles(tmp), rollback(tmp), loose_private_key(tmp)]
    rows += [large_blob(), killed_install(tmp), bundle_folder_links(tmp)]
    server = shutil.which("redis-server")
    if server is not None:
        with redis_server(server, tmp / "redis-trust") as url:
            rows += [tampered_remote(tmp, url), replay(tmp, url)]
    return rows
