"""Where operators extend the chart: volumes and mounts, pull secrets, a service account,
pod labels, scheduling, Services, the server's security context, persistence off, a
PodDisruptionBudget and the manifest's checksum (each variant is also rendered and
validated against Kubernetes' schemas in test_chart.py)."""

import hashlib
import re

import helm_python as helm
import pytest

from tests.deploy.test_chart import (
    EXTENDED,
    VARIANTS,
    WEIGHTS,
    by_kind,
    containers,
    mount_under,
    render,
    workload,
)

SELECTOR = {"app.kubernetes.io/name": "triton-warmup", "app.kubernetes.io/instance": "llm"}


@pytest.fixture(scope="module")
def extended(chart):
    return render(chart, EXTENDED)[0]


def test_extra_volumes_are_mounted_where_asked(extended):
    by_name, pod = containers(extended)
    assert WEIGHTS in pod["volumes"]
    for name in ("server", "warmup"):  # the model's weights, read by both
        weights = mount_under(by_name[name], "/models/qwen3-8b")
        assert weights == {"name": "weights", "mountPath": "/models", "readOnly": True}
    assert mount_under(by_name["warmup-sidecar"], "/scratch")["name"] == "scratch"
    assert "weights" not in {m["name"] for m in by_name["warmup-sidecar"]["volumeMounts"]}


def test_the_pod_takes_pull_secrets_an_account_labels_and_scheduling(extended):
    template = workload(extended)["spec"]["template"]
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "inference"
    assert pod["terminationGracePeriodSeconds"] == 120
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["annotations"]["owner"] == "ml-platform"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"] == {"matchLabels": SELECTOR}  # the pod's own, by default
    (account,) = by_kind(extended, "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "llm-triton-warmup"
    assert account["metadata"]["annotations"] == {"iam.example.com/role": "warm"}


def test_an_existing_service_account_is_named_not_created(chart):
    objects, _ = render(chart, VARIANTS["existing-manifest-checksum"])
    assert workload(objects)["spec"]["template"]["spec"]["serviceAccountName"] == (
        "existing-account"
    )
    assert by_kind(objects, "ServiceAccount") == []
    default, _ = render(chart, {})
    assert "serviceAccountName" not in workload(default)["spec"]["template"]["spec"]


def test_the_servers_port_has_a_service(chart, extended):
    objects, _ = render(chart, {})
    (service,) = [
        s for s in by_kind(objects, "Service") if s["metadata"]["name"] == "llm-triton-warmup"
    ]
    assert service["spec"]["selector"] == SELECTOR
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]
    (balanced,) = [
        s for s in by_kind(extended, "Service") if s["metadata"]["name"] == "llm-triton-warmup"
    ]
    assert balanced["spec"]["type"] == "LoadBalancer" and balanced["spec"]["ports"][0]["port"] == 80
    assert balanced["metadata"]["annotations"] == {"team": "ml"}
    sglang, _ = render(chart, VARIANTS["engine-sglang"])
    ports = [s["spec"]["ports"][0]["port"] for s in by_kind(sglang, "Service")]
    assert 30000 in ports
    off, _ = render(chart, {"server": {"service": {"enabled": False}}})
    assert [s["metadata"]["name"] for s in by_kind(off, "Service")] == ["llm-triton-warmup-metrics"]


