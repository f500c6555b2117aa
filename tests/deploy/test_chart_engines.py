"""Engine profiles: the folders vLLM and SGLang really write, mounted in the three
containers and declared in the rendered manifest; what enters their cache keys held
equal; the server's command; the images; and the one message a default that cannot run
fails with."""

import re
import subprocess

import helm_python as helm
import pytest
import yaml

from tests.deploy.test_chart import (
    CHART,
    MINIMUM,
    TORCH,
    VARIANTS,
    containers,
    env,
    merged,
    mount_under,
    render,
    rendered_manifest,
)
from tests.deploy.test_dockerfile import ROOT, hadolint, instructions
from tests.deploy.test_server_image import dockerfile, pip_installs, project
from warmup.core.manifest import parse_manifest

THREE = ("warmup", "warmup-sidecar", "server")
ROOT_DIR = "/var/cache/engine"
# engine -> {folder: (the variables pointing the engine there, its key's variables)}
FOLDERS = {
    "vllm": {
        "vllm": (["VLLM_CACHE_ROOT"], ["VLLM_*"]),
        "deepgemm": (["DG_JIT_CACHE_DIR"], ["DG_*"]),
        "flashinfer": (["FLASHINFER_WORKSPACE_BASE"], ["FLASHINFER_*"]),
    },
    "sglang": {
        "sglang": (["SGLANG_CACHE_DIR"], ["SGLANG_*"]),
        # SGLang points DeepGEMM at SGLANG_DG_CACHE_DIR itself, over DG_JIT_CACHE_DIR
        "deepgemm": (["DG_JIT_CACHE_DIR", "SGLANG_DG_CACHE_DIR"], ["DG_*"]),
        "flashinfer": (["FLASHINFER_WORKSPACE_BASE"], ["FLASHINFER_*"]),
    },
}
ENGINE_VALUES = {"vllm": VARIANTS["engine-vllm"], "sglang": VARIANTS["engine-sglang"]}


@pytest.mark.parametrize("engine", sorted(FOLDERS))
def test_the_engines_folders_are_mounted_in_all_three_containers_and_declared(chart, engine):
    objects, _ = render(chart, ENGINE_VALUES[engine])
    by_name, pod = containers(objects)
    caches = {c["name"]: c for c in rendered_manifest(objects)["caches"]}
    assert set(caches) == set(FOLDERS[engine])
    volumes = {v["name"]: v for v in pod["volumes"]}
    for folder, (variables, key_env) in FOLDERS[engine].items():
        path = f"{ROOT_DIR}/{folder}"
        declared = caches[folder]
        assert declared["path"] == path and declared["key_env"] == key_env
        assert declared["engine"] == folder  # the engine-key kind: its known key variables
        held = [mount_under(by_name[c], path) for c in THREE]
        assert {m["mountPath"] for m in held} == {path}  # the folder itself, not a parent
        assert len({m["name"] for m in held}) == 1 and not any(m.get("readOnly") for m in held)
        assert volumes[held[0]["name"]] == {"name": held[0]["name"], "emptyDir": {}}
        for variable in variables:  # the engine writes where the warmup restores
            assert {env(by_name[c])[variable] for c in THREE} == {path}


