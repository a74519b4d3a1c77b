"""wandb as its users expect, through `posttrain.stages` in real subprocesses with real offline wandb runs:
one run per stage (SFT, eval) grouped by the pipeline run id, with the input artifact ids, their lineage and
the output id in the run config, per-step metrics, the eval's per-problem table; a killed SFT keeps its
resumable state, the re-run resumes from it, deletes it and continues the same run id; `tracking.wandb: false` writes nothing. The RL stage's run is checked by the pipeline e2e test.
The run files are read back with tests/wandb_log.py (wandb's own record format)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import stage_script
from tests.wandb_log import read_run

SCRIPT = r"""
import json, sys
from pathlib import Path
from posttrain import stages
from posttrain.artifacts import ArtifactStore
from posttrain.config import EvalConfig, ModelConfig, RewardConfig, SFTConfig, TrackingConfig
home, base, ds, mode = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
store = ArtifactStore(home)
data = store.put("dataset", "addition", ds, run_id="night-1", parents=[], config={})
track = TrackingConfig(wandb=mode != "off", log_every=1)
steps = 60 if mode == "long" else 3
start = stages.start_model(ModelConfig(base_path=base), run_id="night-1", store=store)
model = stages.sft(ModelConfig(base_path=base), SFTConfig(steps=steps, global_batch_size=16, micro_batch_size=16,
                   nproc=1, warmup_steps=0, save_every=1), track, dataset=data, tokenizer=None, start=start,
                   run_id="night-1", store=store)
ev = stages.evaluate(EvalConfig(num_problems=20, k=2, max_new_tokens=6), RewardConfig(), model=model, dataset=data,
                     run_id="night-1", store=store, tracking=track)
state = Path(home) / "state" / "sft"
left = sorted(str(p.relative_to(state)) for p in state.glob("*/*")) if state.exists() else []
print("RESULT" + json.dumps({"dataset": data.id, "start": start.id, "model": model.id, "eval": ev.report.id,
                             "state": left}))
