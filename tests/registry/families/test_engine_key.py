"""The engine-key record: what an engine keys its cache on, recorded bounded and without
secrets, read back checked, and compared naming each variable or path that differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.families import engine_key
from registry.families.engine_key import SET, EngineKey, EngineKeySpec, describe, differences

VLLM = EngineKeySpec.of("vllm")


def facts(env: dict[str, str], *, spec: EngineKeySpec = VLLM, folder: str = "/c/vllm") -> EngineKey:
    return EngineKey.here(spec, Path(folder), env)


def test_an_engine_brings_its_defaults_unioned_with_the_entrys_own():
    spec = EngineKeySpec.of("vllm", ["MY_KNOB", "VLLM_*"], ["/models/qwen"])
    assert spec.env == ("VLLM_*", "HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MY_KNOB")
    assert spec.paths == ("/models/qwen",) and spec.own_path
    assert EngineKeySpec.of(None, ["A_*"]) == EngineKeySpec(("A_*",), (), False)
    assert EngineKeySpec.of("deepgemm").env == ("DG_*", "DJ_*")
    with pytest.raises(ValueError, match="engine 'tgi' is not one of deepgemm, flashinfer"):
        EngineKeySpec.of("tgi")


def test_only_the_variables_its_patterns_match_are_recorded():
    got = facts({"VLLM_X": "a", "HOME": "/root", "PATH": "/bin", "vllm_lower": "no"})
    assert dict(got.env) == {"VLLM_X": "a", "HOME": "/root"}
    assert got.path == "/c/vllm"


def test_a_long_value_is_kept_as_a_digest_and_a_secret_not_at_all():
    token, long = "hf_abcdefghijklmnop", "x" * 500
    got = facts({"VLLM_API_KEY": token, "VLLM_HF_TOKEN": token, "VLLM_LONG": long})
    assert set(got.digests) == {"VLLM_API_KEY", "VLLM_HF_TOKEN", "VLLM_LONG"} and not got.env
    text = json.dumps(got.to_json())
    assert token not in text and long not in text
    assert got.digests["VLLM_API_KEY"] == got.digests["VLLM_HF_TOKEN"] == SET  # no digest
    assert got.digests["VLLM_LONG"] != facts({"VLLM_LONG": long + "y"}).digests["VLLM_LONG"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_DB_PASS", "hunter2"),
        ("VLLM_PWD", "pw-0xc0ffee"),
        ("VLLM_AUTH", "auth-0xc0ffee"),
        ("VLLM_CREDS", "creds-0xc0ffee"),
        ("VLLM_PRIVATE_PEM", "-----BEGIN"),
        ("VLLM_SESSION_ID", "sess-0xc0ffee"),
        ("VLLM_URL", "https://user:hunter2@host/path"),
        ("VLLM_HEADER", "Bearer abc.def"),
    ],
)
def test_a_secret_by_its_name_or_its_value_is_recorded_as_set_only(name, value):
    got = facts({name: value})
    assert got.digests == {name: SET} and value not in json.dumps(got.to_json())
    assert differences(got, facts({name: value + "2"})) == []  # presence alone compared
    assert describe(differences(got, facts({}))) == f"{name} differs"


def test_a_record_reads_back_and_a_bad_one_is_unknown():
    got = facts({"VLLM_X": "a", "VLLM_PASSWORD": "p"}, spec=EngineKeySpec.of("vllm", (), ["/m"]))
    assert EngineKey.from_json(json.loads(json.dumps(got.to_json()))) == got
    good = got.to_json()
    for bad in (
        None,
        "text",
        {**good, "path": 7},
        {**good, "env": {"VLLM_X": 1}},
        {**good, "env": {f"V{i}": "v" for i in range(engine_key.MAX_VARIABLES + 1)}},
        {**good, "env": {"VLLM_X": "v" * (engine_key.MAX_VALUE + 1)}},
        {**good, "paths": {"/m": "yes"}},
        {**good, "patterns": ["*"] * (engine_key.MAX_PATTERNS + 1)},
        {**good, "left_out": -1},
        {k: v for k, v in good.items() if k != "digests"},
    ):
        assert EngineKey.from_json(bad) is None, bad


def test_a_differing_variable_is_named_with_both_values():
    found = differences(facts({"VLLM_X": "b"}), facts({"VLLM_X": "a"}))
    assert [(d.factor, d.mine, d.stored) for d in found] == [("env VLLM_X", "b", "a")]
    assert describe(found) == "VLLM_X is 'b' here, 'a' where it was written"
    unset = differences(facts({}), facts({"VLLM_X": "a"}))
    assert describe(unset) == "VLLM_X is unset here, 'a' where it was written"


def test_a_digested_value_that_differs_is_named_without_a_value():
    found = differences(facts({"VLLM_LONG": "n" * 200}), facts({"VLLM_LONG": "o" * 200}))
    assert describe(found) == "VLLM_LONG differs"
    assert engine_key.as_factors(found) == {"env VLLM_LONG": ("(not shown)", "(not shown)")}


def test_equal_facts_and_an_unknown_record_differ_in_nothing():
    env = {"VLLM_X": "a", "HOME": "/root", "VLLM_API_KEY": "t"}
    assert differences(facts(env), facts(dict(env))) == []
    assert differences(facts(env), None) == []


def test_the_folders_own_path_counts_only_where_the_engine_keys_on_it():
    found = differences(facts({}, folder="/var/cache/a"), facts({}, folder="/var/cache/b"))
    assert describe(found) == "path /var/cache/a here, /var/cache/b there"
    flash = EngineKeySpec.of("flashinfer")
    assert differences(facts({}, spec=flash, folder="/a"), facts({}, spec=flash, folder="/b")) == []


def test_key_paths_differ_by_name_not_by_existence(tmp_path):
    model = tmp_path / "model"
    here = facts({}, spec=EngineKeySpec.of(None, (), [str(model)]))
    there = facts({}, spec=EngineKeySpec.of(None, (), ["/mnt/model"]))
    assert describe(differences(here, there)) == f"key paths {model} here, /mnt/model there"
    model.mkdir()
    written = facts({}, spec=EngineKeySpec.of(None, (), [str(model)]))
    model.rmdir()
    assert written.paths == {str(model): True}  # recorded, never compared: a sidecar
    assert differences(here, written) == []  # need not mount what the server reads


def test_a_variable_only_one_side_looked_for_is_not_compared():
    mine = facts({"VLLM_X": "b", "MY_KNOB": "1"}, spec=EngineKeySpec.of("vllm", ["MY_KNOB"]))
    theirs = facts({"VLLM_X": "b"})  # written before MY_KNOB was declared
    assert differences(mine, theirs) == []


def test_variables_past_the_bound_are_counted_and_never_compared():
    many = {f"VLLM_{i:03}": "v" for i in range(engine_key.MAX_VARIABLES + 5)}
    got = facts(many)
    assert len(got.env) == engine_key.MAX_VARIABLES and got.left_out == 5
    assert differences(facts({**many, "VLLM_999": "new"}), got) == []
