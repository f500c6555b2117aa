"""Each name the registry files things under passes one pattern, or is refused."""

from registry.core.patterns import MODEL_NAME, SHA256, TRITON_CACHE_KEY


def test_names_that_are_one_safe_path_component_pass():
    assert SHA256.fullmatch("ab" * 32) and not SHA256.fullmatch("AB" * 32)
    assert TRITON_CACHE_KEY.fullmatch("QW3E4RT5Y6U7I8O9P0ASDFGHJKLZXCVBNM1234567890ABCD=")
    assert MODEL_NAME.fullmatch("llama-70b.blocks_4")
    for bad in ("..", ".hidden", "a/b", "", "x" * 200, "name\n"):
        assert not TRITON_CACHE_KEY.fullmatch(bad)
        assert not MODEL_NAME.fullmatch(bad)
    assert not MODEL_NAME.fullmatch("Upper")  # a manifest's names are lower case


def test_the_manifest_checks_model_names_by_the_same_pattern():
    # warmup.core.manifest_entries keeps its own copy (validate imports no registry): the two agree
    from warmup.core.manifest_entries import MODEL_NAME as MANIFEST_MODEL_NAME

    assert MANIFEST_MODEL_NAME.pattern == f"^{MODEL_NAME.pattern}$"
