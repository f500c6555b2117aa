"""The sidecar runs from a slim image: the registry must work with no torch and no triton."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]

SCRIPT = textwrap.dedent("""
    import importlib.abc, json, sys
    from pathlib import Path

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ImportError(f"{name} is blocked: slim image")

    sys.meta_path.insert(0, Block())
    import registry
    from registry import lock, Store, Entry, KernelConfig, cpu_fingerprint
    from registry.bundles import bundle
    from registry.locks import backend_from_url
    from registry.cli.main import run
    from warmup.cli import main

    root = Path(sys.argv[1])
    fp = cpu_fingerprint("k")
    store = Store(root / "reg", create=True)
    store.put(Entry.make("ag_gemm", {"M": 8}, fp, KernelConfig.make({"BLOCK_M": 16})))
    bundle.create(root / "b.tgz", name="b", version="1", entries=store.entries())
    bundle.install(root / "b.tgz", Store(root / "other", create=True), expect=fp)
    with lock("x", ttl=5, timeout=5, backend=backend_from_url(str(root / "locks"))):
        pass
    assert main(["registry", "--store", str(root / "other"), "ls"]) == 0
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton"))
    print(json.dumps({"entries": len(Store(root / "other")), "leaked": leaked,
                      "software": fp.software.torch}))
""")


def test_registry_and_its_cli_work_without_torch_or_triton(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert '"entries": 1' in last and '"leaked": []' in last and '"software": "none"' in last
