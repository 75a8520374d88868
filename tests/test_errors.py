"""``adalora_cli.errors``: the one way every layer turns an exception into one line."""

from __future__ import annotations

from adalora_cli.errors import describe, first_line


def test_first_line_is_the_first_nonblank_line_or_the_type():
    assert first_line(ValueError("\n  bad shape (3, 4)\nTraceback of the library\n")) == \
        "bad shape (3, 4)"
    assert first_line(OSError("")) == "OSError"
    assert first_line(KeyError()) == "KeyError"


def test_describe_names_the_type():
    assert describe(RuntimeError("evaluation exploded\nmore")) == \
        "RuntimeError: evaluation exploded"
    assert describe(FloatingPointError("  ")) == "FloatingPointError"
