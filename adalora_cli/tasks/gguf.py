"""GGUF files (llama.cpp's one-file checkpoints) as the base model of a run.

A GGUF file holds a model's config, its tokenizer (vocabulary, merges, chat template) and its
weights, usually quantized in blocks (Q4_1, Q8_0, ...). transformers reads all three
(``from_pretrained(folder, gguf_file=name)``, which needs the ``gguf`` and ``accelerate``
packages) and, asked to dequantize, hands back an ordinary model: every weight a plain tensor
in the dtype the run asks for, no quantizer attached. From then on a GGUF base trains,
evaluates and exports like any checkpoint folder; what differs is only how the file is found
and that its hash is recorded, since a file name says nothing about which quantization of
which model it holds.

A config names a GGUF base in one of three ways (:func:`locate`):

- ``model.name_or_path`` is the ``.gguf`` file (a path, or ``package:<module>/<file>``);
- ``model.name_or_path`` is a folder or hub repo and ``model.gguf_file`` the file's name in
  it, as transformers' own ``gguf_file=`` argument;
- ``model.name_or_path`` is a folder that holds one ``.gguf`` file and no ``config.json``.

Every loader below the config then receives a single string, the file's local path, and
:func:`split` turns it into transformers' ``(folder, gguf_file=name)`` form.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import struct
from pathlib import Path
from typing import Any

from .. import resources
from ..config import ConfigError
from . import progress

SUFFIX = ".gguf"
PACKAGES = ("gguf", "accelerate")
"""What transformers needs to read a GGUF file (the ``gguf`` extra of this package)."""
INSTALL_HINT = "pip install -e '.[gguf]' (or make install)"


def is_gguf(path: str) -> bool:
    """True for a path naming a ``.gguf`` file (what :func:`locate` hands the loaders)."""
    return str(path).lower().endswith(SUFFIX)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked installation
        return False


def require_packages(path: str) -> None:
    """A one-line error naming the extra when the GGUF readers are not installed."""
    missing = [name for name in PACKAGES if not _installed(name)]
    if missing:
        raise ConfigError(f"{path} is a GGUF file; reading it needs the "
                          f"{' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: "
                          f"{INSTALL_HINT}")


def _listing(folder: Path) -> str:
    found = sorted(p.name for p in folder.glob(f"*{SUFFIX}"))
    return f"it holds {', '.join(found)}" if found else "it holds no .gguf file"


def locate(name_or_path: str, gguf_file: str | None = None) -> str:
    """The path loaders take: the local ``.gguf`` file for a GGUF base, else
    ``name_or_path`` unchanged. ``package:`` paths must already be resolved."""
    if gguf_file:
        explicit = Path(gguf_file).expanduser()
        if explicit.is_file():  # a path of its own, as transformers also accepts
            return str(explicit)
        if not is_gguf(gguf_file):
            raise ConfigError(f"model.gguf_file={gguf_file!r} is not a .gguf file; name the "
                              "GGUF file inside model.name_or_path")
        folder = Path(name_or_path).expanduser()
        if folder.is_dir():
            if not (folder / gguf_file).is_file():
                raise ConfigError(f"model.gguf_file {gguf_file!r} is not in {folder} "
                                  f"({_listing(folder)}); set model.gguf_file to one of them")
            return str(folder / gguf_file)
        if Path(gguf_file).is_absolute():
            raise ConfigError(f"GGUF file {gguf_file} does not exist; set model.gguf_file to "
                              "a .gguf file")
        if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
            raise ConfigError(f"model folder {name_or_path} does not exist; set "
                              f"model.name_or_path to the folder holding {gguf_file}")
        return _from_hub(name_or_path, gguf_file)
    if is_gguf(name_or_path):
        if not Path(name_or_path).expanduser().is_file():
            raise ConfigError(f"GGUF file {name_or_path} does not exist; set "
                              "model.name_or_path to a .gguf file or a model folder")
        return str(Path(name_or_path).expanduser())
    folder = Path(name_or_path).expanduser()
    if folder.is_dir() and not (folder / "config.json").exists():
        found = sorted(folder.glob(f"*{SUFFIX}"))
        if len(found) == 1:  # a folder holding just the file: that file is the model
            return str(found[0])
        if len(found) > 1:
            raise ConfigError(f"{folder} holds {len(found)} GGUF files and no config.json "
                              f"({', '.join(p.name for p in found)}); choose one with "
                              "model.gguf_file=NAME")
    return name_or_path


def _from_hub(repo: str, filename: str) -> str:
    """The local copy of ``filename`` in hub repo ``repo`` (downloaded once, then cached)."""
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo, filename)
    except (OSError, ValueError) as err:  # offline, no such repo or file, a bad repo id
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"could not get {filename} from the hub repo {repo} ({first}); "
                          "download it and set model.name_or_path to the .gguf file") from None


def split(path: str) -> tuple[str, dict[str, Any]]:
    """``(folder, extra from_pretrained kwargs)`` for a model path: a GGUF file becomes its
    folder plus ``gguf_file=``; anything else passes through with no extra kwargs."""
    if not is_gguf(path):
        return path, {}
    require_packages(path)
    file = Path(path)
    return str(file.parent), {"gguf_file": file.name}


def model_kwargs() -> dict[str, Any]:
    """What makes transformers dequantize every weight at load time. Newer releases can keep
    GGUF blocks packed in their own linear layers, which our adapters cannot wrap and
    ``save_pretrained`` refuses; dequantized, the model carries no quantizer at all. Releases
    without :class:`GgufConfig` always dequantize."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


