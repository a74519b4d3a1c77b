"""Channels: which model each holds, its pinned eval set, its decisions, and the gate's rule (channel.py). The
stage that evaluates a candidate and the holder on the same problems, then asks the gate, is stages/gate.py."""

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
