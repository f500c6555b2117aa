"""The Helm chart, rendered by Helm's own library (helm-python-sdk, no binary), linted,
and every object validated against Kubernetes 1.33's schemas (strict). The helpers here
(render, containers, env, mounts) serve the other test_chart_*.py files too."""

import copy
import json
import re
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from warmup.core.metrics import RunMetrics, ServeMetrics
from warmup.serving.metrics import ServingMetrics

CHART = Path(__file__).parents[2] / "deploy" / "helm" / "triton-warmup"
KUBE = "1.33.0"
# What the default (engine vllm) needs to run: the chart refuses to render without it.
MINIMUM = {
    "engine": {"model": "/models/qwen3-8b"},
    "server": {"image": {"repository": "registry.example.com/vllm-warm", "tag": "v0.19.1-tw0.1"}},
}
TORCH = {
    "engine": {"name": "torch"},
    "server": {
        "image": {"repository": "my/server", "tag": "1.2"},
        "command": ["python3", "-m", "my_server"],
    },
}
WEIGHTS = {"name": "weights", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
EXTENDED = {
    "extraVolumes": [WEIGHTS, {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
    "server": {
        "extraVolumeMounts": [{"name": "weights", "mountPath": "/models", "readOnly": True}],
        "securityContext": {"readOnlyRootFilesystem": False},
        "service": {"type": "LoadBalancer", "port": 80, "annotations": {"team": "ml"}},
    },
    "warmup": {
        "extraVolumeMounts": [{"name": "weights", "mountPath": "/models", "readOnly": True}]
    },
    "sidecar": {"extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {"create": True, "annotations": {"iam.example.com/role": "warm"}},
    "podLabels": {"team": "ml"},
    "podAnnotations": {"owner": "ml-platform"},
    "priorityClassName": "inference",
    "terminationGracePeriodSeconds": 120,
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"},
}
VARIANTS = {
    "default": {},
    "engine-vllm": {"engine": {"name": "vllm", "model": "Qwen/Qwen3-8B"}},
    "engine-sglang": {
        "engine": {"name": "sglang"},
        "server": {"image": {"repository": "registry.example.com/sglang-warm", "tag": "v0.5.18"}},
    },
    "engine-torch": TORCH,
    "extended": EXTENDED,
    "no-persistence": {"persistence": {"enabled": False}, "workload": {"replicas": 1}},
    "probes-tuned": {
        "server": {
            "healthPath": "/ready",
            "startupProbe": None,
            "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 30},
            "readinessProbe": {"periodSeconds": 2},
        }
    },
    "pdb-max-unavailable": {"podDisruptionBudget": {"enabled": True}},
    "existing-manifest-checksum": {
        "manifest": {"existingConfigMap": "my-shapes", "checksum": "ab" * 32},
        "serviceAccount": {"name": "existing-account"},
    },
    "redis-lock": {"lock": {"backend": "redis", "redisUrl": "redis://redis.ml:6379/0"}},
    "existing-pvc": {"persistence": {"existingClaim": "fleet-cache"}},
    "service-monitor": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}
    },
    "configmap-bundles": {"bundles": {"source": "configMap", "configMapName": "fleet-bundles"}},
    "pvc-bundles": {"bundles": {"source": "pvc", "pvcPath": "published/bundles"}},
    "statefulset": {"workload": {"kind": "StatefulSet", "replicas": 3}},
    "dashboard": {"dashboard": {"enabled": True}},
    "existing-manifest": {"manifest": {"existingConfigMap": "my-shapes"}},
    "cpu-only": {"gpus": 0},
    "strict-compile-guard": {"server": {"compileGuard": "strict"}},
    "triton-remote-cache": {
        "lock": {"backend": "redis", "redisUrl": "redis://redis.ml:6379/0", "tritonCache": True}
    },
    "redis-tls-secret": {
        "lock": {
            "backend": "redis",
            "redisUrl": "rediss://redis.ml:6380/0",
            "redisPasswordSecret": {"name": "redis-auth", "key": "pw"},
            "redisCa": {"configMapName": "redis-ca"},
            "tritonCache": True,
        }
    },
    "allow-unsigned": {"trust": {"allowUnsigned": True}},
    "release-keys": {"trust": {"bundleKeysSecret": "release-keys"}},
    "own-warmup-image": {
        "warmup": {
            "image": {"repository": "ghcr.io/triton-warmup/triton-warmup", "tag": "0.1.0"},
            "command": ["python3", "-m", "warmup"],
        }
    },
}
# The ServiceMonitor is a CRD, not in Kubernetes' schemas: checked against its core shape.
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "properties": {
                "endpoints": {"type": "array", "minItems": 1, "items": {"required": ["port"]}}
            },
        },
    },
}


