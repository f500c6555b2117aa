"""bench/pod_ready.py: its plan of pods, their environment and manifests, the ratios and
[4.1]'s targets, the table and the figure; and one real pod on the CPU (the GPU run is
the bench itself)."""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import plots, pod_targets, targets
from bench.figures import DRAWINGS
from bench.model_weights import ENV as WEIGHTS_ENV
from bench.plots import PlotError
from bench.pod_ready import (
    CASES,
    NO_MULTICAST,
    REUSES,
    TIERED_TRITON_CACHE,
    PodDirs,
    best_of,
    main,
    manifests,
    plan,
    pod_env,
    skipped,
    table,
)
from bench.pod_server import op_layers
from warmup.core.manifest import parse_manifest

# ---- the plan ---------------------------------------------------------------------------


def test_a_fleets_first_pod_runs_once_for_both_fleet_cases():
    pods = {pod.name: pod for pod in plan(["first_pod", "warm_fleet"])}
    assert set(pods) == {"fleet-a", "fleet-b"}
    assert pods["fleet-a"].case == "first_pod" and pods["fleet-a"].init
    b = pods["fleet-b"]
    assert (b.case, b.init, b.copy_from) == ("warm_fleet", True, "fleet-a")
    assert b.volume != b.copy_from  # its own volume: a copy at another path
    assert pods["fleet-a"].feeds and not b.feeds  # B starts from what A's sidecar harvested
    assert not plan(["first_pod"])[0].feeds


def test_a_warm_fleet_alone_still_fills_its_volume_but_does_not_time_it():
    first, second = plan(["warm_fleet"])
    assert (first.name, first.case, first.init) == ("fleet-a", None, True)
    assert second.case == "warm_fleet"


def test_the_persisted_anchor_fills_its_dirs_then_reuses_them(tmp_path):
    pods = plan(["persisted"])
    assert [p.case for p in pods] == [None] + ["persisted"] * REUSES
    assert not any(p.init for p in pods)
    fill = PodDirs.under(tmp_path, pods[0])
    (fill.inductor / "graph").write_text("kept")
    (fill.work / "status.json").write_text("{}")
    PodDirs.retire(tmp_path, pods[0])
    reuse = PodDirs.under(tmp_path, pods[1])
    assert (fill.triton, fill.inductor) == (reuse.triton, reuse.inductor)  # the same path
    assert (reuse.inductor / "graph").read_text() == "kept"  # and what the fill left there
    assert not (reuse.work / "status.json").exists()  # its own work folder, empty


def test_server_only_cases_have_no_init_and_their_own_dirs(tmp_path):
    cold, eager, nccl = plan(["nccl_eager", "eager", "cold"])  # the plan's order, not the caller's
    assert (cold.case, eager.case, nccl.case) == ("cold", "eager", "nccl_eager")
    assert (cold.manifest, eager.manifest, nccl.manifest) == ("compiled", "eager", "nccl_eager")
    assert not cold.init and not eager.init and not nccl.init
    first = PodDirs.under(tmp_path, cold)
    (first.triton / "kernel").write_text("cold's")
    assert PodDirs.retire(tmp_path, cold) == tmp_path / "pods" / "cold"
    second = PodDirs.under(tmp_path, eager)
    assert second.triton == first.triton  # one mount path, as in every pod of the chart
    assert not (second.triton / "kernel").exists()  # but its own, empty
    assert (tmp_path / "pods" / "cold" / "triton-cache" / "kernel").is_file()


def test_the_package_case_is_a_fleet_of_its_own_serving_packages():
    a, b = plan(["package", "warm_fleet"])[2:]  # after the warm fleet's own two pods
    assert (a.name, a.case, a.init, a.feeds) == ("package-a", None, True, True)
    assert (b.case, b.init, b.copy_from) == ("package", True, "package-a")
    assert a.manifest == b.manifest == "package" and b.volume != a.volume


