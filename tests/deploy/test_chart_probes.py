"""The pod is Ready only when its server can serve: the server's own probes (per engine,
settable) and the sidecar's /readyz both gate it."""

import helm_python as helm
import pytest

from tests.deploy.test_chart import (
    TORCH,
    VARIANTS,
    containers,
    env,
    render,
)


def http_port(container) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "http"]
    return port


def gets(probe) -> tuple[str, str]:
    return probe["httpGet"]["path"], probe["httpGet"]["port"]


def test_the_default_pod_cannot_be_ready_before_its_servers_own_probe(chart):
    """Pod readiness is every container's: the native sidecar's /readyz (the warmup
    completed) and the server's readinessProbe (its /health) are both there."""
    by_name, pod = containers(render(chart, {})[0])
    server, sidecar = by_name["server"], by_name["warmup-sidecar"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: its readiness counts
    assert gets(sidecar["readinessProbe"]) == ("/readyz", "metrics")
    assert gets(server["readinessProbe"]) == ("/health", "http")
    assert http_port(server) == 8000  # vLLM's
    # every container that runs alongside the server has a readiness gate
    running = [c for c in pod["initContainers"] if c.get("restartPolicy") == "Always"]
    assert all("readinessProbe" in c for c in running + pod["containers"])


def test_model_loading_gets_a_long_startup_budget_and_liveness_waits_for_it(chart):
    server = containers(render(chart, {})[0])[0]["server"]
    startup, liveness = server["startupProbe"], server["livenessProbe"]
    assert gets(startup) == gets(liveness) == ("/health", "http")
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
    # once started, a server that stops answering for a minute is restarted
    assert liveness["periodSeconds"] * liveness["failureThreshold"] == 60


@pytest.mark.parametrize(
    "values,port",
    [
        ({"engine": {"name": "vllm"}}, 8000),
        ({"engine": {"name": "sglang"}}, 30000),
        (TORCH, 8000),
        ({"engine": {"name": "sglang"}, "server": {"port": 31000}}, 31000),
    ],
)
def test_each_engine_is_probed_on_its_own_port(chart, values, port):
    server = containers(render(chart, values)[0])[0]["server"]
    assert http_port(server) == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert gets(server[probe]) == ("/health", "http")


def test_probes_take_what_is_given_over_the_default(chart):
    server = containers(render(chart, VARIANTS["probes-tuned"])[0])[0]["server"]
    assert "startupProbe" not in server  # null: off
    assert server["readinessProbe"] == {
        "httpGet": {"path": "/ready", "port": "http"},  # the torch server's own path
        "periodSeconds": 2,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    # a probe with its own handler replaces the default's httpGet
    assert server["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert "httpGet" not in server["livenessProbe"]
    assert server["livenessProbe"]["periodSeconds"] == 30
    off = containers(render(chart, {"server": {"livenessProbe": None}})[0])[0]["server"]
    assert "livenessProbe" not in off and "readinessProbe" in off


def test_readiness_cannot_be_turned_off(chart):
    with pytest.raises(helm.HelmError, match=r"server\.readinessProbe .*Ready before its server"):
        render(chart, {"server": {"readinessProbe": None}})


def test_a_server_that_declares_warm_adds_the_sidecars_gate(chart):
    """readyAfterServer is an addition: the server's own probe stays."""
    asked = {"gpus": 4, "sidecar": {"readyAfterServer": True}}
    by_name, _ = containers(render(chart, asked)[0])
    assert env(by_name["warmup-sidecar"])["TRITON_WARMUP_READY_AFTER_SERVER"] == "4"
    assert gets(by_name["server"]["readinessProbe"]) == ("/health", "http")
