"""The chart's trust: keys mounted where containers read or publish, and Redis
credentials from Secrets, never in a value."""

import helm_python as helm
import pytest

from tests.deploy.test_chart import (
    VARIANTS,
    containers,
    env,
    mounts,
    render,
)

TRUSTED, SIGNING = "/etc/triton-warmup/trusted-keys", "/etc/triton-warmup/signing"
BUNDLE_KEYS = "/etc/triton-warmup/bundle-keys"


def test_trust_is_configured_by_default_in_every_container(chart):
    by_name, pod = containers(render(chart, {})[0])
    for name in ("warmup-sidecar", "warmup", "server"):
        assert env(by_name[name])["TRITON_WARMUP_TRUSTED_KEYS"] == TRUSTED
        assert mounts(by_name[name])["trusted-keys"] == TRUSTED
        assert "TRITON_WARMUP_ALLOW_UNSIGNED" not in env(by_name[name])
        assert "TRITON_WARMUP_SIGNING_KEY" not in env(by_name[name])  # nothing published
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["trusted-keys"]["secret"]["secretName"] == "triton-warmup-trusted-keys"
    assert all(
        m["readOnly"]
        for c in by_name.values()
        for m in c["volumeMounts"]
        if m["name"] == "trusted-keys"
    )


def test_the_signing_key_is_mounted_where_the_pod_publishes_to_redis(chart):
    by_name, pod = containers(render(chart, VARIANTS["redis-lock"])[0])
    for name in ("warmup-sidecar", "warmup"):
        assert env(by_name[name])["TRITON_WARMUP_SIGNING_KEY"] == f"{SIGNING}/signing.key"
        assert mounts(by_name[name])["signing-key"] == SIGNING
    assert "signing-key" not in mounts(by_name["server"])  # it publishes nothing there
    assert "TRITON_WARMUP_SIGNING_KEY" not in env(by_name["server"])
    (volume,) = [v for v in pod["volumes"] if v["name"] == "signing-key"]
    assert volume["secret"]["secretName"] == "triton-warmup-signing-key"
    assert volume["secret"]["defaultMode"] == 0o440
    remote, _ = containers(render(chart, VARIANTS["triton-remote-cache"])[0])
    assert mounts(remote["server"])["signing-key"] == SIGNING  # it publishes its kernels
    reader = {**VARIANTS["redis-lock"], "trust": {"signingKeySecret": ""}}
    by_name, pod = containers(render(chart, reader)[0])
    assert all("TRITON_WARMUP_SIGNING_KEY" not in env(c) for c in by_name.values())
    assert "signing-key" not in {v["name"] for v in pod["volumes"]}


def test_release_keys_for_bundles_come_from_a_secret_of_their_own(chart):
    by_name, pod = containers(render(chart, VARIANTS["release-keys"])[0])
    for name in ("warmup-sidecar", "warmup", "server"):
        assert env(by_name[name])["TRITON_WARMUP_TRUSTED_BUNDLE_KEYS"] == BUNDLE_KEYS
        assert mounts(by_name[name])["bundle-keys"] == BUNDLE_KEYS
        assert env(by_name[name])["TRITON_WARMUP_TRUSTED_KEYS"] == TRUSTED
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["bundle-keys"]["secret"]["secretName"] == "release-keys"
    default, _ = containers(render(chart, {})[0])
    assert all("TRITON_WARMUP_TRUSTED_BUNDLE_KEYS" not in env(c) for c in default.values())


def test_allow_unsigned_is_explicit_and_mounts_no_key(chart):
    by_name, pod = containers(render(chart, VARIANTS["allow-unsigned"])[0])
    for name in ("warmup-sidecar", "warmup", "server"):
        assert env(by_name[name])["TRITON_WARMUP_ALLOW_UNSIGNED"] == "true"
        assert "TRITON_WARMUP_TRUSTED_KEYS" not in env(by_name[name])
    assert not {"trusted-keys", "signing-key"} & {v["name"] for v in pod["volumes"]}
    with pytest.raises(helm.HelmError, match=r"trust\.publicKeysSecret is empty"):
        render(chart, {"trust": {"publicKeysSecret": ""}})


def test_the_redis_password_comes_from_a_secret_and_tls_is_wired(chart):
    by_name, pod = containers(render(chart, VARIANTS["redis-tls-secret"])[0])
    url = "rediss://redis.ml:6380/0?ssl_ca_certs=/etc/triton-warmup/redis-ca/ca.crt"
    for name in ("warmup-sidecar", "warmup", "server"):
        container = by_name[name]
        (password,) = [e for e in container["env"] if e["name"] == "TRITON_WARMUP_REDIS_PASSWORD"]
        assert password == {
            "name": "TRITON_WARMUP_REDIS_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "pw"}},
        }
        assert env(container)["TRITON_WARMUP_LOCK_URL"] == url
        assert mounts(container)["redis-ca"] == "/etc/triton-warmup/redis-ca"
    assert env(by_name["server"])["TRITON_WARMUP_REMOTE_URL"] == url
    assert {"name": "redis-ca", "configMap": {"name": "redis-ca"}} in pod["volumes"]
    plain, _ = containers(render(chart, VARIANTS["redis-lock"])[0])
    assert "TRITON_WARMUP_REDIS_PASSWORD" not in env(plain["warmup"])


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2@redis.ml:6379/0",
        "rediss://fleet:hunter2@redis.ml:6380/0",
        "redis://redis.ml:6379/0?password=hunter2",
    ],
)
def test_a_redis_url_with_a_password_is_refused(chart, url):
    with pytest.raises(helm.HelmError, match="carries a password"):
        render(chart, {"lock": {"backend": "redis", "redisUrl": url}})
    user_only = {"lock": {"backend": "redis", "redisUrl": "redis://fleet@redis.ml:6379/0"}}
    assert render(chart, user_only)[0]


def test_a_redis_ca_needs_tls(chart):
    lock = {
        "backend": "redis",
        "redisUrl": "redis://redis.ml:6379/0",
        "redisCa": {"secretName": "ca"},
    }
    with pytest.raises(helm.HelmError):
        render(chart, {"lock": lock})