def test_the_remote_case_uses_the_remote_tier_and_two_empty_volumes():
    a, b = plan(["remote_only"])
    assert a.remote and b.remote and a.volume != b.volume and b.copy_from is None
    assert (a.case, b.case) == (None, "remote_only") and a.feeds


def test_every_case_is_planned_and_an_unknown_one_refused():
    assert {p.case for p in plan(list(CASES))} - {None} == set(CASES)
    with pytest.raises(ValueError, match="--cases warm: not a case"):
        plan(["warm", "cold"])


def test_what_cannot_be_measured_says_why():
    assert "no model" in skipped("kernels", "eager", 1, "")
    assert "no model" in skipped("kernels", "nccl_eager", 1, "")
    assert "no model to serve as a package" in skipped("kernels", "package", 2, "")
    assert skipped("ag_mlp", "nccl_eager", 2, "") is None
    assert skipped("kernels", "cold", 1, "") is None
    assert skipped("ag_mlp", "cold", 2, "") is None
    assert skipped("blocks4", "remote_only", 1, "no redis-server") == "no redis-server"
    assert skipped("blocks4", "remote_only", 1, "") is None


# ---- a pod's environment and manifests --------------------------------------------------


def test_a_pods_environment_is_the_charts(tmp_path):
    dirs = PodDirs.under(tmp_path, plan(["cold"])[0])
    base = {"TRITON_WARMUP_REMOTE_URL": "redis://elsewhere", "PATH": "/bin", **NO_MULTICAST}
    env = pod_env(
        dirs, volume=tmp_path / "v", manifest=tmp_path / "m.yaml", device="cuda", world=1, base=base
    )
    assert env["TRITON_CACHE_DIR"] == env["TRITON_WARMUP_TRITON_CACHE_DIR"] == str(dirs.triton)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == env["TRITON_WARMUP_INDUCTOR_CACHE_DIR"]
    assert env["CUDA_CACHE_PATH"] == str(dirs.inductor / "cuda-jit")
    assert env["HOME"] == str(dirs.home) and env["TRITON_WARMUP_WORK_DIR"] == str(dirs.work)
    assert "TRITON_WARMUP_REMOTE_URL" not in env  # the caller's tier is not this pod's
    assert env["PATH"] == "/bin" and "TRITON_INTERPRET" not in env
    remote = pod_env(
        dirs, volume=tmp_path, manifest=tmp_path, device="cpu", world=2, remote_url="redis://r"
    )
    assert remote["TRITON_WARMUP_REMOTE_URL"] == "redis://r"
    assert remote["TRITON_CACHE_MANAGER"] == TIERED_TRITON_CACHE
    assert all(remote[k] == v for k, v in NO_MULTICAST.items())
    assert remote["TRITON_INTERPRET"] == "1"
    assert WEIGHTS_ENV not in remote
    weighed = pod_env(dirs, volume=tmp_path, manifest=tmp_path, device="cpu", world=1,
                      weights=tmp_path / "w")  # fmt: skip
    assert weighed[WEIGHTS_ENV] == str(tmp_path / "w")


def test_the_manifests_are_valid_and_count_every_ranks_rows():
    texts = manifests("blocks4", [1, 4], 128, "fp16", world=2)
    [model] = parse_manifest(texts["compiled"]).models
    assert (model.world_size, model.count()) == (2, 2)
    assert parse_manifest(texts["eager"]).models[0].build.endswith(":blocks4_eager")
    kernels = parse_manifest(manifests("kernels", [1, 4], 128, "fp16", world=2)["compiled"])
    assert not kernels.models and "eager" not in manifests("kernels", [1], 128, "fp16", 1)
    layers = op_layers(kernels, world=2)
    assert [(layer.n, layer.k, layer.ms) for layer in layers] == [
        (8192, 2048, (256, 1024)),  # 1 and 4 batches of 128 tokens, on each of 2 ranks
        (2048, 8192, (256, 1024)),
    ]
    assert op_layers(kernels, world=1) == []  # entries made for another world size
    with pytest.raises(ValueError, match="not a model"):
        manifests("nope", [1], 128, "fp16", 1)


