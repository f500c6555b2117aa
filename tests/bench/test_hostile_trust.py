"""``bench/hostile_trust.py``: its cases run here (the quick ones) and meet their targets;
each can fail, as a case whose refusal is taken away shows."""

from __future__ import annotations

import pytest

from bench import hostile_trust


def test_the_rollback_case_refuses_older_and_equal_sequences_and_takes_the_override(tmp_path):
    found = hostile_trust.rollback(tmp_path)
    assert found["target_met"], found
    assert found["accepted_without_override"] == 0 and found["with_allow_downgrade"] == 0
    assert "older than sequence 10" in found["refusals"][0]


def test_the_links_case_opens_nothing_outside_the_bundle_folder(tmp_path):
    found = hostile_trust.bundle_folder_links(tmp_path)
    assert found["target_met"] and found["installed"] == ["inside.tgz"], found


def test_the_links_case_fails_when_the_watcher_follows_every_link(tmp_path, monkeypatch):
    from warmup.sidecar.watcher import BundleWatcher

    monkeypatch.setattr(BundleWatcher, "inside", lambda self, path: path)
    found = hostile_trust.bundle_folder_links(tmp_path)
    assert not found["target_met"]  # the ConfigMap's own link is not taken either


@pytest.mark.slow
def test_the_key_mode_case_exits_2_in_one_line(tmp_path):
    found = hostile_trust.loose_private_key(tmp_path)
    assert found["target_met"] and found["exit_code"] == 2, found
