"""Reading back the pickled files of a run directory without ever running code.

Run directories travel: shared cluster filesystems, copied results, downloaded checkpoints.
A pickle can name any Python callable and have it called while it loads, so a planted
``state.pt`` read by Python's own unpickler runs whatever its author chose. Every pickled
file a run reads back goes through here instead, and each reader calls nothing but the
constructors of the data the file is meant to hold:

- ``checkpoints/step-N/state.pt`` and ``allocator_state.pt``: torch's weights-only
  unpickler (tensors, numbers, strings, lists, tuples, dicts). Checkpoints of format 3 keep
  numpy's random state as a tensor and plain numbers for exactly this reason; format 2 held
  it as a numpy array, which is read by also allowing numpy's array constructor (and
  nothing else) and converted on load (:func:`read_state`).
- ``checkpoints/step-N/sharded/.metadata``, the index torch.distributed.checkpoint writes
  with ``pickle.dump`` and reads back with ``pickle.load``: a reader (:func:`dcp_reader`)
  whose unpickler knows only DCP's metadata classes, torch's sizes, dtypes and layouts, and
  paths. The ``.distcp`` files themselves hold raw tensor bytes, and DCP reads their other
  objects weights-only already.

A file that names anything else is refused in one line naming what it asked for; nothing
in it has run by then. Every other file of a run is JSON, YAML (read with the safe loader)
or safetensors, which hold data only.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError


class PlantedCode(ConfigError):
    """A run file names a callable that such a file never holds (exit 2): it was not
    written by adalora, and it was not loaded."""


def _refusal(path: Path, names: list[str]) -> PlantedCode:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return PlantedCode(
        f"refused to load {path}: it names {shown or 'objects'}, which no file adalora "
        "writes holds, so it was not written by a run (nothing in it was run); replace it "
        "with the run's own copy, or delete it and the checkpoint it belongs to")


def _numpy_array_globals() -> list[Any]:
    """What a pickled numpy array names: its reconstructor (``numpy.core`` or ``numpy._core``,
    by numpy's version), ``ndarray`` and the dtype classes."""
    import numpy as np

    rebuild = np.zeros(1).__reduce__()[0]
    dtypes = [type(np.dtype(code)) for code in ("uint32", "float64", "int64")]
    return [rebuild, np.ndarray, np.dtype, *dtypes]


def load_tensors(path: str | Path, *, numpy_arrays: bool = False) -> Any:
    """``torch.load(path)`` weights-only, on the CPU; ``numpy_arrays`` also allows numpy
    arrays (format-2 checkpoints' RNG state). A file naming any other callable raises
    :class:`PlantedCode`; a damaged one raises what torch raises."""
    path = Path(path)
    allowed = _numpy_array_globals() if numpy_arrays else []
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights_only" not in str(err) and "Weights only" not in str(err):
            raise
        try:  # names what the file asked for; reads opcodes, calls nothing
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:  # noqa: BLE001 - not a torch zip file: a bare pickle
            names = _bare_pickle_globals(path)
        if not names:  # nothing foreign named: a damaged file, said as the reader says it
            raise
        raise _refusal(path, names) from None


def _bare_pickle_globals(path: Path) -> list[str]:
    """The ``module.name`` globals a plain pickle file names, from its opcodes alone."""
    import pickletools

    found: list[str] = []
    strings: list[str] = []
    try:
        with open(path, "rb") as f:
            for op, arg, _ in pickletools.genops(f):
                if isinstance(arg, str):
                    strings.append(arg)
                if op.name == "GLOBAL":
                    found.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # noqa: BLE001 - a damaged pickle: name what was read
        pass
    return found


# ------------------------------------------------------------------ DCP's metadata
_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)
_DCP_NAMES = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
              ("torch", "Size"), ("torch.serialization", "_get_layout"),
              ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
              ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
              ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler for DCP's ``.metadata``: its dataclasses and enums, torch's ``Size``,
    dtypes and layouts, and paths. Each is a plain constructor: calling it with any
    arguments builds data and runs nothing else."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        import importlib

        if (module, name) in _DCP_NAMES:
            return super().find_class(module, name)
        if module in _DCP_MODULES:
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type) and found.__module__ == module:
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _refusal(self.path, [f"{module}.{name}"])


def read_dcp_metadata(folder: str | Path, name: str = ".metadata") -> Any:
    """DCP's ``Metadata`` of a sharded checkpoint's folder, read by :class:`_MetadataUnpickler`
    (``name``: DCP also looks for a per-rank ``__<rank>.metadata``, which it writes only when
    asked to)."""
    folder = Path(folder)
    with open(folder / name, "rb") as f:
        return _MetadataUnpickler(f, folder / name).load()


def dcp_reader(folder: str | Path):
    """A ``FileSystemReader`` of ``folder`` that reads its index with
    :func:`read_dcp_metadata` (DCP's own uses ``pickle.load``); pass it to ``dcp.load`` as
    ``storage_reader``."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            metadata = read_dcp_metadata(folder, ".metadata" if rank is None
                                         else f"__{rank}.metadata")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(str(folder))