def test_every_manifest_says_how_its_model_is_served_and_nccl_eager_makes_no_op():
    texts = manifests("ag_mlp", [1, 4], 128, "fp16", world=2)
    assert set(texts) == {"compiled", "package", "eager", "nccl_eager"}
    parsed = {kind: parse_manifest(text) for kind, text in texts.items()}
    served = {kind: manifest.models[0].serve for kind, manifest in parsed.items()}
    assert served == {  # the cases before [5.2] keep torch.compile; the default is auto now
        "compiled": "compiled",
        "package": "package",
        "eager": "compiled",
        "nccl_eager": "compiled",
    }
    assert parsed["package"].models[0].build == parsed["compiled"].models[0].build
    assert parsed["package"].entries == parsed["compiled"].entries  # the same serving ops
    assert parsed["nccl_eager"].models[0].build.endswith(":ag_mlp_nccl_eager")
    assert parsed["nccl_eager"].entries == [] and op_layers(parsed["nccl_eager"], 2) == []
    assert "nccl_eager" in manifests("blocks4", [1], 128, "fp16", 1)


def test_a_model_served_through_kernels_has_their_layers_in_its_manifest():
    manifest = parse_manifest(manifests("ag_mlp", [1, 4], 128, "fp16", 1)["compiled"])
    assert [layer.label for layer in op_layers(manifest, 1)] == [
        "ag_gemm N8192 K2048",
        "ag_gemm N2048 K8192",
    ]
    parallel = parse_manifest(manifests("ag_mlp", [1, 4], 128, "fp16", 2)["compiled"])
    [up] = op_layers(parallel, 2)  # sequence parallel: up is the op, half the width a rank
    assert (up.label, up.ms) == ("ag_gemm N4096 K2048", (256, 1024))


# ---- rows, ratios, targets --------------------------------------------------------------

ZERO = {"dynamo_frames": 0, "fxgraph_misses": 0, "kernel_compiles": 0, "autotune_runs": 0}


def pod(case: str, ready: float, init: float | None = None, model: str = "m", **extra) -> dict:
    phases = {"python": 0.1, "import_torch": 2.0, "process_group": 0.5, "serving": 0.3}
    server = ready - (init or 0.0)
    phases |= {"op ag_gemm N8 K8": 0.2, f"model {model}": server / 2, "declare_warm": 0.0}
    row = {
        "model": model,
        "world": 1,
        "case": case,
        "ready_s": ready,
        "server_s": server,
        "phases": phases,
        "shapes": {"m batch1": {"first_ms": 1.2, "steady_ms": 1.0, "ratio": 1.2}},
        "counts": {"priming": dict(ZERO), "after_ready": dict(ZERO)},
        **extra,
    }
    if init is not None:
        row["init"] = {"wall_s": init, "rc": 0}
    return row


def result_of(pods: list[dict]) -> dict[str, Any]:
    setup = {"device": "cuda", "world": 1, "gpu": "H100"}
    return {
        "bench": "pod_ready",
        "setup": setup,
        "pods": pods,
        "ratios": pod_targets.pod_ratios(pods),
    }


def all_cases(warm: float = 9.0, **extra) -> list[dict]:
    return [
        pod("cold", 30.0),
        pod("persisted", 10.0, runs_s=[12.0, 10.0, 11.0]),
        pod("first_pod", 34.5, init=25.0),
        pod("warm_fleet", warm, init=1.5, **extra),
        pod("eager", 4.0),
        *package_cases(),
    ]


NO_COMPILER = {"torch._dynamo": False, "torch._inductor.compile_fx": False}


