"""What signatures cost: signing and verifying a 300 MB bundle, and installing it with
trust required against the opt-out (``TRITON_WARMUP_ALLOW_UNSIGNED=true``).

    .venv/bin/python bench/signing_cost.py [--mb 300] [--repeats 3]

Builds a bundle of ``--mb`` MB of random (incompressible) Triton artifacts, 1 MiB each,
plus 64 entries, in a temp folder (removed at the end); then, each ``--repeats`` times
(median reported):

- ``sign``: ``bundle.sign`` (verify the unsigned bundle, sign its manifest, copy it
  behind the signature, verify the result against the key), and the signature alone;
- ``verify``: ``bundle.verify`` of the signed bundle with the opt-out, and with its key
  required: the difference is what checking the signature costs;
- ``install``: ``bundle.install`` into a fresh store and cache, the same two ways,
  interleaved (the disk's write-back of one install slows the next alike).

Prints one JSON object. The warm pod's added time to ready is measured by
``bench/trust_ready.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Entry, KernelConfig, Store, cpu_fingerprint  # noqa: E402
from registry.bundles import bundle  # noqa: E402
from registry.bundles.signature import DOMAIN  # noqa: E402
from registry.trust import signing  # noqa: E402

MIB = 2**20


def build(work: Path, megabytes: int) -> Path:
    """An unsigned bundle of ``megabytes`` MiB of random artifacts and 64 entries."""
    cache = work / "cache"
    for i in range(megabytes):
        folder = cache / f"{i:032x}"
        folder.mkdir(parents=True)
        (folder / "kernel.cubin").write_bytes(os.urandom(MIB))
    store = Store(work / "source", create=True)
    fp = cpu_fingerprint()
    store.put_many(
        Entry.make("ag_gemm", {"M": m, "N": 64, "K": 64}, fp, KernelConfig.make({"BLOCK_M": 16}))
        for m in range(1, 65)
    )
    out = work / "big.tgz"
    bundle.create(
        out, name="big", version="1", entries=store.entries(), roots={"triton-kernels": cache}
    )
    shutil.rmtree(cache)
    return out


def timed(
    fn: Callable[[], object], repeats: int, before: Callable[[], None] = lambda: None
) -> float:
    """The median wall time of ``fn`` over ``repeats`` runs, ``before`` run untimed first."""
    times = []
    for _ in range(repeats):
        before()
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="signing-cost-"))
    try:
        unsigned = build(work, args.mb)
        private, _ = signing.generate(work / "keys", "release")
        key = signing.SigningKey.load(private)
        trust = signing.Trust.load(work / "keys")
        signed = work / "signed.tgz"
        sign_s = timed(lambda: bundle.sign(unsigned, key, out=signed), args.repeats)
        manifest = b"x" * (1 * MIB)  # a manifest of 1 MiB: ~5,000 members listed
        signature_s = timed(lambda: key.sign(DOMAIN, manifest), 101)
        unchecked = signing.Trust(allow_unsigned=True)  # the opt-out: no signature required
        verify_plain = timed(lambda: bundle.verify(signed, trust=unchecked), args.repeats)
        verify_trust = timed(lambda: bundle.verify(signed, trust=trust), args.repeats)

        def fresh() -> None:
            shutil.rmtree(work / "target", ignore_errors=True)

        def install(with_trust: bool) -> Callable[[], object]:
            return lambda: bundle.install(
                signed,
                Store(work / "target" / "store", create=True),
                expect=None,
                trust=trust if with_trust else unchecked,
                roots={"triton-kernels": work / "target" / "cache"},
            )

        installs: dict[bool, list[float]] = {False: [], True: []}
        for i in range(args.repeats):  # interleaved: the disk's write-back hits both alike
            for with_trust in (i % 2 == 0, i % 2 == 1):
                installs[with_trust].append(timed(install(with_trust), 1, fresh))
        install_plain = statistics.median(installs[False])
        install_trust = statistics.median(installs[True])
        size = signed.stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "bundle_bytes": size,
                "sign_s": round(sign_s, 3),
                "signature_of_1mib_manifest_ms": round(signature_s * 1e3, 3),
                "verify_untrusted_s": round(verify_plain, 3),
                "verify_trusted_s": round(verify_trust, 3),
                "verify_added": round(verify_trust / verify_plain - 1, 4),
                "install_untrusted_s": round(install_plain, 3),
                "install_trusted_s": round(install_trust, 3),
                "install_added": round(install_trust / install_plain - 1, 4),
                "repeats": args.repeats,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
