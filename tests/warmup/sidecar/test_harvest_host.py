"""Whose host the harvest stores under: the warmup's, else what the server told; such a
host recorded under the init's probe for the next pod."""

from __future__ import annotations

import logging

from registry.storage import hosts
from tests.conftest import gpu_fingerprint
from warmup.core.results import RankHost, RunStatus
from warmup.sidecar.harvest_host import HarvestHost, host_of, record_host

FP = gpu_fingerprint()


def status(state: str = "ready", **fields) -> RunStatus:
    return RunStatus(state=state, manifest_digest="x", started=0.0, world_size=1, **fields)


def test_no_host_before_ready(tmp_path):
    RankHost(fingerprint=FP.to_json()).write(tmp_path)
    assert host_of(None, tmp_path) is None
    assert host_of(status("running", fingerprint=FP.to_json()), tmp_path) is None


def test_the_warmups_host_first(tmp_path):
    RankHost(fingerprint=gpu_fingerprint(cc="8.0").to_json()).write(tmp_path)
    found = host_of(status(fingerprint=FP.to_json(), triton_env={"K": "1"}), tmp_path)
    assert found == HarvestHost(FP, {"K": "1"})


def test_else_what_the_server_told(tmp_path):
    assert host_of(status(), tmp_path) is None  # not told yet
    RankHost(fingerprint=FP.to_json(), triton_env={"K": "2"}).write(tmp_path)
    assert host_of(status(), tmp_path) == HarvestHost(FP, {"K": "2"})


def test_a_host_the_warmup_knew_is_not_recorded_again(tmp_path):
    record_host(status(fingerprint=FP.to_json()), HarvestHost(FP), tmp_path, tmp_path / "h", None)
    assert not (tmp_path / "h").exists()


def test_a_host_known_by_its_probe_is_recorded(tmp_path):
    probe = hosts.Probe(device="cpu", python="3.12")
    RankHost(fingerprint=FP.to_json(), triton_env={"K": "3"}).write(tmp_path)
    record_host(status(probe=probe.to_json()), HarvestHost(FP), tmp_path, tmp_path / "h", None)
    record = hosts.read_record(tmp_path / "h", probe)
    assert record is not None and record.fingerprint == FP.with_kernel("")
    assert record.triton_env == {"K": "3"}


def test_an_unreadable_probe_is_logged_not_raised(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    record_host(status(probe={"nonsense": 1}), HarvestHost(FP), tmp_path, tmp_path / "h", None)
    assert "this host not recorded for the next pod" in caplog.text
