"""The chart's pod: the warmup init container, the sidecar and the server agree on every
path and setting, the warmup runs in the server's image, and the sidecar harvests."""

import helm_python as helm
import pytest

from tests.deploy.test_chart import (
    CHART,
    TORCH,
    VARIANTS,
    by_kind,
    containers,
    env,
    mount_under,
    mounts,
    render,
    workload,
)
from warmup.compiled.environment import inductor_environment
from warmup.core.settings import Settings


def test_init_sidecar_and_server_agree_on_paths(chart):
    objects, _ = render(chart, {})
    by_name, pod = containers(objects)
    init, sidecar, server = by_name["warmup"], by_name["warmup-sidecar"], by_name["server"]
    volume = mounts(init)["cache-volume"]
    assert mounts(sidecar)["cache-volume"] == volume == mounts(server)["cache-volume"]
    assert env(init)["TRITON_WARMUP_VOLUME"] == env(sidecar)["TRITON_WARMUP_VOLUME"] == volume
    assert env(server)["TRITON_WARMUP_VOLUME"] == volume
    assert env(server)["TRITON_WARMUP_REGISTRY_DIR"] == volume + "/registry"
    cache = mounts(init)["triton-cache"]
    assert mounts(server)["triton-cache"] == cache == env(server)["TRITON_CACHE_DIR"]
    assert env(init)["TRITON_CACHE_DIR"] == env(init)["TRITON_WARMUP_TRITON_CACHE_DIR"] == cache
    assert (
        mounts(init)["warmup-work"]
        == mounts(sidecar)["warmup-work"]
        == env(sidecar)["TRITON_WARMUP_WORK_DIR"]
    )  # the status file the probe reads
    manifest = env(init)["TRITON_WARMUP_MANIFEST"]
    assert manifest == env(sidecar)["TRITON_WARMUP_MANIFEST"]
    assert manifest.startswith(mounts(init)["manifest"] + "/")
    server_volume = next(m for m in server["volumeMounts"] if m["name"] == "cache-volume")
    assert server_volume.get("readOnly") is True
    assert {v["name"] for v in pod["volumes"]} >= {
        "cache-volume",
        "triton-cache",
        "warmup-work",
        "manifest",
    }


