"""The restore before any rank reads: the registry recovered first; the run folder's
marker that the ranks wait for."""

import os

import pytest

from registry import RegistryError, Store
from registry.storage.store import CURRENT
from tests.conftest import settings_for
from warmup.core.results import RankHost, RankReport
from warmup.core.services import Services
from warmup.run.checks import RunError
from warmup.run.restore import clear_run_dir, mark_restored, restore, wait_for_restore


def test_restore_cleans_what_a_killed_writer_left_and_repairs_current(tmp_path, make_entry):
    settings = settings_for(tmp_path)
    store = Store(settings.paths.registry_dir, create=True)
    store.put_many([make_entry(m=m) for m in (1, 2)])
    gen = settings.paths.registry_dir / os.readlink(settings.paths.registry_dir / CURRENT)
    stale = gen / "ag_gemm" / ".tmp-123-x.json"
    stale.write_text("{")
    (gen / "GENERATION.json").unlink()
    restore(Services(settings, run=True))
    assert not stale.exists()
    assert Store(settings.paths.registry_dir).record().kind == "repair"
    assert len(Store(settings.paths.registry_dir)) == 2


def test_a_store_that_cannot_be_recovered_is_read_as_it_is(tmp_path, monkeypatch, caplog):
    settings = settings_for(tmp_path)

    def refuse(self, **budget):
        raise RegistryError("write lock not acquired within 1 s")

    monkeypatch.setattr(Store, "recover", refuse)
    restore(
        Services(settings, run=True)
    )  # a read-only mount or a stuck lock never stops the warmup
    assert "not recovered (write lock not acquired" in caplog.text


def test_ranks_wait_for_the_mark_of_this_run_not_of_the_last(tmp_path):
    run_dir = tmp_path / "run"
    clear_run_dir(run_dir)
    mark_restored(run_dir)
    RankReport(rank=0, world=1).write(run_dir)
    RankHost(fingerprint={}, triton_env={}).write(run_dir)
    wait_for_restore(run_dir, timeout_s=0.0)  # marked: no wait
    clear_run_dir(run_dir)  # the next run: the last one's mark, reports and host are gone
    assert list(run_dir.iterdir()) == []
    with pytest.raises(RunError, match=r"the compile cache was not restored within 0\.05 s"):
        wait_for_restore(run_dir, timeout_s=0.05)