def package_cases(ready: float = 4.8, **extra) -> list[dict]:
    """A package pod at [5.2]'s bounds: 0.48x persisted (10 s), 1.2x nccl_eager (4 s)."""
    served = {"imported": NO_COMPILER, "served_as": {"m": "package"}}
    return [pod("package", ready, init=0.5, **{**served, **extra}), pod("nccl_eager", 4.0)]


def verdicts(pods: list[dict]) -> dict[str, targets.Verdict]:
    return {v.target.split(" <=")[0]: v for v in pod_targets.pod_ready(result_of(pods))}


def test_the_ratios_are_the_warm_fleets_end_to_end_over_each_anchors():
    [ratios] = pod_targets.pod_ratios(all_cases())
    assert ratios["warm_over_persisted"] == pytest.approx(0.9)
    assert ratios["warm_over_cold"] == pytest.approx(0.3)
    assert ratios["warm_over_eager"] == pytest.approx(2.25)
    assert ratios["first_pod_over_cold"] == pytest.approx(1.15)
    assert ratios["init_on_hit_s"] == 1.5
    assert ratios["package_over_persisted"] == pytest.approx(0.48)
    assert ratios["package_over_nccl_eager"] == pytest.approx(1.2)


def test_every_target_is_met_at_its_bound_and_missed_just_past_it():
    assert all(v.met for v in verdicts(all_cases()).values())
    missed = verdicts(all_cases(warm=9.01))
    assert missed["[4.1] warm fleet ÷ persisted dirs (best of 3)"].met is False
    assert missed["[4.1] warm fleet ÷ cold"].met is True


def test_a_compile_in_the_warm_servers_priming_or_after_ready_misses():
    priming = {"priming": {**ZERO, "fxgraph_misses": 1}, "after_ready": dict(ZERO)}
    said = [v for v in pod_targets.pod_ready(result_of(all_cases(counts=priming))) if not v.met]
    assert len(said) == 1 and "priming" in said[0].target
    traced = {"priming": {**ZERO, "dynamo_frames": 3}, "after_ready": {**ZERO, "dynamo_frames": 1}}
    said = [v for v in pod_targets.pod_ready(result_of(all_cases(counts=traced))) if not v.met]
    assert len(said) == 1 and "after ready" in said[0].target  # a trace in priming is no miss


def test_a_slow_first_request_misses_and_names_the_model():
    slow = {"a": {"ratio": 1.0}, "b": {"ratio": 1.51}}
    [verdict] = [v for v in pod_targets.pod_ready(result_of(all_cases(shapes=slow))) if not v.met]
    assert "first request" in verdict.target and verdict.misses == ("m w1",)


def test_a_case_not_measured_is_never_met():
    pods = [p for p in all_cases() if p["case"] != "persisted"]
    pods.append({"model": "m", "world": 1, "case": "persisted", "skipped": "why"})
    found = verdicts(pods)
    assert found["[4.1] warm fleet ÷ persisted dirs (best of 3)"].met is None
    assert found["[4.1] warm fleet ÷ cold"].met is True
    failed = [
        {**p, "ready_s": None, "error": "x"} if p["case"] == "warm_fleet" else p for p in pods
    ]
    judged = {k: v for k, v in verdicts(failed).items() if k.startswith("[4.1]")}
    assert judged.pop("[4.1] first pod ÷ cold").met is True
    assert all(v.met is None for v in judged.values())  # every other target is the warm pod's
    unpackaged = verdicts([p for p in pods if p["case"] != "package"])
    op_start = unpackaged.pop("[5.2] the serving op's start, s per process (slowest rank)")
    assert op_start.met is True  # the warm fleet's pod made its op in time
    assert all(v.met is None for k, v in unpackaged.items() if k.startswith("[5.2]"))


def package_verdicts(**extra) -> dict[str, targets.Verdict]:
    pods = [p for p in all_cases() if p["case"] != "package"]
    return {k: v for k, v in verdicts([*pods, package_cases(**extra)[0]]).items() if "[5.2]" in k}


def test_the_package_targets_are_met_at_their_bounds():
    found = package_verdicts()
    assert len(found) == 7 and all(v.met for v in found.values())