@contextlib.contextmanager
def reading(path: str):
    """Inside: a file transformers cannot read as a model (truncated, not GGUF at all, an
    architecture it does not know) is a one-line error naming the file."""
    try:
        yield
    except ConfigError:
        raise
    except (struct.error, ValueError, KeyError, IndexError, EOFError, OSError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"could not read {path} as a model ({first}); check that it is a "
                          "complete GGUF file of an architecture transformers supports") from None


@contextlib.contextmanager
def progress_as_configured():
    """Inside: transformers' GGUF dequantizer shows its per-tensor bar only when
    transformers' progress bars are enabled. It draws with tqdm directly, past the switch
    (``disable_progress_bar``) that the CLI turns off to keep its output to one bar; with
    the switch off its tensors are counted to the run's own progress instead (a 135M model
    takes minutes on two cores)."""
    from transformers.utils import logging

    module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    real = getattr(module, "tqdm", None)
    if real is None or logging.is_progress_bar_enabled():
        yield
        return
    module.tqdm = lambda iterable, *args, **kwargs: progress.counted(
        iterable, "dequantizing tensors", total=len(iterable), size=lambda tensor: 1)
    try:
        yield
    finally:
        module.tqdm = real


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(path: str) -> dict[str, Any]:
    """``{"file", "sha256", "bytes"}`` of a GGUF file: what a run records as its base (hashed
    once per process while the file is unchanged)."""
    file = Path(path).resolve()
    stat = file.stat()
    return {"file": str(file), "sha256": _sha256(str(file), stat.st_size, stat.st_mtime_ns),
            "bytes": stat.st_size}


HUB_CACHE_PREFIX = "models--"
"""How the hub cache names a model repo's folder: ``models--<owner>--<name>`` (a repo id
holds no ``--``), with ``snapshots/<commit>/<file>`` inside it."""