"""
LONG = 60
"""Steps of the run that is killed (0.5 s after its first state save) and resumed."""


_SERVICE_HOLDER = """
import os, sys, wandb
wandb.init(mode="offline", dir=sys.argv[1], settings=wandb.Settings(silent=True, console="off"))
print(os.environ["WANDB_SERVICE"], flush=True)
import time; time.sleep(3600)
"""
"""A parent process that opened a wandb run and keeps its service (the token in WANDB_SERVICE) alive."""


def _start(home: Path, fixture: dict, mode: str) -> subprocess.Popen:
    return stage_script.start(SCRIPT, home, fixture, mode)


def _run(home: Path, fixture: dict, mode: str) -> tuple[dict, str]:
    return stage_script.run(SCRIPT, home, fixture, mode)


def _runs(home: Path) -> list[dict]:
    return [dict(read_run(f), folder=f) for f in sorted((home / "wandb" / "night-1" / "wandb").glob("offline-run-*"))]


@pytest.mark.timeout(1500)  # the first user of the shared fixture trains it (a few minutes)
def test_one_wandb_run_per_stage_with_ids_lineage_metrics_and_the_eval_table(tmp_path, tiny_sft_model):
    home = tmp_path / "home"
    ids, stdout = _run(home, tiny_sft_model, "short")
    runs = {r["job_type"]: r for r in _runs(home)}
    assert sorted(runs) == ["eval", "sft"] and {r["group"] for r in runs.values()} == {"night-1"}
    sft, ev = runs["sft"], runs["eval"]
    assert f"sft: wandb offline run {sft['id']} in {sft['folder']}" in stdout  # the stage names its run folder

    meta = sft["config"]["posttrain"]
    assert meta["run_id"] == "night-1" and meta["stage"] == "sft"
    assert meta["inputs"] == {"dataset": ids["dataset"], "start_model": ids["start"]}
    assert meta["outputs"] == {"model": ids["model"]}  # added once the model was stored
    assert {a["id"]: a["kind"] for a in meta["lineage"]} == {ids["dataset"]: "dataset", ids["start"]: "model"}
    assert meta["code"]["package"] and sft["config"]["sft"]["steps"] == 3
    losses = [h for h in sft["history"] if "loss" in h]
    assert [h["_step"] for h in losses] == [0, 1, 2] and all(h["loss"] > 0 for h in losses)

    emeta = ev["config"]["posttrain"]
    assert emeta["inputs"] == {"model": ids["model"], "dataset": ids["dataset"]}
    assert emeta["outputs"] == {"eval": ids["eval"]}
    assert ids["model"] in {a["id"] for a in emeta["lineage"]} and ids["start"] in {a["id"] for a in emeta["lineage"]}
    from posttrain.artifacts import ArtifactStore

    metrics = ArtifactStore(home).manifest(ids["eval"]).metrics
    assert ev["summary"]["greedy_accuracy"] == metrics["greedy_accuracy"]
    assert ev["summary"]["sampled_accuracy"] == metrics["sampled_accuracy"]
    table = json.loads(next((ev["folder"] / "files" / "media" / "table").rglob("*.table.json")).read_text())
    assert table["columns"] == ["prompt", "answer", "greedy", "score", "correct", "failure", "sampled_correct"]
    assert len(table["data"]) == 20  # every problem, not a sample
    assert sum(row[4] for row in table["data"]) / 20 == metrics["greedy_accuracy"]
    assert all(0 <= row[6] <= 2 for row in table["data"])  # of k = 2 samples

    # The README's upload command finds both runs (wandb's own CLI; --dry-run: nothing leaves the machine).
    folders = [str(r["folder"]) for r in runs.values()]
    out = subprocess.run([str(Path(sys.executable).parent / "wandb"), "sync", "--dry-run", *folders],
                         capture_output=True, text=True, timeout=120, check=False)
    assert "Would sync 2 run(s)" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.timeout(900)
def test_tracking_wandb_false_writes_no_run(tmp_path, tiny_sft_model):
    home = tmp_path / "home"
    _, stdout = _run(home, tiny_sft_model, "off")
    assert not (home / "wandb").exists() and ": wandb " not in stdout


@pytest.mark.timeout(900)
def test_a_killed_sft_keeps_its_state_resumes_it_deletes_it_and_continues_the_same_wandb_run(
        tmp_path, tiny_sft_model, monkeypatch):
    """SIGKILL after the first state save; the re-run resumes from the newest committed step (a kill mid-save
    leaves a newer step folder without meta.json: never loaded), says so, trains every step once, deletes the
    state once the model is stored, and continues the killed attempt's wandb run - with a wandb service inherited
    from a parent process (WANDB_SERVICE, as Elastic's ranks inherit it from an in-process stage that opened a
    run), which outlives the killed attempt and still holds its run: resuming through it failed with "run ID is
    in use" (found when another test had opened a run in the same pytest worker)."""
    from posttrain.artifacts import ArtifactStore

    home = tmp_path / "home"
    holder = subprocess.Popen([sys.executable, "-c", _SERVICE_HOLDER, str(tmp_path / "parent")],
                              stdout=subprocess.PIPE, text=True)
    try:
        token = holder.stdout.readline().strip()
        assert token, "the parent's wandb service did not start"
        monkeypatch.setenv("WANDB_SERVICE", token)
        proc = _start(home, tiny_sft_model, "long")
        last = stage_script.kill_after_first_sft_save(proc, home)
        ids, stdout = _run(home, tiny_sft_model, "long")
    finally:
        holder.kill()
        holder.wait(30)
    assert f"sft: resuming at step {last} of saved state " in stdout
    first_logged = int(re.search(r"^step (\d+):", stdout, re.MULTILINE).group(1))
    assert first_logged == last >= 1  # resumed from the newest saved step (a fresh start logs step 0)
    assert ids["state"] == []
    history = ArtifactStore(home).manifest(ids["model"]).extra["history"]  # the report's curves: every step once
    assert [h["step"] for h in history] == list(range(1, LONG + 1))
    # The killed attempt's folder and the resumed one carry the same run id (wandb names the folder after it).
    # The killed attempt's folder holds what the surviving service wrote of it (with a service of its own, only
    # the file header: unreadable); only the resumed run is finished with the stage's output.
    folders = sorted((home / "wandb" / "night-1" / "wandb").glob("offline-run-*"))
    sft = [r for r in _runs(home) if r.get("job_type") == "sft"]
    done = [r for r in sft if r["config"]["posttrain"].get("outputs")]
    assert len(done) == 1 and done[0]["config"]["posttrain"]["outputs"] == {"model": ids["model"]}
    assert {r["id"] for r in sft} == {done[0]["id"]}
    assert [f.name.rsplit("-", 1)[1] for f in folders].count(done[0]["id"]) == 2
    logged = [h["_step"] for h in done[0]["history"] if "loss" in h]
    assert logged == list(range(last, LONG))  # from where the state was saved (not step 0) to the end, each once


@pytest.mark.timeout(300)
def test_with_a_remote_store_root_the_offline_run_is_uploaded_under_it(tmp_path, s3_root, monkeypatch):
    """A pod's local disk goes with the pod: with an s3:// root the finished run is copied to <root>/wandb/<run id>/
    (a real S3-protocol server), and the run summary lists it there."""
    import fsspec

    from posttrain.artifacts import ArtifactStore
    from posttrain.config import TrackingConfig
    from posttrain.tracking.wandb_run import WandbRun, offline_runs

    monkeypatch.setenv("HOME", str(tmp_path / "pod"))  # the local cache folder is this "pod's"
    store = ArtifactStore(f"{s3_root}/home")
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "rows.txt").write_text("1+1=2\n")
    data = store.put("dataset", "d", ds, run_id="night-2", parents=[], config={})
    run = WandbRun.for_stage(TrackingConfig(), stage="sft", run_id="night-2", store=store,
                             inputs={"dataset": data.id}, settings={})
    run.start()
    run.log({"loss": 1.5}, step=0)
    run.finish(outputs={"model": "m" * 64})
    [uploaded] = offline_runs(store.root, "night-2")
    assert uploaded.startswith(f"{s3_root}/home/wandb/night-2/offline-run-")
    fs, path = fsspec.core.url_to_fs(uploaded)
    local = tmp_path / "back"
    fs.get(path, str(local), recursive=True)
    got = read_run(local)
    assert got["group"] == "night-2" and got["config"]["posttrain"]["outputs"] == {"model": "m" * 64}
    assert [h["loss"] for h in got["history"] if "loss" in h] == [1.5]
    assert got["config"]["posttrain"]["lineage"][0]["id"] == data.id