def test_the_server_gets_everything_to_reuse_the_warm_state(chart):
    objects, _ = render(chart, {})
    by_name, pod = containers(objects)
    init, sidecar, server = by_name["warmup"], by_name["warmup-sidecar"], by_name["server"]
    serve = env(server)
    # the compile cache the warmup init container wrote, and Triton's autotune-result cache
    cache = env(init)["TRITON_CACHE_DIR"]
    assert mount_under(init, cache)["name"] == mount_under(server, cache)["name"] == "triton-cache"
    assert serve["TRITON_CACHE_DIR"] == serve["TRITON_WARMUP_TRITON_CACHE_DIR"] == cache
    assert mounts(server)["triton-cache"] == cache
    assert not mount_under(server, cache).get("readOnly")
    assert serve["TRITON_CACHE_AUTOTUNING"] == "1"
    assert mount_under(server, serve["TRITON_WARMUP_REGISTRY_DIR"])["name"] == "cache-volume"
    # compiled models: the Inductor cache the warmup restored and filled, on both sides
    inductor = env(init)["TRITON_WARMUP_INDUCTOR_CACHE_DIR"]
    assert serve["TRITON_WARMUP_INDUCTOR_CACHE_DIR"] == serve["TORCHINDUCTOR_CACHE_DIR"] == inductor
    assert mount_under(init, inductor)["name"] == mount_under(server, inductor)["name"]
    assert mount_under(server, inductor)["name"] == "inductor-cache"
    assert not mount_under(server, inductor).get("readOnly")  # Inductor takes file locks
    # the sidecar brings a bundle's compiled models into that cache (hot reload)
    assert env(sidecar)["TRITON_WARMUP_INDUCTOR_CACHE_DIR"] == inductor
    assert mount_under(sidecar, inductor)["name"] == "inductor-cache"
    assert not mount_under(sidecar, inductor).get("readOnly")
    assert serve["CUDA_CACHE_PATH"] == env(init)["CUDA_CACHE_PATH"] == inductor + "/cuda-jit"
    assert serve["TORCHINDUCTOR_FX_GRAPH_CACHE"] == serve["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    # the static launcher enters the FX graph's key: one choice in both (torch's default)
    static = "TRITON_WARMUP_STATIC_LAUNCHER"
    assert serve[static] == env(init)[static] == Settings().models.static_launcher == "on"
    assert inductor_environment(Settings())["TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"] == "1"
    # the manifest, so that Serving.model(name) builds what the warmup warmed
    assert serve["TRITON_WARMUP_MANIFEST"] == env(init)["TRITON_WARMUP_MANIFEST"]
    assert mount_under(server, serve["TRITON_WARMUP_MANIFEST"])["name"] == "manifest"
    # one emptyDir for the serving metrics: the server writes, the sidecar reads
    folder = serve["TRITON_WARMUP_METRICS_DIR"]
    assert env(sidecar)["TRITON_WARMUP_METRICS_DIR"] == folder
    written, read = mount_under(server, folder), mount_under(sidecar, folder)
    assert written["name"] == read["name"] == "serving-metrics"
    assert written["mountPath"] == read["mountPath"] == folder
    assert not written.get("readOnly") and read.get("readOnly") is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["serving-metrics"]
    # the status file the init container writes, read-only in the server
    status = serve["TRITON_WARMUP_STATUS_FILE"]
    assert env(init)["TRITON_WARMUP_STATUS_FILE"] == env(sidecar)["TRITON_WARMUP_STATUS_FILE"]
    assert env(init)["TRITON_WARMUP_STATUS_FILE"] == status
    assert mount_under(server, status)["name"] == mount_under(init, status)["name"]
    assert mount_under(server, status).get("readOnly") is True
    assert serve["TRITON_WARMUP_MATCH_POLICY"] == env(init)["TRITON_WARMUP_MATCH_POLICY"]
    assert serve["TRITON_WARMUP_COMPILE_GUARD"] == "count"
    strict, _ = containers(render(chart, VARIANTS["strict-compile-guard"])[0])
    assert env(strict["server"])["TRITON_WARMUP_COMPILE_GUARD"] == "strict"


SERVER_IMAGE = {"repository": "my/server", "tag": "1.2", "pullPolicy": "Always"}


def image(values: dict) -> str:
    return f"{values['repository']}:{values['tag']}"


def console_scripts() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((CHART.parents[2] / "pyproject.toml").read_text())["project"]
    return project["scripts"]


def test_the_warmup_runs_in_the_servers_image_by_default(chart):
    by_name, _ = containers(render(chart, {"server": {"image": SERVER_IMAGE}})[0])
    warm, server, sidecar = by_name["warmup"], by_name["server"], by_name["warmup-sidecar"]
    assert warm["image"] == server["image"] == image(SERVER_IMAGE)
    assert warm["imagePullPolicy"] == server["imagePullPolicy"] == "Always"
    # the package's console script, installed into the server's Python, runs the warmup
    assert warm["command"] == ["triton-warmup"] and warm["args"] == ["run"]
    assert console_scripts()["triton-warmup"] == "warmup.program:entry"
    # the sidecar imports no torch: it keeps this project's slim image
    defaults = chart.merge_values({})
    assert sidecar["image"] == image(defaults["sidecar"]["image"]) != server["image"]
    assert sidecar["args"][0] == "serve" and "command" not in sidecar
    assert env(warm)["TRITON_WARMUP_DEVICE"] == "cuda"  # the server's image does not say so
    cpu, _ = containers(render(chart, {"gpus": 0})[0])
    assert "TRITON_WARMUP_DEVICE" not in env(cpu["warmup"])


def test_an_explicit_warmup_image_is_used(chart):
    values = {**VARIANTS["own-warmup-image"], "server": {"image": SERVER_IMAGE}}
    objects, out = render(chart, values)
    by_name, _ = containers(objects)
    warm, server = by_name["warmup"], by_name["server"]
    own = values["warmup"]["image"]
    assert warm["image"] == image(own) and server["image"] == image(SERVER_IMAGE)
    assert warm["imagePullPolicy"] == "IfNotPresent"  # not the server's: another image
    assert warm["command"] == ["python3", "-m", "warmup"] and warm["args"] == ["run"]
    assert (CHART.parents[2] / "warmup" / "__main__.py").is_file()  # what `-m warmup` runs
    defaults = chart.merge_values({})
    assert by_name["warmup-sidecar"]["image"] == image(defaults["sidecar"]["image"])
    notes = out["triton-warmup/templates/NOTES.txt"]
    assert image(own) in notes and "logs each differing factor" in notes
    pinned = {"warmup": {"image": {**own, "pullPolicy": "Never"}}}
    assert containers(render(chart, pinned)[0])[0]["warmup"]["imagePullPolicy"] == "Never"
    _, default_out = render(chart, {"server": {"image": SERVER_IMAGE}})
    assert "server's image, my/server:1.2" in default_out["triton-warmup/templates/NOTES.txt"]


# Settings only the warmup run reads: the server takes its world and device from torch.
RUN_ONLY = {
    "TRITON_WARMUP_RANK_TIMEOUT_S",
    "TRITON_WARMUP_RUN_TIMEOUT_S",
    "TRITON_WARMUP_WORLD_SIZE",
    "TRITON_WARMUP_DEVICE",
    "TRITON_WARMUP_MODELS_ON_MISS",
    "TRITON_WARMUP_SIGNING_KEY",  # the server signs only with lock.tritonCache: it publishes
}


@pytest.mark.parametrize("variant", ["default", "redis-lock", "triton-remote-cache"])
def test_the_server_reads_the_settings_the_warmup_ran_with(chart, variant):
    by_name, _ = containers(render(chart, VARIANTS[variant])[0])
    warm, server = env(by_name["warmup"]), env(by_name["server"])
    shared = {k: v for k, v in warm.items() if k.startswith("TRITON_WARMUP_")}
    assert shared.keys() - RUN_ONLY - server.keys() == set()
    assert {k: server[k] for k in shared.keys() - RUN_ONLY} == {
        k: v for k, v in shared.items() if k not in RUN_ONLY
    }
    # the init's status and work folder, mounted where the settings say, read-only
    for key in ("TRITON_WARMUP_STATUS_FILE", "TRITON_WARMUP_WORK_DIR"):
        held = mount_under(by_name["server"], server[key])
        assert held["name"] == "warmup-work" and held.get("readOnly") is True
    names = [e["name"] for e in by_name["server"]["env"]]
    assert len(names) == len(set(names)), "an env var set twice"


def test_gpus_only_on_the_init_container_and_the_server(chart):
    objects, _ = render(chart, {"gpus": 4})
    by_name, _ = containers(objects)
    gpus = {
        name: c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        for name, c in by_name.items()
    }
    assert gpus == {"warmup": 4, "server": 4, "warmup-sidecar": None}
    assert env(by_name["warmup"])["TRITON_WARMUP_WORLD_SIZE"] == "4"
    cpu, _ = containers(render(chart, {"gpus": 0})[0])
    assert all(
        "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}) for c in cpu.values()
    )


def test_the_sidecar_is_native_with_probes_and_the_warmup_runs_first(chart):
    objects, _ = render(chart, {})
    pod = workload(objects)["spec"]["template"]["spec"]
    sidecar, warm = pod["initContainers"]
    assert (sidecar["name"], warm["name"]) == ("warmup-sidecar", "warmup")
    assert sidecar["restartPolicy"] == "Always" and "restartPolicy" not in warm
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert warm["args"] == ["run"] and sidecar["args"][0] == "serve"
    for c in (sidecar, warm):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_redis_lock_and_bundle_sources_are_wired(chart):
    redis, _ = containers(render(chart, VARIANTS["redis-lock"])[0])
    assert env(redis["warmup"])["TRITON_WARMUP_LOCK_URL"] == "redis://redis.ml:6379/0"
    assert env(redis["warmup-sidecar"])["TRITON_WARMUP_LOCK_URL"] == "redis://redis.ml:6379/0"
    assert env(redis["warmup"])["TRITON_WARMUP_LOCK_FALLBACK"] == "none"
    assert "TRITON_WARMUP_REMOTE_URL" not in env(redis["warmup"])  # the lock server's tier
    no_tier = {"lock": {**VARIANTS["redis-lock"]["lock"], "remoteTier": False}}
    alone, _ = containers(render(chart, no_tier)[0])
    assert env(alone["warmup"])["TRITON_WARMUP_REMOTE_URL"] == "off"
    objects, _ = render(chart, VARIANTS["configmap-bundles"])
    by_name, pod = containers(objects)
    bundle_dir = env(by_name["warmup-sidecar"])["TRITON_WARMUP_BUNDLE_DIR"]
    assert mounts(by_name["warmup-sidecar"])["bundles"] == bundle_dir
    assert {"name": "bundles", "configMap": {"name": "fleet-bundles"}} in pod["volumes"]
    by_name, _ = containers(render(chart, VARIANTS["pvc-bundles"])[0])
    assert (
        env(by_name["warmup-sidecar"])["TRITON_WARMUP_BUNDLE_DIR"]
        == mounts(by_name["warmup-sidecar"])["cache-volume"] + "/published/bundles"
    )


def test_the_triton_remote_cache_is_turned_on_in_the_warmup_and_the_server(chart):
    by_name, _ = containers(render(chart, VARIANTS["triton-remote-cache"])[0])
    for name in ("warmup", "server"):
        assert env(by_name[name])["TRITON_CACHE_MANAGER"] == (
            "warmup.triton_remote_cache:TieredCacheManager"
        )
        assert env(by_name[name])["TRITON_WARMUP_REMOTE_URL"] == "redis://redis.ml:6379/0"
        assert env(by_name[name])["TRITON_WARMUP_TRITON_REMOTE_TIMEOUT_S"] == "0.2"
    plain, _ = containers(render(chart, VARIANTS["redis-lock"])[0])
    assert "TRITON_CACHE_MANAGER" not in env(plain["server"])
    no_tier = {"lock": {**VARIANTS["triton-remote-cache"]["lock"], "remoteTier": False}}
    with pytest.raises(helm.HelmError, match="remoteTier"):
        render(chart, no_tier)


def test_the_sidecar_harvests_from_the_servers_caches(chart):
    by_name, _ = containers(render(chart, {})[0])
    sidecar, server = by_name["warmup-sidecar"], by_name["server"]
    for cache in ("triton-cache", "inductor-cache"):
        assert mounts(sidecar)[cache] == mounts(server)[cache]
    assert env(sidecar)["TRITON_WARMUP_HARVEST"] == "true"
    assert env(sidecar)["TRITON_WARMUP_HARVEST_MAX_PER_MINUTE"] == "600"
    assert env(sidecar)["TRITON_WARMUP_TRITON_CACHE_DIR"] == mounts(server)["triton-cache"]
    values = {"sidecar": {"harvest": {"enabled": False}}, "warmup": {"modelsOnMiss": "init"}}
    off, _ = containers(render(chart, values)[0])
    assert env(off["warmup-sidecar"])["TRITON_WARMUP_HARVEST"] == "false"


def test_existing_claim_and_manifest_are_used_not_created(chart):
    objects, _ = render(chart, {**VARIANTS["existing-pvc"], **VARIANTS["existing-manifest"]})
    assert by_kind(objects, "PersistentVolumeClaim") == []
    assert by_kind(objects, "ConfigMap") == []
    _, pod = containers(objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cache-volume"]["persistentVolumeClaim"]["claimName"] == "fleet-cache"
    assert volumes["manifest"]["configMap"]["name"] == "my-shapes"
    created, _ = render(chart, {})
    (pvc,) = by_kind(created, "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_service_monitor_and_statefulset(chart):
    objects, _ = render(chart, VARIANTS["service-monitor"])
    (monitor,) = by_kind(objects, "ServiceMonitor")
    (service,) = [
        s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("-metrics")
    ]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    objects, _ = render(chart, VARIANTS["statefulset"])
    stateful = workload(objects)
    assert stateful["kind"] == "StatefulSet" and stateful["spec"]["replicas"] == 3
    # its serviceName is a headless Service of its own, not the metrics one
    (governing,) = [
        s
        for s in by_kind(objects, "Service")
        if s["metadata"]["name"] == stateful["spec"]["serviceName"]
    ]
    assert governing["spec"]["clusterIP"] == "None"
    assert governing["spec"]["selector"] == stateful["spec"]["selector"]["matchLabels"]
    assert governing["metadata"]["name"] != service["metadata"]["name"]
    deployment, _ = render(chart, {})
    assert not [s for s in by_kind(deployment, "Service") if s["spec"].get("clusterIP") == "None"]


def test_models_that_miss_are_left_to_the_server_which_the_harvest_stores(chart):
    by_name, _ = containers(render(chart, {})[0])
    assert env(by_name["warmup"])["TRITON_WARMUP_MODELS_ON_MISS"] == "server"
    assert env(by_name["warmup-sidecar"])["TRITON_WARMUP_HARVEST"] == "true"
    by_name, _ = containers(render(chart, {"warmup": {"modelsOnMiss": "init"}})[0])
    assert env(by_name["warmup"])["TRITON_WARMUP_MODELS_ON_MISS"] == "init"


def test_the_static_launcher_is_one_choice_in_the_init_container_and_the_server(chart):
    by_name, _ = containers(render(chart, {"warmup": {"staticLauncher": False}})[0])
    choices = {env(by_name[c])["TRITON_WARMUP_STATIC_LAUNCHER"] for c in ("warmup", "server")}
    assert choices == {"off"}


def test_readiness_follows_the_servers_ranks_when_asked(chart):
    by_name, _ = containers(render(chart, {})[0])
    assert "TRITON_WARMUP_READY_AFTER_SERVER" not in env(by_name["warmup-sidecar"])
    asked = {"gpus": 4, "sidecar": {"readyAfterServer": True}}
    by_name, _ = containers(render(chart, asked)[0])
    assert env(by_name["warmup-sidecar"])["TRITON_WARMUP_READY_AFTER_SERVER"] == "4"
    cpu = {"gpus": 0, "sidecar": {"readyAfterServer": True}}
    by_name, _ = containers(render(chart, cpu)[0])
    assert env(by_name["warmup-sidecar"])["TRITON_WARMUP_READY_AFTER_SERVER"] == "1"


def test_models_left_to_the_server_need_the_harvest(chart):
    with pytest.raises(Exception, match=r"modelsOnMiss=server needs sidecar\.harvest\.enabled"):
        render(chart, {"sidecar": {"harvest": {"enabled": False}}})
    off = {"sidecar": {"harvest": {"enabled": False}}, "warmup": {"modelsOnMiss": "init"}}
    by_name, _ = containers(render(chart, off)[0])
    assert env(by_name["warmup"])["TRITON_WARMUP_MODELS_ON_MISS"] == "init"


def test_each_declared_folder_is_one_volume_at_its_path_in_all_three_containers(chart):
    manifest = (
        "version: 1\nentries:\n"
        "  - {kernel: ag_gemm, dtype: bf16, world_size: 2, shapes: [{M: 64, N: 64, K: 64}]}\n"
        "caches:\n"
        '  - {name: vllm, path: /root/.cache/vllm, key: "qwen tp2"}\n'
        '  - {name: extra, path: /srv/engine-cache, key: "qwen tp2"}\n'
    )
    objects, _ = render(chart, {"manifest": {"inline": manifest}})
    by_name, pod = containers(objects)
    for path in ("/root/.cache/vllm", "/srv/engine-cache"):
        held = {name: mount_under(c, path) for name, c in by_name.items()}
        assert set(held) >= {"warmup", "warmup-sidecar", "server"}
        names = {held[n]["name"] for n in ("warmup", "warmup-sidecar", "server")}
        assert len(names) == 1 and held["server"]["mountPath"] == path
        (volume,) = [v for v in pod["volumes"] if v["name"] in names]
        assert volume == {"name": names.pop(), "emptyDir": {}}
    objects, _ = render(
        chart,
        {"manifest": {"existingConfigMap": "mine", "caches": [{"name": "v", "path": "/c"}]}},
    )
    by_name, _ = containers(objects)
    assert mount_under(by_name["server"], "/c")["mountPath"] == "/c"
    objects, _ = render(chart, TORCH)  # a torch server's manifest declares no folder
    _, pod = containers(objects)
    assert not [v for v in pod["volumes"] if v["name"].startswith("declared-cache")]


def pod_folder_paths(objects, folders):
    """Where each pod folder lies in each of the three containers: as its setting's
    variable says, else its default under the work dir (as the settings derive it)."""
    by_name, _ = containers(objects)
    found = {}
    for name in ("warmup", "warmup-sidecar", "server"):
        given = env(by_name[name])
        work = given["TRITON_WARMUP_WORK_DIR"]
        found[name] = {f.name: given.get(f.env, f"{work}/{f.default}") for f in folders}
    return by_name, found


def test_every_declared_pod_folder_is_mounted_where_the_warmup_and_server_write_it(chart):
    from registry import families
    from registry.families import PodFolder

    new = PodFolder("notes_dir", "families/notes", "a family the chart has never heard of")
    folders = [f for f in (*families.pod_folders(), new) if f.mounted]
    by_name, paths = pod_folder_paths(render(chart, {})[0], folders)
    for folder in folders:
        places = {paths[c][folder.name] for c in paths}
        assert len(places) == 1, (folder.name, places)  # all three agree
        for name, container in by_name.items():
            if name not in paths:
                continue
            mount = mount_under(container, paths[name][folder.name])
            if name != "warmup-sidecar":  # it only reads what the server wrote
                assert not mount.get("readOnly"), (folder.name, name)
    _, new_paths = pod_folder_paths(render(chart, {})[0], [new])
    assert mount_under(by_name["server"], new_paths["server"]["notes_dir"])["name"] == (
        "family-folders"
    )
