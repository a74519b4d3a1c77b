"""`posttrain promote` with real models: the first decision pins the channel's eval set and promotes; a worse
model is then evaluated - with the holder - on exactly that set and refused (exit status 3); both decisions
are listed by `posttrain channels` and the refusal's lineage reaches both evaluations."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from posttrain.artifacts import ArtifactStore
from posttrain.cli.main import REFUSED_STATUS, main

OVERRIDES = json.dumps({"eval": {"num_problems": 50, "k": 0, "max_new_tokens": 8}})


def _cli(capsys, home, *argv: str) -> tuple[int, str, str]:
    status = main(["--home", str(home), *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.timeout(1500)  # the first user of the shared fixture trains it
def test_promote_pins_then_refuses_a_worse_model_on_the_same_problems(tmp_path, tiny_sft_model, capsys):
    home = tmp_path / "home"
    store = ArtifactStore(home)
    ds = store.put("dataset", "addition", tiny_sft_model["dataset_dir"], run_id="t", parents=[], config={})
    good = store.put("model", "good", tiny_sft_model["model_dir"], run_id="t", parents=[ds.id], config={})
    bad_dir = tmp_path / "bad"
    shutil.copytree(tiny_sft_model["model_dir"], bad_dir)
    weights = load_file(str(bad_dir / "model.safetensors"))
    save_file({k: torch.zeros_like(v) for k, v in weights.items()}, str(bad_dir / "model.safetensors"))
    bad = store.put("model", "bad", bad_dir, run_id="t", parents=[ds.id], config={})

    status, _, err = _cli(capsys, home, "promote", good.id, "production", "--overrides", OVERRIDES)
    assert status == 1 and "has no pinned eval set yet" in err and "Traceback" not in err

    status, out, _ = _cli(capsys, home, "promote", good.id, "production", "--pin", ds.id, "--overrides", OVERRIDES)
    assert status == 0, out
    good_acc = float(out.split("promoted: greedy accuracy ")[1].split()[0])
    assert good_acc > 0.2 and "(the channel held no model)" in out

    status, out, _ = _cli(capsys, home, "promote", bad.id, "production", "--overrides", OVERRIDES, "--json")
    result = json.loads(out)
    assert status == REFUSED_STATUS == 3 and result["promoted"] is False
    assert result["reason"] == (f"greedy accuracy 0.000 on the pinned set < current production model "
                                f"{good.id[:12]}'s {good_acc:.3f} - tolerance 0.000")

    status, out, _ = _cli(capsys, home, "channels", "--json")
    (channel,) = json.loads(out)
    assert channel["holder"]["model_id"] == good.id
    assert [d["promoted"] for d in channel["decisions"]] == [False, True]
    tree = store.lineage(result["decision_id"])
    evals = {n.manifest.config["model_id"]: n.manifest for n in tree.parents if n.manifest.kind == "eval"}
    assert set(evals) == {good.id, bad.id}  # both models, evaluated ...
    assert {m.config["dataset_id"] for m in evals.values()} == {ds.id}  # ... on the pinned problems
    assert evals[good.id].metrics["greedy_accuracy"] == good_acc

    other = store.put("dataset", "other", tiny_sft_model["dataset_dir"], run_id="t2", parents=[good.id], config={})
    status, _, err = _cli(capsys, home, "promote", bad.id, "production", "--pin", other.id, "--overrides", OVERRIDES)
    assert status == 1 and "already pins its eval set" in err