def test_a_package_pod_past_either_anchor_misses():
    slower = package_verdicts(ready=4.81)  # 0.481x persisted, 1.2025x nccl_eager
    assert slower["[5.2] package ÷ nccl_eager"].met is False
    assert slower["[5.2] package ÷ persisted dirs"].met is True
    assert package_verdicts(ready=5.01)["[5.2] package ÷ persisted dirs"].met is False


def test_a_package_server_that_imported_the_compiler_or_served_compiled_misses():
    dynamo = package_verdicts(imported={**NO_COMPILER, "torch._dynamo": True})
    [missed] = [v for v in dynamo.values() if not v.met]
    assert "imported" in missed.target and "torch._dynamo" in missed.measured
    compiled = package_verdicts(served_as={"m": "compiled"})
    [missed] = [v for v in compiled.values() if not v.met]
    assert "served as a package" in missed.target and "compiled" in missed.measured
    unreported = package_verdicts(served_as={}, imported={})  # a server before [5.2]'s
    said = [v.met for k, v in unreported.items() if "imported" in k or "served as" in k]
    assert said == [None, None]  # not measured, never met


def test_a_slow_op_start_on_any_rank_or_a_slow_first_request_misses_by_name():
    ranks = [{"op ag_gemm N8 K8": 0.2}, {"op ag_gemm N8 K8": 0.6, "op ag_gemm N8 K16": 0.41}]
    [missed] = [v for v in package_verdicts(ranks=ranks).values() if not v.met]
    assert "op's start" in missed.target and missed.misses == ("m w1 package",)
    slow = {"m batch1": {"ratio": 1.0}, "m batch4": {"ratio": 1.51}}
    [missed] = [v for v in package_verdicts(shapes=slow).values() if not v.met]
    assert "first request" in missed.target and missed.misses == ("m w1 m batch4",)
    after = {"priming": dict(ZERO), "after_ready": {**ZERO, "dynamo_frames": 1}}
    [missed] = [v for v in package_verdicts(counts=after).values() if not v.met]
    assert "after ready" in missed.target


def test_the_judge_knows_a_pod_ready_result(tmp_path, capsys):
    path = tmp_path / "pod_ready.json"
    path.write_text(json.dumps(result_of(all_cases())))
    assert targets.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "(pod_ready; world 1, H100)" in out and "| [4.1] first pod ÷ cold <= 1.15 |" in out


def test_persisted_is_its_fastest_reuse_with_every_reuses_seconds():
    reuses = [pod("persisted", s) for s in (12.0, 10.0)] + [{"case": "persisted", "error": "x"}]
    best = best_of(reuses)
    assert best["ready_s"] == 10.0 and best["runs_s"] == [12.0, 10.0, None]
    assert "error" in best_of([{"case": "persisted", "error": "boom"}])


def test_the_table_has_a_row_per_case_skipped_and_failed_ones_said():
    pods = [*all_cases(), {"model": "m", "case": "remote_only", "skipped": "no redis|server"}]
    pods.append({"model": "m", "case": "eager", "error": "Traceback\nboom"})
    lines = table(result_of(pods))
    assert len(lines) == 2 + len(pods)
    assert lines[3].startswith("| m | persisted | 10.00 (best of [12.0, 10.0, 11.0]) | - |")
    assert "| m | warm_fleet | 9.00 | 1.50 | 7.50 | 2.00 | 0.50 | 0.30 | 0.20 | 3.75 |" in lines[5]
    assert lines[5].endswith("| 1.20 | - | - |")  # a server before [5.2]: nothing reported
    assert lines[7].endswith("| 1.20 | no / no | package |")
    assert "no redis/server" in lines[9] and "FAILED: Traceback boom" in lines[10]
    assert all(line.count("|") == lines[0].count("|") for line in lines)


# ---- the figure -------------------------------------------------------------------------


