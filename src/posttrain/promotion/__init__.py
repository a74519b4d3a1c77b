"""Channels and promotion: which model a channel holds, its pinned eval set and its decisions (channel.py), and
the gate that evaluates a candidate and the holder on the same problems before promoting (judge.py)."""

from posttrain.promotion.channel import (
    Decision,
    PromotionError,
    channels,
    current,
    decisions,
    decisions_by_channel,
    gate,
    pin,
    set_pin,
)

__all__ = ["Decision", "PromotionError", "channels", "current", "decisions", "decisions_by_channel", "gate", "pin",
           "set_pin"]