def origin(path: str, named: tuple[str | None, ...] = ()) -> dict[str, Any]:
    """Where a GGUF file came from, when that can be told; what an export names instead of
    a path on this machine. A file in the hub cache (``model.name_or_path=<repo>
    model.gguf_file=<file>`` downloads it there) gives its ``repo``, ``revision`` (the
    commit) and ``filename``; a file inside an installed package (``named``: the config's
    ``package:<module>/<file>``) its ``package``, ``package_version`` and
    ``package_file``. The file's own metadata adds its ``license`` when it states one."""
    found: dict[str, Any] = {}
    parts = Path(path).expanduser().parts  # not resolved: the hub's snapshot links name it
    for i, part in enumerate(parts[:-3]):
        if (part.startswith(HUB_CACHE_PREFIX) and parts[i + 1] == "snapshots"
                and "--" in part[len(HUB_CACHE_PREFIX):]):
            found.update(repo=part[len(HUB_CACHE_PREFIX):].replace("--", "/"),
                         revision=parts[i + 2], filename="/".join(parts[i + 3:]))
    spec = next((n for n in named if n and n.startswith("package:")), None)
    if spec is not None:
        module = spec[len("package:"):].partition("/")[0]
        found.update(resources.distribution(module),
                     package_file=spec[len("package:"):])
    license_ = _metadata_text(path, "general.license")
    if license_:
        found["license"] = license_
    return found


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
"""GGUF's fixed-size value types by their type number (8 is a string, 9 an array)."""


def _metadata_text(path: str, key: str) -> str | None:
    """A string field of the file's metadata (``general.license``), or None: absent or
    unreadable. Read from the header's key/value list directly: the gguf package's reader
    maps every tensor first (16 s for the demo's 135M file on a loaded 2-core machine)."""
    try:
        with open(path, "rb") as handle:
            return _find_text(handle, key)
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return None


class _Header:
    """Reads a GGUF header's fields in order: its key/value list, then its tensor list."""

    def __init__(self, handle):
        self.handle = handle

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        data = self.handle.read(size)
        if len(data) != size:
            raise ValueError("truncated")
        return struct.unpack(fmt, data)[0]

    def text(self) -> str:
        return self.handle.read(self.unpack("<Q")).decode("utf-8")

    def skip(self, kind: int) -> None:
        if kind == 8:
            self.handle.seek(self.unpack("<Q"), 1)
        elif kind == 9:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _SCALARS:
                self.handle.seek(struct.calcsize(_SCALARS[item]) * count, 1)
            else:
                for _ in range(count):
                    self.skip(item)
        elif kind in _SCALARS:
            self.handle.seek(struct.calcsize(_SCALARS[kind]), 1)
        else:
            raise ValueError(f"unknown GGUF value type {kind}")

    def start(self) -> tuple[int, int] | None:
        """``(tensor count, key/value count)``, or None for a file that is not GGUF v2+."""
        if self.handle.read(4) != b"GGUF" or self.unpack("<I") < 2:
            return None
        return self.unpack("<Q"), self.unpack("<Q")


def _find_text(handle, key: str) -> str | None:
    header = _Header(handle)
    counts = header.start()
    if counts is None:
        return None
    for _ in range(counts[1]):  # key/value pairs
        name, kind = header.text(), header.unpack("<I")
        if name == key and kind == 8:
            value = header.text().strip()
            return value or None
        header.skip(kind)
    return None


def tensor_types(path: str) -> dict[int, str]:
    """The GGML types the file's tensors are stored in, ``{type number: name}`` (``F32``,
    ``Q4_1``, ...): whether its weights are plain floats or already quantized. Read from
    the header's tensor list, as :func:`_metadata_text` reads the key/value list."""
    found: dict[int, str] = {}
    with open(path, "rb") as handle:
        header = _Header(handle)
        counts = header.start()
        if counts is None:
            raise ConfigError(f"{path} is not a GGUF file (version 2 or later)")
        for _ in range(counts[1]):
            header.text()
            header.skip(header.unpack("<I"))
        for _ in range(counts[0]):  # name, dimensions, type, offset
            header.text()
            handle.seek(8 * header.unpack("<I"), 1)
            code = header.unpack("<I")
            header.unpack("<Q")
            found.setdefault(code, _type_name(code))
    return found


def _type_name(code: int) -> str:
    """GGML's name of a tensor type (the gguf package's table; the number without it)."""
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(code).name
    except (ImportError, ValueError):
        return f"type {code}"