def test_the_figure_is_a_bar_per_timed_case_one_figure_per_model(tmp_path):
    skip = {"model": "m", "case": "remote_only", "skipped": "why"}
    result = result_of([*all_cases(), *all_cases_of("other")[:2], skip])
    figures = DRAWINGS["pod_ready"](result)
    assert set(figures) == {"m", "other"}
    [ax] = figures["m"].axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 7 and labels[0].startswith("cold")
    assert labels[4].startswith("warm fleet serving") and labels[6].startswith("uncompiled, NCCL")
    ends = sorted({round(p.get_x() + p.get_width(), 6) for p in ax.patches if p.get_width()})
    assert ends[-1] == pytest.approx(34.5)  # the first pod's bar ends at its end to end
    written = plots.save_beside(tmp_path / "pod_ready.json", "pod_ready", result)
    assert sorted(p.name for p in written) == ["pod_ready_m.svg", "pod_ready_other.svg"]


def all_cases_of(model: str) -> list[dict]:
    return [{**row, "model": model} for row in all_cases()]


def test_a_result_without_what_the_figure_needs_is_refused_by_name():
    result = result_of(all_cases())
    cut = copy.deepcopy(result)
    del cut["pods"][1]["phases"]
    with pytest.raises(PlotError, match=r"\bphases\b"):
        DRAWINGS["pod_ready"](cut)
    untimed = result_of([{"model": "m", "case": "cold", "skipped": "why"}])
    with pytest.raises(PlotError, match="no timed pod"):
        DRAWINGS["pod_ready"](untimed)


# ---- one real pod on the CPU -------------------------------------------------------------


def test_an_eager_pod_on_the_cpu_is_timed_end_to_end(tmp_path, capsys):
    out = tmp_path / "pod_ready.json"
    args = ["--device", "cpu", "--models", "small_mlp", "--cases", "eager", "--batches", "1,8"]
    assert main([*args, "--iters", "3", "--out", str(out), "--keep", str(tmp_path / "pods")]) == 0
    result = json.loads(out.read_text())
    [row] = result["pods"]
    assert (row["case"], row["world"], row.get("error")) == ("eager", 1, None)
    phases = row["phases"]
    assert 0.5 * sum(phases.values()) < row["ready_s"] < 60  # from the pod's start
    assert row["ready_s"] >= row["server_s"] and "init" not in row
    assert {"import_torch", "process_group", "serving", "model small-mlp", "declare_warm"} <= set(
        phases
    )
    assert set(row["shapes"]) == {"small-mlp batch1", "small-mlp batch8"}
    assert all(s["first_ms"] > 0 and s["steady_ms"] > 0 for s in row["shapes"].values())
    assert row["counts"]["priming"]["dynamo_frames"] == 0  # nothing compiled: Dynamo unused
    assert row["guard"] is not None and row["host"]["gpu"] == "cpu"
    assert row["served_as"] == {"small-mlp": "compiled"}  # what a manifest's serve: says
    assert set(row["imported"]) == {"torch._dynamo", "torch._inductor.compile_fx"}
    assert (tmp_path / "pods" / "weights" / "small_mlp-float32.pt").is_file()  # made once
    assert result["setup"]["torch"] and result["ratios"][0]["warm_over_eager"] is None
    home = tmp_path / "pods" / "small_mlp" / "pods" / "eager"
    assert (home / "work" / "server-0.json").exists()  # the pod's own folders, kept
    said = capsys.readouterr().out
    assert "| small_mlp | eager |" in said and (tmp_path / "pod_ready_small_mlp.svg").exists()


def test_a_run_with_a_failed_pod_exits_1_and_names_it(tmp_path, monkeypatch, capsys):
    from bench import pod_ready

    def failing(model, cases, ctx, rows, say):
        rows.append({"model": model, "world": 1, "case": "eager", "error": "rank 0: boom"})

    monkeypatch.setattr(pod_ready, "bench_model", failing)
    args = ["--device", "cpu", "--models", "small_mlp", "--cases", "eager"]
    assert main([*args, "--out", str(tmp_path / "out.json")]) == 1
    assert "failed pods: small_mlp eager" in capsys.readouterr().err


