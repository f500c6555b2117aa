"""What the ``registry`` commands share (``registry.cli.common``): the fingerprint a
``--fingerprint FILE`` names is read within its bound."""

import pytest

from tests.registry.cli.test_main import cli

pytestmark = pytest.mark.usefixtures("isolated")


def test_a_fingerprint_file_is_read_with_a_bound(capsys, store, tmp_path):
    big = tmp_path / "fp.json"
    with big.open("wb") as f:
        f.truncate(2**30)  # sparse: a GiB that a whole read would take into memory
    code, _, err = cli(
        capsys, store.root, "import", "triton-autotune", str(tmp_path), "--fingerprint", str(big)
    )
    assert code == 2 and "over 65536 bytes" in err
