from warmup.run.gpus import visible_gpus


def test_visible_gpus_follow_the_driver_and_cuda_visible_devices(tmp_path, monkeypatch):
    gpus = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (gpus / bus).mkdir(parents=True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus(gpus) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert visible_gpus(gpus) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,2")  # -1 hides the rest
    assert visible_gpus(gpus) == 1
    assert visible_gpus(tmp_path / "no-driver") == 0
