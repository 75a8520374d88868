"""Read a W&B offline run file (``run-<id>.wandb``) back, for the tracking tests.

wandb 0.19+ dropped its Python reader of these files (the Go core writes them now), so
this is the small part of it the tests need: the file is a LevelDB-style log (a 7-byte
``:W&B`` header, then 32 KiB blocks of CRC-checked chunks), and each record is wandb's
own ``Record`` protobuf, decoded with wandb's generated classes.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str | Path) -> list[Any]:
    """Every ``Record`` in the file, in order."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending, out = 7, b"", []
    while pos + 7 <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < 7:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # a tail still being written
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zero padding up to the block's end
            pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0
            continue
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def finished_records(path: str | Path, timeout_s: float = 30.0) -> list[Any]:
    """The records once W&B has written the run's ``exit`` record. ``run.finish()`` can
    return while wandb's core process still holds the file's tail in its write buffer."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in found):
            return found
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
        time.sleep(0.1)


def _items(items) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in items}


def read_run(path: str | Path) -> dict[str, Any]:
    """``{run: RunRecord, history: [{_step, key: value}], summary: {...}, config: {...}}``."""
    out: dict[str, Any] = {"run": None, "history": [], "summary": {}, "config": {}}
    for record in finished_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update(_items(record.run.config.update))
        elif kind == "history":
            row = _items(record.history.item)
            row["_step"] = record.history.step.num
            out["history"].append(row)
        elif kind == "summary":
            out["summary"].update(_items(record.summary.update))
        elif kind == "config":
            out["config"].update(_items(record.config.update))
    return out