def test_the_server_runs_non_root_with_a_read_only_root_and_writable_folders(chart, extended):
    by_name, pod = containers(render(chart, {})[0])
    server = by_name["server"]
    assert server["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["runAsUser"] == 10001
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in ("/home/serving", "/tmp", "/var/cache/engine/vllm", "/var/cache/triton"):
        mount = mount_under(server, path)
        assert not mount.get("readOnly") and "emptyDir" in volumes[mount["name"]], path
    # the server's /tmp is its own, not the warmup's and sidecar's
    assert mount_under(server, "/tmp")["name"] != mount_under(by_name["warmup"], "/tmp")["name"]
    merged = containers(extended)[0]["server"]["securityContext"]
    assert merged["readOnlyRootFilesystem"] is False and merged["capabilities"] == {"drop": ["ALL"]}


def test_persistence_off_is_an_empty_dir_and_no_claim(chart):
    objects, out = render(chart, VARIANTS["no-persistence"])
    assert by_kind(objects, "PersistentVolumeClaim") == []
    _, pod = containers(objects)
    (volume,) = [v for v in pod["volumes"] if v["name"] == "cache-volume"]
    assert volume == {"name": "cache-volume", "emptyDir": {}}
    assert "nothing is shared or kept" in out["triton-warmup/templates/NOTES.txt"]


def test_a_disruption_budget_when_asked(chart, extended):
    (budget,) = by_kind(extended, "PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": "50%", "selector": {"matchLabels": SELECTOR}}
    objects, _ = render(chart, VARIANTS["pdb-max-unavailable"])
    (budget,) = by_kind(objects, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert by_kind(render(chart, {})[0], "PodDisruptionBudget") == []
    both = {"podDisruptionBudget": {"enabled": True, "minAvailable": 1, "maxUnavailable": 1}}
    with pytest.raises(helm.HelmError, match="not both"):
        render(chart, both)
    for zero, given in (("maxUnavailable", 0), ("minAvailable", 0), ("maxUnavailable", "0")):
        budget = {"podDisruptionBudget": {"enabled": True, zero: given}}
        (pdb,) = by_kind(render(chart, budget)[0], "PodDisruptionBudget")
        assert pdb["spec"][zero] == 0, zero  # 0 is a value: no evictions, not the default 1
    with pytest.raises(helm.HelmError, match="not both"):
        both_zero = {"enabled": True, "minAvailable": 0, "maxUnavailable": 2}
        render(chart, {"podDisruptionBudget": both_zero})


def checksum(objects) -> str | None:
    metadata = workload(objects)["spec"]["template"]["metadata"]
    return metadata.get("annotations", {}).get("checksum/manifest")


def test_the_pods_roll_when_the_manifest_changes(chart):
    objects, _ = render(chart, {})
    (config_map,) = by_kind(objects, "ConfigMap")
    text = config_map["data"]["manifest.yaml"].rstrip("\n")
    assert checksum(objects) == hashlib.sha256(text.encode()).hexdigest()
    other, _ = render(chart, {"engine": {"model": "/models/other"}})  # the key changed
    assert checksum(other) != checksum(objects)
    # an existing ConfigMap: read at install (lookup), unknown to helm template: the value
    given, _ = render(chart, VARIANTS["existing-manifest-checksum"])
    assert checksum(given) == "ab" * 32
    unknown, _ = render(chart, VARIANTS["existing-manifest"])
    assert checksum(unknown) is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"podLabels": {"app.kubernetes.io/name": "x"}}, "podLabels: app.kubernetes.io/name"),
        ({"podLabels": {"app.kubernetes.io/component": "x"}}, "podLabels: app.kubernetes.io/comp"),
        ({"podAnnotations": {"checksum/manifest": "abc"}}, "set manifest.checksum"),
        ({"server": {"ports": [{"name": "http", "containerPort": 9000}]}}, "server.ports"),
        ({"server": {"ports": [{"name": "grpc", "containerPort": 8000}]}}, "server.ports"),
        ({"extraVolumes": [{"name": "home", "emptyDir": {}}]}, "extraVolumes: home"),
        ({"extraVolumes": [{"name": "declared-cache-0", "emptyDir": {}}]}, "declared-cache-0"),
    ],
)
def test_an_extension_that_collides_with_the_charts_own_fails_with_one_message(
    chart, values, message
):
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(chart, values)


def test_every_volume_the_chart_mounts_is_refused_as_an_extra_one(chart):
    """checkExtensions lists the chart's own volume names: one added to the templates and
    not to that list would collide at install only."""
    values = {
        "bundles": {"source": "configMap", "configMapName": "b"},
        "trust": {"bundleKeysSecret": "release-keys"},
        "lock": {"redisUrl": "rediss://r:6380/0", "backend": "redis",
                 "redisCa": {"configMapName": "ca"}, "tritonCache": True},
    }  # fmt: skip
    _, pod = containers(render(chart, values)[0])
    for name in [v["name"] for v in pod["volumes"]]:
        with pytest.raises(helm.HelmError, match=re.escape(f"extraVolumes: {name} ")):
            render(chart, {**values, "extraVolumes": [{"name": name, "emptyDir": {}}]})
