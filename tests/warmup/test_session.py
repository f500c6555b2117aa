"""What a rank session does before any rank reads: the registry is recovered first."""

import os

from registry import RegistryError, Store
from registry.store import CURRENT
from tests.conftest import settings_for
from warmup.session import restore


def test_restore_cleans_what_a_killed_writer_left_and_repairs_current(tmp_path, make_entry):
    settings = settings_for(tmp_path)
    store = Store(settings.registry_path)
    store.put_many([make_entry(m=m) for m in (1, 2)])
    gen = settings.registry_path / os.readlink(settings.registry_path / CURRENT)
    stale = gen / "ag_gemm" / ".tmp-123-x.json"
    stale.write_text("{")
    (gen / "GENERATION.json").unlink()
    restore(settings)
    assert not stale.exists()
    assert Store(settings.registry_path).generation_info()["kind"] == "repair"
    assert len(Store(settings.registry_path)) == 2


def test_a_store_that_cannot_be_recovered_is_read_as_it_is(tmp_path, monkeypatch, caplog):
    settings = settings_for(tmp_path)

    def refuse(self):
        raise RegistryError("write lock not acquired within 1 s")

    monkeypatch.setattr(Store, "recover", refuse)
    restore(settings)  # a read-only mount or a stuck lock never stops the warmup
    assert "not recovered (write lock not acquired" in caplog.text
