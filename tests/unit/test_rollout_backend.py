"""Choosing the generation engine: `rl.rollout_backend` / `eval.backend` = "vllm" is refused at plan time, with the install
command, where vLLM is not installed; the transformers engine never imports vLLM. No vLLM needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posttrain.config import ConfigError, RolloutBackend, check_base
from posttrain.recipes import resolve

VLLM = '{"rl": {"rollout_backend": "vllm"}}'
EVAL_VLLM = '{"eval": {"backend": "vllm"}}'


@pytest.mark.parametrize("overrides,field", [(VLLM, "rl.rollout_backend"), (EVAL_VLLM, "eval.backend")])
def test_vllm_backend_without_vllm_is_refused_with_the_install_command(monkeypatch, overrides, field):
    monkeypatch.setattr(check_base, "vllm_installed", lambda: False)
    with pytest.raises(ConfigError, match=rf"{field}: 'vllm' needs vLLM.*`make install-vllm`"):
        resolve("tiny_cpu", overrides)
    assert resolve("tiny_cpu").rl.rollout_backend is RolloutBackend.TRANSFORMERS  # the default needs nothing


def test_vllm_backend_with_vllm_is_accepted(monkeypatch):
    monkeypatch.setattr(check_base, "vllm_installed", lambda: True)
    assert resolve("tiny_cpu", VLLM).rl.rollout_backend is RolloutBackend.VLLM
    assert resolve("tiny_cpu", EVAL_VLLM).eval.backend is RolloutBackend.VLLM


def test_the_check_looks_at_this_environment():
    try:
        import vllm  # noqa: F401
        importable = True
    except ImportError:
        importable = False
    assert check_base.vllm_installed() is importable


def test_transformers_rollout_does_not_import_vllm():
    code = ("import sys; import posttrain.rl.roles.rollout, posttrain.rl.run, posttrain.recipes; "
            "assert 'vllm' not in sys.modules, 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
