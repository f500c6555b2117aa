"""``Serving()``'s settings (``warmup.serving.ops``): read from the environment once, and
refused in one line, naming the variables, when the pod's manifest and volume are not
given or a value is bad."""

import pytest

from warmup.core.settings import SettingsError
from warmup.serving.ops import Serving


def test_serving_without_its_settings_says_which_variables_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("MANIFEST", "VOLUME", "WORK_DIR"):
        monkeypatch.delenv(f"TRITON_WARMUP_{name}", raising=False)
    with pytest.raises(SettingsError) as missing:
        Serving(follow=False)
    message = str(missing.value)
    assert "\n" not in message
    assert message.startswith("Serving() needs the manifest, the volume and the work dir")
    assert all(f"TRITON_WARMUP_{n}" in message for n in ("MANIFEST", "VOLUME", "WORK_DIR"))
    monkeypatch.setenv("TRITON_WARMUP_MANIFEST", str(tmp_path / "m.yaml"))
    monkeypatch.setenv("TRITON_WARMUP_VOLUME", str(tmp_path / "v"))
    monkeypatch.setenv("TRITON_WARMUP_SERVING_REFRESH_S", "soon")
    with pytest.raises(SettingsError, match="TRITON_WARMUP_SERVING_REFRESH_S='soon'") as bad:
        Serving(follow=False)
    assert "\n" not in str(bad.value) and bad.value.__suppress_context__
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


def test_settings_given_need_a_volume_and_a_manifest_only_for_what_reads_it(tmp_path):
    from registry.core.volume import MissingFolder
    from warmup.core.manifest import ManifestError
    from warmup.core.settings import Settings

    with pytest.raises(SettingsError, match="TRITON_WARMUP_VOLUME"):
        Serving(Settings(manifest=tmp_path / "m.yaml"), follow=False)
    with pytest.raises(MissingFolder, match="TRITON_WARMUP_VOLUME"):  # a mistyped one: no
        Serving(Settings(volume=tmp_path / "v", work_dir=tmp_path / "w"), follow=False)
    (tmp_path / "v").mkdir()
    with Serving(Settings(volume=tmp_path / "v", work_dir=tmp_path / "w"), follow=False) as ops:
        with pytest.raises(ManifestError, match="TRITON_WARMUP_MANIFEST") as missing:
            ops.model("mlp")  # no demo manifest read in its place
        assert "Settings(manifest=...)" in str(missing.value)
