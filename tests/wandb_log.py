"""Read the records of an offline wandb run file (`run-<id>.wandb`) - test-only.

wandb writes a leveldb-style log: a 7-byte file header (":W&B", magic, version), then 32 KiB blocks of
records, each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and a piece of
one serialized `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_BLOCK, _HDR = 32768, 7


def records(path: str | Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a wandb run file"
    out, pos, pieces = [], _HDR, []
    while pos + _HDR <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HDR:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HDR])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left
            continue
        pieces.append(data[pos + _HDR:pos + _HDR + length])
        pos += _HDR + length
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(b"".join(pieces))
            out.append(r)
            pieces = []
    return out


def read_run(folder: Path) -> dict:
    """One offline run folder -> its run record, merged config (updates applied in order), summary, history."""
    run, config, summary, history = None, {}, {}, []
    for r in records(next(Path(folder).glob("run-*.wandb"))):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = r.run
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    if run is None:  # a run whose process was killed before wandb wrote its records
        return {}
    return {"group": run.run_group, "job_type": run.job_type, "name": run.display_name, "id": run.run_id,
            "config": config, "summary": summary, "history": history}
