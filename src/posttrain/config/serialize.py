"""Configs to and from plain JSON-ready dicts, and JSON overrides merged into a recipe.

`to_dict` feeds manifests and cache keys; `from_dict` rebuilds a config, naming the field path of any unknown
key or wrongly typed value; `apply_overrides` is what `--overrides '{"sft": {"steps": 500}}'` goes through.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing

from posttrain.config.errors import ConfigError
from posttrain.config.pipeline import PipelineConfig


def to_dict(cfg: typing.Any) -> typing.Any:
    """A JSON-ready dict of a config (enums become their values); used in manifests and cache keys."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


REMOVED = {
    "sft.epochs_limit": "it was never read (SFT always ran sft.steps optimizer steps); set sft.steps instead "
                        "(one pass over the data is train examples / sft.global_batch_size steps)",
}
"""Settings that existed once and were taken out, by field path, with what to do instead: an override that
still sets one is refused with this message rather than the generic unknown-field list."""


def from_dict(cls: type, data: dict, path: str = "") -> typing.Any:
    """Build config class `cls` from a dict, naming the field path of any unknown key or bad type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    for k in unknown:
        where = f"{path}.{k}" if path else k
        if where in REMOVED:
            raise ConfigError(f"{where}: this setting was removed: {REMOVED[where]}")
    if unknown:
        raise ConfigError(f"{path or cls.__name__}: unknown field(s) {unknown}; allowed: {sorted(names)}")
    kwargs = {k: _coerce(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
    return cls(**kwargs)


def _coerce(tp: typing.Any, value: typing.Any, path: str) -> typing.Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # `X | None`: null, or an X
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        (inner,) = args
        return _coerce(inner, value, path)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        allowed = [m.value for m in tp]
        if value not in allowed:
            raise ConfigError(f"{path}: {value!r} is not one of {allowed}")
        return tp(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
        return value
    return value


def parse_overrides(overrides: str | dict) -> typing.Any:
    """JSON overrides as given: a dict as it is, a string parsed ("" or blanks: {})."""
    if not isinstance(overrides, str):
        return overrides
    if not overrides.strip():
        return {}
    try:
        return json.loads(overrides)
    except json.JSONDecodeError as e:
        raise ConfigError(f"overrides: not valid JSON ({e})") from None


def apply_overrides(cfg: PipelineConfig, overrides: str | dict) -> PipelineConfig:
    """Return `cfg` with JSON overrides merged in, e.g. '{"sft": {"steps": 500}}'."""
    if isinstance(overrides, str) and not overrides.strip():
        return cfg
    merged = _deep_merge(to_dict(cfg), parse_overrides(overrides))
    return from_dict(PipelineConfig, merged)


def _deep_merge(base: dict, over: dict) -> dict:
    if not isinstance(over, dict):
        raise ConfigError(f"overrides: expected a JSON object, got {type(over).__name__}")
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