def test_sglangs_inductor_cache_is_kept_with_its_folder(chart):
    """Without its piecewise backend SGLang compiles with Inductor's own cache dir, which no
    declared model's harvest keeps: the server's lies under SGLang's declared folder."""
    by_name, _ = containers(render(chart, VARIANTS["engine-sglang"])[0])
    assert env(by_name["server"])["TORCHINDUCTOR_CACHE_DIR"] == f"{ROOT_DIR}/sglang/torchinductor"
    assert env(by_name["warmup"])["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/torchinductor"
    by_name, _ = containers(render(chart, VARIANTS["engine-vllm"])[0])  # vLLM sets its own
    assert env(by_name["server"])["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/torchinductor"


def test_sglangs_folders_and_deepgemms_redirect(chart):
    by_name, _ = containers(render(chart, VARIANTS["engine-sglang"])[0])
    server = env(by_name["server"])
    assert server["SGLANG_CACHE_DIR"] == f"{ROOT_DIR}/sglang"  # torch_compile_cache under it
    assert server["SGLANG_DG_CACHE_DIR"] == server["DG_JIT_CACHE_DIR"] == f"{ROOT_DIR}/deepgemm"
    assert "VLLM_CACHE_ROOT" not in server


def test_the_cache_key_names_the_model_the_image_and_the_gpus(chart):
    caches = rendered_manifest(render(chart, {"gpus": 4})[0])["caches"]
    image = "registry.example.com/vllm-warm:v0.19.1-tw0.1"
    assert {c["key"] for c in caches} == {f"/models/qwen3-8b {image} tp4"}
    assert all(c["key_paths"] == ["/models/qwen3-8b"] for c in caches)  # in vLLM's key
    hub = rendered_manifest(render(chart, VARIANTS["engine-vllm"])[0])["caches"]
    assert all("key_paths" not in c and c["key"].startswith("Qwen/Qwen3-8B ") for c in hub)


@pytest.mark.parametrize("engine", sorted(FOLDERS))
def test_the_rendered_manifest_is_what_the_manifest_accepts(chart, engine):
    """The whole rendered manifest parses (each caches: entry with its engine's key
    fields), as the pod's warmup will read it."""
    objects, _ = render(chart, ENGINE_VALUES[engine])
    rendered = rendered_manifest(objects)
    manifest = parse_manifest(yaml.safe_dump(rendered))
    assert [c.engine for c in manifest.caches] == [c["engine"] for c in rendered["caches"]]
    assert all(c.key_env for c in manifest.caches)


@pytest.mark.parametrize("engine", sorted(FOLDERS))
def test_an_engines_default_manifest_warms_nothing_it_never_calls(chart, engine):
    manifest = rendered_manifest(render(chart, ENGINE_VALUES[engine])[0])
    assert manifest["version"] == 1 and set(manifest) == {"version", "caches"}  # no ag_gemm
    torch = rendered_manifest(render(chart, TORCH)[0])
    assert [e["kernel"] for e in torch["entries"]] == ["ag_gemm"] and "caches" not in torch
    assert torch == yaml_file(CHART / "manifests" / "torch.yaml")


def yaml_file(path):
    return yaml.safe_load(path.read_text())


def test_an_inline_manifest_gets_the_engines_folders_unless_it_declares_them(chart):
    entries = (
        "version: 1\nentries:\n"
        "  - {kernel: ag_gemm, dtype: bf16, world_size: 2, shapes: [{M: 64, N: 64, K: 64}]}\n"
    )
    added = rendered_manifest(render(chart, {"manifest": {"inline": entries}})[0])
    assert added["entries"][0]["kernel"] == "ag_gemm"
    assert [c["name"] for c in added["caches"]] == ["vllm", "deepgemm", "flashinfer"]
    own = entries + "caches:\n  - {name: vllm, path: /srv/vllm, key: mine}\n"
    objects, out = render(chart, {"manifest": {"inline": own}, "engine": {"deepgemm": False}})
    kept = rendered_manifest(objects)
    assert [(c["name"], c["path"]) for c in kept["caches"]] == [
        ("vllm", "/srv/vllm"),  # the operator's, by name: not replaced
        ("flashinfer", f"{ROOT_DIR}/flashinfer"),
    ]
    assert out["triton-warmup/templates/configmap-manifest.yaml"].count("ag_gemm") == 1


def test_the_kernel_libraries_caches_can_be_left_out(chart):
    values = {"engine": {"deepgemm": False, "flashinfer": False}}
    objects, _ = render(chart, values)
    assert [c["name"] for c in rendered_manifest(objects)["caches"]] == ["vllm"]
    server = env(containers(objects)[0]["server"])
    assert "DG_JIT_CACHE_DIR" not in server and "FLASHINFER_WORKSPACE_BASE" not in server


def test_an_existing_configmaps_pods_still_mount_the_engines_folders(chart):
    values = {"manifest": {"existingConfigMap": "mine", "caches": [{"name": "v", "path": "/c"}]}}
    by_name, _ = containers(render(chart, values)[0])
    for path in ("/c", f"{ROOT_DIR}/vllm", f"{ROOT_DIR}/deepgemm"):
        assert mount_under(by_name["server"], path)["mountPath"] == path


SERVER_ENV = [
    {"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"},
    {"name": "DG_JIT_USE_NVRTC", "value": "0"},
    {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}},
    {"name": "OMP_NUM_THREADS", "value": "8"},
]


def test_the_engines_own_variables_are_the_same_in_all_three_containers(chart):
    """What enters the engine's key (VLLM_*, DG_*, FLASHINFER_*) reaches the warmup and
    the sidecar as the server has it, so what they record for a folder is the server's."""
    by_name, _ = containers(render(chart, {"server": {"env": SERVER_ENV}})[0])
    keyed = [e for e in SERVER_ENV if e["name"] != "OMP_NUM_THREADS"]
    for name in THREE:
        entries = {e["name"]: e for e in by_name[name]["env"]}
        assert [entries[e["name"]] for e in keyed] == keyed
    assert env(by_name["server"])["OMP_NUM_THREADS"] == "8"  # the server's alone
    assert "OMP_NUM_THREADS" not in env(by_name["warmup"])
    homes = {env(by_name[c])["HOME"] for c in THREE}
    assert homes == {"/home/serving"}  # one path: vLLM's key held paths under HOME
    assert all(mount_under(by_name[c], "/home/serving")["name"] == "home" for c in THREE)


@pytest.mark.parametrize(
    "values,args",
    [
        (
            {},
            ["vllm", "serve", "/models/qwen3-8b", "--port", "8000", "--tensor-parallel-size", "2"],
        ),
        (
            merged(
                VARIANTS["engine-sglang"],
                {"gpus": 4, "server": {"args": ["--enable-torch-compile"]}},
            ),
            [
                *("python3", "-m", "sglang.launch_server", "--model-path", "/models/qwen3-8b"),
                *("--host", "0.0.0.0", "--port", "30000", "--tp-size", "4"),
                "--enable-torch-compile",
            ],
        ),
        (TORCH, ["python3", "-m", "my_server"]),
        ({"server": {"command": ["my-vllm"], "args": ["--x"]}}, ["my-vllm", "--x"]),
    ],
)
def test_the_server_serves_the_engines_model_on_its_port_over_the_pods_gpus(chart, values, args):
    server = containers(render(chart, values)[0])[0]["server"]
    assert server["command"] + server.get("args", []) == args


@pytest.mark.parametrize(
    "values,needles",
    [
        ({}, ["engine.model", "server.image.repository", "server.image.tag"]),
        ({"engine": {"name": "sglang"}}, ["engine.model", "deploy/engines/sglang.Dockerfile"]),
        ({**MINIMUM, "engine": {}}, ["engine.model"]),
        (
            merged(MINIMUM, {"server": {"image": {"tag": "latest"}}}),
            ["server.image.tag", "never latest"],
        ),
        (merged(MINIMUM, {"server": {"image": {"tag": ""}}}), ["server.image.tag"]),
        ({"engine": {"name": "torch"}, "server": MINIMUM["server"]}, ["server.command"]),
        (
            merged(MINIMUM, {"warmup": {"image": {"repository": "w", "tag": "latest"}}}),
            ["warmup.image.tag"],
        ),
        (merged(MINIMUM, {"sidecar": {"image": {"tag": "latest"}}}), ["sidecar.image.tag"]),
    ],
)
def test_a_pod_that_cannot_run_fails_with_one_message_naming_what_to_set(chart, values, needles):
    with pytest.raises(helm.HelmError) as info:
        render(chart, values, minimum=False)
    message = str(info.value)
    assert message.count("cannot run as set") == 1
    assert all(needle in message for needle in needles), message


def test_the_engines_own_folder_variables_are_not_set_twice(chart):
    values = {"server": {"env": [{"name": "VLLM_CACHE_ROOT", "value": "/elsewhere"}]}}
    with pytest.raises(helm.HelmError, match=r"server\.env sets VLLM_CACHE_ROOT"):
        render(chart, values)


ENGINE_FILES = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}


@pytest.mark.parametrize("engine", sorted(ENGINE_FILES))
def test_each_engine_images_dockerfile_installs_the_package_as_the_docs_line(engine):
    path = ROOT / "deploy" / "engines" / f"{engine}.Dockerfile"
    text = path.read_text()
    (base,) = [args for keyword, args in instructions(text) if keyword == "FROM"]
    name, _, tag = base.partition(":")
    assert name == ENGINE_FILES[engine] and re.fullmatch(r"v\d+(\.\d+)+[\w.-]*", tag), base
    assert pip_installs(text) == pip_installs(dockerfile())  # docs/kubernetes.md's RUN line
    assert f"triton-warmup=={project()['version']}" in text
    done = subprocess.run(
        [hadolint(), "--failure-threshold", "info", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
