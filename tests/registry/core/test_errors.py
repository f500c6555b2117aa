def test_first_line_is_the_named_error_cut_to_one_line():
    from registry.core.errors import first_line

    assert first_line(ValueError("bad shape\n  at line 3")) == "ValueError: bad shape"
    assert first_line(RuntimeError("x" * 400), 20) == "RuntimeError: xxxxxx"
    assert first_line(KeyError()) == "KeyError:"