def test_the_bench_runs_as_a_script_and_refuses_an_unknown_case():
    import subprocess

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "bench/pod_ready.py", "--cases", "warm", "--device", "cpu"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0 and "--cases warm: not a case" in done.stderr


def test_a_failed_rank_ends_its_peers_and_a_hung_one_ends_at_the_limit(tmp_path, monkeypatch):
    from bench import pod_ready

    monkeypatch.setattr(pod_ready, "GRACE_S", 0.3)
    fail, hang = (
        [sys.executable, "-c", code]
        for code in ("raise SystemExit(3)", "import time; time.sleep(60)")
    )
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    clock = time.monotonic()
    codes = pod_ready._run_all([fail, hang], [{}, {}], logs, timeout_s=60)
    assert codes[0] == 3 and codes[1] is not None and codes[1] < 0  # ended by our signal
    [code] = pod_ready._run_all([hang], [{}], logs[:1], timeout_s=0.3)
    assert code is not None and code < 0 and time.monotonic() - clock < 20


def test_a_server_rank_past_its_limit_leaves_its_stacks_in_its_log(tmp_path):
    from bench import pod_ready

    hang = (
        "import faulthandler, time\n"
        "from bench.pod_server import DUMP_SIGNAL\n"
        "faulthandler.register(DUMP_SIGNAL, all_threads=True)\n"
        "def stuck_in_a_call():\n"
        "    time.sleep(60)\n"
        "print('started', flush=True)\n"
        "stuck_in_a_call()\n"
    )
    log = tmp_path / "server-0.log"
    env = {"PYTHONPATH": str(pod_ready.ROOT)}
    [code] = pod_ready._run_all([[sys.executable, "-c", hang]], [env], [log], 3.0, dump=True)
    assert code is not None and code < 0
    assert "stuck_in_a_call" in log.read_text()


def test_append_keeps_what_this_run_does_not_measure_again(tmp_path):
    import argparse

    from bench.pod_ready import kept

    out = tmp_path / "pod_ready.json"
    out.write_text(json.dumps(result_of([*all_cases(), *all_cases_of("other")])))
    args = argparse.Namespace(out=str(out), world=1, device="cuda")
    rows = kept(args, ["m"], ["cold", "eager", "nccl_eager"])
    assert [(r["model"], r["case"]) for r in rows if r["model"] == "m"] == [
        ("m", "persisted"),
        ("m", "first_pod"),
        ("m", "warm_fleet"),
        ("m", "package"),
    ]
    assert len([r for r in rows if r["model"] == "other"]) == 7
    with pytest.raises(SystemExit, match="world 1 on cuda, this one at world 2"):
        kept(argparse.Namespace(out=str(out), world=2, device="cuda"), ["m"], ["cold"])
    assert kept(argparse.Namespace(out=str(tmp_path / "none.json")), ["m"], ["cold"]) == []


def test_the_harvest_is_waited_for_until_the_folders_are_quiet(tmp_path):
    from bench.pod_ready import wait_quiet

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "old").write_text("x")
    assert wait_quiet([tmp_path / "a"], quiet_s=0.0) < 0.5
    os.utime(tmp_path / "a" / "old", (1.0, 1.0))  # quiet since long ago: still waits
    assert 0.9 < wait_quiet([tmp_path / "a"], quiet_s=1.0, limit_s=5.0) < 3.0
    (tmp_path / "a" / "new").write_text("x")
    waited = wait_quiet([tmp_path / "a", tmp_path / "missing"], quiet_s=1.0, limit_s=5.0)
    assert 0.9 < waited < 3.0
    assert wait_quiet([tmp_path / "a"], quiet_s=60.0, limit_s=0.2) < 1.0  # the limit bounds it
