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


# ------------------------------------------------------------------ a failed write
def test_a_failed_write_names_the_file_with_the_os_error_number(tmp_path):
    import errno
    import os

    import pytest

    from adalora_cli.config import ConfigError
    from adalora_cli.errors import WriteFailed, writing

    target = tmp_path / "adapter_model.safetensors"
    with pytest.raises(WriteFailed) as err:  # Python's own: an errno, but no file name
        with writing(target, then="resume the run"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert err.value.errno == errno.ENOSPC
    assert str(err.value) == (f"[Errno 28] could not write {target}: No space left on device "
                              "(free some space, then resume the run)")

    class SafetensorError(Exception):  # the Rust library's: the number only in its words
        pass

    with pytest.raises(WriteFailed) as err:
        with writing(target):
            raise SafetensorError("Error while serializing: I/O error: Disk quota exceeded "
                                  "(os error 122)")
    assert err.value.errno == errno.EDQUOT
    assert err.value.strerror == f"could not write {target}: Disk quota exceeded (free some space)"
    with pytest.raises(WriteFailed) as err:  # a temporary name is written, the final named
        with writing(target, written_as=tmp_path / ".partial"):
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".partial"))
    assert err.value.strerror == f"could not write {target}: Permission denied"
    # errors that are not about writing pass unchanged
    for other in (ConfigError("bad row"), RuntimeError("shape mismatch")):
        with pytest.raises(type(other)):
            with writing(target, library=True):
                raise other
