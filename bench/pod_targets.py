"""[4.1]'s and [5.2]'s targets on a ``bench/pod_ready.py`` result: a pod's time to ready
against its anchors, and what its server compiled, imported and served."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from bench.verdict import Verdict, per_shape

WARM_OVER_PERSISTED = 0.9  # [4.1]: a warm fleet's pod <= 0.9x the persisted-dir server
WARM_OVER_COLD = 0.45  # [4.1]: ... and <= 0.45x a cold server, end to end
WARM_OVER_EAGER = 2.5  # [4.1] stretch: ... and <= 2.5x the model uncompiled
INIT_ON_HIT_S = 1.5  # [4.1]: the init container on a full hit, process start to exit
FIRST_POD_OVER_COLD = 1.15  # [4.1]: a fleet's first pod <= 1.15x a cold server
POD_FIRST_OVER_STEADY = 1.5  # [4.1]: first request after ready <= 1.5x steady, every shape
PACKAGE_OVER_PERSISTED = 0.5  # [5.2]: a warm pod serving packages <= 0.5x persisted dirs
PACKAGE_OVER_NCCL_EAGER = 1.2  # [5.2]: ... and <= 1.2x the server with NCCL + cuBLAS, eager
OP_START_S = 1.0  # [5.2]: the serving op's start, per process, at any world size
COMPILER_MODULES = ("torch._dynamo", "torch._inductor.compile_fx")  # [5.2]: never imported
PRIMING_COSTS = ("fxgraph_misses", "inductor_compiles", "kernel_compiles", "autotune_runs")
READY_COSTS = ("dynamo_frames", *PRIMING_COSTS)  # after ready a Dynamo trace is a compile too


def pod_ratios(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model of a ``bench/pod_ready.py`` run: the warm fleet's end to end over each
    anchor's, its init container's seconds, the first pod's over cold, the package
    pod's over the persisted dirs' and over ``nccl_eager`` (None: a case not measured)."""
    ratios = []
    for model in dict.fromkeys(row["model"] for row in pods):
        ready = {
            row["case"]: row["ready_s"]
            for row in pods
            if row["model"] == model and row.get("ready_s") is not None
        }
        warm = next((r for r in pods if r["model"] == model and r["case"] == "warm_fleet"), {})
        ratios.append(
            {
                "model": model,
                "world": pods[0].get("world"),
                "warm_over_persisted": _over(ready, "warm_fleet", "persisted"),
                "warm_over_cold": _over(ready, "warm_fleet", "cold"),
                "warm_over_eager": _over(ready, "warm_fleet", "eager"),
                "first_pod_over_cold": _over(ready, "first_pod", "cold"),
                "init_on_hit_s": _init_s(warm),
                "package_over_persisted": _over(ready, "package", "persisted"),
                "package_over_nccl_eager": _over(ready, "package", "nccl_eager"),
            }
        )
    return ratios


def _init_s(pod: dict[str, Any]) -> float | None:
    """A pod's init container seconds, where the pod got ready."""
    return pod.get("init", {}).get("wall_s") if pod.get("ready_s") is not None else None


def _over(ready: dict[str, float], over: str, under: str) -> float | None:
    if over not in ready or not ready.get(under):
        return None
    return ready[over] / ready[under]


def pod_ready(result: dict[str, Any]) -> list[Verdict]:
    """[4.1] on one ``bench/pod_ready.py`` run, each target over its models: the warm
    fleet against the anchors, the init container on a full hit, the first pod against
    cold, and the warm fleet's server: no compile while priming (Dynamo's traces, which
    no cache spares a new process, shown beside) or after ready, and every first
    request within the bound of its steady time."""
    rows = [{**r, "shape": [f"{r['model']} w{r['world']}"]} for r in result["ratios"]]
    warm = [
        {**r, "shape": [f"{r['model']} w{r['world']}"]}
        for r in result["pods"]
        if r["case"] == "warm_fleet" and r.get("ready_s") is not None
    ]

    def bound(key: str, limit: float, what: str) -> Verdict:
        return per_shape(f"[4.1] {what} <= {limit}", rows, lambda r: r[key], lambda x: x <= limit)

    return [*_warm_fleet(result, rows, warm, bound), *package(result)]