def merged(base: dict, values: dict) -> dict:
    """``values`` over ``base``, maps merged key by key (a None is kept: Helm drops the key)."""
    out = copy.deepcopy(base)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_minimum(values: dict) -> dict:
    return merged(MINIMUM, values)


def load_chart():
    return helm.Chart.load(str(CHART))


def render(chart, values, *, minimum=True):
    """Objects and texts of the chart rendered with ``values`` (over MINIMUM unless
    ``minimum`` is False: the chart's own defaults alone)."""
    out = chart.render(with_minimum(values) if minimum else values, name="llm", namespace="serving")
    objects = []
    for path, text in sorted(out.items()):
        if not path.endswith(".txt"):
            objects += [d for d in yaml.safe_load_all(text) if d]
    return objects, out


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def workload(objects):
    (found,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    return found


def containers(objects):
    pod = workload(objects)["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["initContainers"] + pod["containers"]}, pod


def rendered_manifest(objects) -> dict:
    """The manifest the pods read: the rendered ConfigMap's manifest.yaml, parsed."""
    (config_map,) = [o for o in by_kind(objects, "ConfigMap") if "manifest.yaml" in o["data"]]
    return yaml.safe_load(config_map["data"]["manifest.yaml"])


def mounts(container):
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def env(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def mount_under(container, path):
    """The volume mount that holds ``path`` in ``container`` (the deepest one)."""
    holding = [
        m
        for m in container.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert holding, f"{path} is not mounted in {container['name']}"
    return max(holding, key=lambda m: len(m["mountPath"]))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_is_valid_kubernetes_1_33(chart, variant):
    objects, _ = render(chart, VARIANTS[variant])
    assert objects
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            jsonschema.validate(obj, SERVICE_MONITOR)
        else:
            kubernetes_validate.validate(obj, KUBE, strict=True)
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "two objects of one kind and name"
    for container in containers(objects)[0].values():
        variables = [e["name"] for e in container.get("env", [])]
        assert len(variables) == len(set(variables)), (container["name"], "a variable set twice")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_is_clean(variant):
    values = with_minimum(VARIANTS[variant])
    report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


def test_labels_follow_helm_practice(chart):
    objects, _ = render(chart, merged(VARIANTS["dashboard"], EXTENDED))
    for obj in objects:
        labels = obj["metadata"]["labels"]
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ):
            assert key in labels, (obj["kind"], key)


@pytest.mark.parametrize(
    "values,needle",
    [
        ({"gpus": "two"}, "gpus"),
        ({"gpus": 9}, "gpus"),
        ({"serverr": {}}, "serverr"),
        ({"server": {"imagee": {}}}, "imagee"),
        ({"workload": {"kind": "DaemonSet"}}, "kind"),
        ({"lock": {"backend": "redis", "redisUrl": ""}}, "redisUrl"),
        ({"lock": {"backend": "etcd"}}, "backend"),
        ({"lock": {"backend": "redis", "redisUrl": "redis://r", "fallback": "maybe"}}, "fallback"),
        ({"bundles": {"source": "configMap", "configMapName": ""}}, "configMapName"),
        ({"persistence": {"size": "lots"}}, "size"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "enabled"),
        ({"warmup": {"matchPolicy": "close-enough"}}, "matchPolicy"),
        ({"server": {"compileGuard": "loud"}}, "compileGuard"),
        ({"lock": {"backend": "file", "tritonCache": True}}, "lock/backend"),
        ({"lock": {"backend": "redis", "redisUrl": "r", "tritonCacheTimeoutSeconds": 0}}, "Time"),
        ({"warmup": {"image": {"repository": "my/warmup"}}}, "tag"),
        ({"warmup": {"image": {"tag": "1.2"}}}, "repository"),
        ({"warmup": {"image": {"pullPolicy": "Sometimes"}}}, "pullPolicy"),
        ({"warmup": {"image": {"repository": "my/warmup", "tag": "1", "digest": "x"}}}, "digest"),
        ({"warmup": {"command": []}}, "command"),
        ({"warmup": {"command": "triton-warmup"}}, "command"),
        ({"warmup": {"modelsOnMiss": "sidecar"}}, "modelsOnMiss"),
        ({"warmup": {"staticLauncher": "false"}}, "staticLauncher"),
        ({"sidecar": {"readyAfterServer": "yes"}}, "readyAfterServer"),
        ({"engine": {"name": "tgi"}}, "name"),
        ({"engine": {"model": 7}}, "model"),
        ({"engine": {"deepgemm": "yes"}}, "deepgemm"),
        ({"server": {"port": 70000}}, "port"),
        ({"server": {"healthPath": "health"}}, "healthPath"),
        ({"server": {"readinessProbe": {"periodSecond": 5}}}, "periodSecond"),
        ({"server": {"livenessProbe": {"failureThreshold": 0}}}, "failureThreshold"),
        ({"server": {"extraVolumeMounts": [{"name": "weights"}]}}, "mountPath"),
        ({"server": {"service": {"type": "Ingress"}}}, "type"),
        ({"warmup": {"extraVolumeMounts": [{"name": "w", "mountPath": "models"}]}}, "mountPath"),
        ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets"),
        ({"serviceAccount": {"create": "yes"}}, "create"),
        ({"podLabels": {"tier": 1}}, "tier"),
        ({"terminationGracePeriodSeconds": -1}, "terminationGracePeriodSeconds"),
        ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "topologyKey"),
        ({"extraVolumes": [{"emptyDir": {}}]}, "name"),
        ({"persistence": {"enabled": "no"}}, "enabled"),
        ({"podDisruptionBudget": {"enabled": True, "minAvailable": "half"}}, "minAvailable"),
        ({"manifest": {"checksum": "not-a-sha"}}, "checksum"),
        (
            {"manifest": {"caches": [{"name": "v", "path": "/c", "key_paths": ["rel"]}]}},
            "key_paths",
        ),
        ({"manifest": {"caches": [{"name": "v", "path": "/c", "engine": "tgi"}]}}, "engine"),
    ],
)
def test_the_schema_rejects_bad_values(chart, values, needle):
    with pytest.raises(helm.HelmValuesError) as info:
        chart.validate_schema(chart.merge_values(with_minimum(values)))
    assert needle in str(info.value)
    with pytest.raises(helm.HelmError):
        render(chart, values)


SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_metric_names() -> set[str]:
    """Every series name the code can export (labelled ones have no samples until used)."""
    names = set()
    for metrics in (
        RunMetrics(CollectorRegistry()),
        ServeMetrics(CollectorRegistry()),
        ServingMetrics(CollectorRegistry()),
    ):
        for family in metrics.registry.collect():
            names.update(family.name + suffix for suffix in SERIES[family.type])
    return names


def test_the_dashboard_queries_only_metrics_the_code_exports(chart):
    dashboard = json.loads((CHART / "dashboards" / "triton-warmup.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\btriton_warmup_[a-z_]+", target["expr"])
    }
    exported = exported_metric_names()
    assert len(queried) >= 8
    assert queried - exported == set(), f"not exported: {queried - exported}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in (
        "warmup duration",
        "tuning seconds",
        "cache hit ratio",
        "lock wait",
        "bundle reloads",
        "while serving",
        "by phase",
        "remote tier",
    ):
        assert topic in titles
    objects, _ = render(chart, VARIANTS["dashboard"])
    (config_map,) = [
        o for o in by_kind(objects, "ConfigMap") if "dashboard" in o["metadata"]["name"]
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["triton-warmup.json"]) == dashboard


def notes(out) -> str:
    return out["triton-warmup/templates/NOTES.txt"]


def recipe_lines(text: str, word: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if word in line]


def test_notes_tell_how_to_watch_and_publish(chart):
    text = notes(render(chart, VARIANTS["configmap-bundles"])[1])
    assert "/readyz" in text and "bundle create" in text and "fleet-bundles" in text
    (create,) = recipe_lines(text, "bundle create")
    assert "--sign-key" in create  # the chart's default trust refuses an unsigned bundle
    assert "triton-warmup-trusted-keys" in text  # the Secret whose keys must sign it
    released = notes(render(chart, VARIANTS["release-keys"])[1])
    assert "its .pub in release-keys" in released


def test_the_port_forward_recipe_reaches_its_curl(chart):
    """`kubectl port-forward` never returns: a `&& curl` after it never runs."""
    text = notes(render(chart, {})[1])
    (forward,) = recipe_lines(text, "kubectl port-forward")
    (curl,) = recipe_lines(text, "curl")
    assert forward.endswith("&") and "&&" not in forward
    assert forward.startswith("kubectl port-forward deployment/llm-triton-warmup 9400")
    assert curl == "curl -s localhost:9400/readyz"
    stateful = notes(render(chart, VARIANTS["statefulset"])[1])
    assert "kubectl port-forward statefulset/llm-triton-warmup" in stateful
    assert "kubectl logs -f statefulset/llm-triton-warmup -c warmup" in stateful