def _warm_fleet(
    result: dict[str, Any],
    rows: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    bound: Callable[[str, float, str], Verdict],
) -> list[Verdict]:
    """[4.1]'s targets."""
    return [
        bound(
            "warm_over_persisted", WARM_OVER_PERSISTED, "warm fleet ÷ persisted dirs (best of 3)"
        ),
        bound("warm_over_cold", WARM_OVER_COLD, "warm fleet ÷ cold"),
        bound("warm_over_eager", WARM_OVER_EAGER, "stretch: warm fleet ÷ eager"),
        bound("init_on_hit_s", INIT_ON_HIT_S, "init container on a full hit, s"),
        bound("first_pod_over_cold", FIRST_POD_OVER_COLD, "first pod ÷ cold"),
        per_shape(
            f"[4.1] warm fleet's server priming: 0 of {', '.join(PRIMING_COSTS)}",
            warm,
            lambda r: float(sum(r["counts"]["priming"].get(k, 0) for k in PRIMING_COSTS)),
            lambda x: x == 0,
            label=lambda r: f" (Dynamo frames {r['counts']['priming'].get('dynamo_frames', 0)})",
        ),
        _nothing_after_ready("[4.1] warm fleet's server", warm),
        per_shape(
            f"[4.1] warm fleet: first request ÷ steady <= {POD_FIRST_OVER_STEADY} at every shape",
            warm,
            lambda r: max((s["ratio"] for s in r["shapes"].values()), default=None),
            lambda x: x <= POD_FIRST_OVER_STEADY,
            label=lambda r: " (the worst shape's)",
        ),
    ]


def _timed(result: dict[str, Any], case: str) -> list[dict[str, Any]]:
    """The pods of ``case`` that got ready, each named ``model wN`` as its shape."""
    return [
        {**r, "shape": [f"{r['model']} w{r['world']}"]}
        for r in result["pods"]
        if r["case"] == case and r.get("ready_s") is not None
    ]


def _op_start_s(row: dict[str, Any]) -> float | None:
    """The serving ops' start of a pod's slowest rank: the sum of its ``op`` phases
    (None: the pod made no serving op)."""
    ranks = row.get("ranks") or [row["phases"]]
    starts = [[v for k, v in phases.items() if k.startswith("op ")] for phases in ranks]
    return max(sum(s) for s in starts) if any(starts) else None


def package(result: dict[str, Any]) -> list[Verdict]:
    """[5.2] on one ``bench/pod_ready.py`` run: the warm pod serving packages against
    the persisted dirs and the NCCL + cuBLAS eager server, end to end; the serving op's
    start per process (the package and warm fleet pods); and the package pod's server:
    every model served as a package, the compiler never imported, no compile after
    ready, every first request within the bound of its steady time, shape by shape."""
    rows = [{**r, "shape": [f"{r['model']} w{r['world']}"]} for r in result["ratios"]]
    pods = _timed(result, "package")
    shapes = [
        {"shape": [f"{r['model']} w{r['world']} {label}"], "ratio": shape["ratio"]}
        for r in pods
        for label, shape in r["shapes"].items()
    ]

    def bound(key: str, limit: float, what: str) -> Verdict:
        return per_shape(f"[5.2] {what} <= {limit}", rows, lambda r: r[key], lambda x: x <= limit)

    return [
        bound("package_over_persisted", PACKAGE_OVER_PERSISTED, "package ÷ persisted dirs"),
        bound("package_over_nccl_eager", PACKAGE_OVER_NCCL_EAGER, "package ÷ nccl_eager"),
        per_shape(
            f"[5.2] the serving op's start, s per process (slowest rank) <= {OP_START_S}",
            [{**r, "shape": [f"{r['shape'][0]} {r['case']}"]} for r in _warm_pods(result)],
            _op_start_s,
            lambda x: x <= OP_START_S,
        ),
        per_shape(
            "[5.2] package pod: every model served as a package (models not)",
            pods,
            lambda r: _count(r.get("served_as"), lambda how: how != "package"),
            lambda x: x == 0,
            label=lambda r: f" {r.get('served_as') or '(not reported)'}",
        ),
        per_shape(
            f"[5.2] package pod: no rank imported {' or '.join(COMPILER_MODULES)} (imported)",
            pods,
            lambda r: _count(r.get("imported"), bool, COMPILER_MODULES),
            lambda x: x == 0,
            label=lambda r: "".join(f" {m}" for m in COMPILER_MODULES if r["imported"].get(m)),
        ),
        _nothing_after_ready("[5.2] package pod", pods),
        per_shape(
            f"[5.2] package pod: first request ÷ steady <= {POD_FIRST_OVER_STEADY} at each shape",
            shapes,
            lambda r: r["ratio"],
            lambda x: x <= POD_FIRST_OVER_STEADY,
        ),
    ]


def _nothing_after_ready(what: str, rows: list[dict[str, Any]]) -> Verdict:
    """No Dynamo trace, FX-graph miss, compile or autotune benchmark after ready in
    ``rows``' servers, pod by pod."""
    return per_shape(
        f"{what} after ready: 0 of {', '.join(READY_COSTS)}",
        rows,
        lambda r: float(sum(r["counts"]["after_ready"].get(k, 0) for k in READY_COSTS)),
        lambda x: x == 0,
    )


def _count(
    reported: dict[str, Any] | None, counts: Callable[[Any], bool], keys: Iterable[str] = ()
) -> float | None:
    """How many of ``reported``'s values (those of ``keys``, if given) ``counts``; None
    where nothing was reported (a server before [5.2])."""
    if not reported:
        return None
    return float(sum(counts(reported.get(k)) for k in keys or reported))


def _warm_pods(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [*_timed(result, "warm_fleet"), *_timed(result, "package")]
