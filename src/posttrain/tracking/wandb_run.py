"""One wandb run per stage (sft, rl, eval) of a pipeline run, grouped by the pipeline's run id.

Each run's config holds what made it: the stage's settings, its input artifact ids, their lineage (every
ancestor's id, kind, name and run) and the code version; when the stage has stored its output, the output
artifact ids are added (`posttrain.outputs`). Eval runs carry a per-problem table.

Runs are offline by default (`tracking.wandb_mode`); `tracking.wandb: false` starts none. Offline runs are
written to `<store root>/wandb/<run id>/wandb/offline-run-*` (`run_folder`); with a remote store root they are
written to a local cache folder and uploaded there when the stage finishes. Upload one with
`wandb sync <folder>`.

A `WandbRun` is described before it starts and is picklable until then (RL ships it to its controller
actor); `start` opens it (continuing a resumed stage's run id), `finish` records the outputs and closes it.
The stage that made it owns it: trackers log into it but do not finish it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import fsspec

from posttrain.artifacts.state import is_local, local_cache
from posttrain.config import TrackingConfig, to_dict


def run_folder(store_root: str, run_id: str) -> Path:
    """The local folder whose `wandb/` holds a pipeline run's offline wandb runs (for a remote store root:
    a cache folder on this machine; the finished runs are uploaded to `<root>/wandb/<run id>/`)."""
    fs, path = fsspec.core.url_to_fs(str(store_root))
    if is_local(fs):
        return Path(path).resolve() / "wandb" / run_id
    return local_cache("wandb", str(store_root)) / run_id


def offline_runs(store_root: str, run_id: str) -> list[str]:
    """The offline wandb run folders of one pipeline run: local paths, or URLs under a remote store root."""
    fs, path = fsspec.core.url_to_fs(str(store_root))
    if is_local(fs):
        return sorted(str(p) for p in (run_folder(store_root, run_id) / "wandb").glob("offline-run-*"))
    found = fs.glob(f"{path.rstrip('/')}/wandb/{run_id}/offline-run-*")
    return sorted(f"{str(store_root).rstrip('/')}/wandb/{run_id}/{f.rstrip('/').rsplit('/', 1)[-1]}" for f in found)


def lineage_config(store, ids: list[str]) -> list[dict]:
    """Every ancestor of the given artifacts (them included), once each, parents before children."""
    out: dict[str, dict] = {}

    def visit(node) -> None:
        m = node.manifest
        if m.id in out:
            return
        for p in node.parents:
            visit(p)
        out[m.id] = {"id": m.id, "kind": m.kind, "name": m.name, "run_id": m.run_id, "parents": list(m.parents)}

    for id_ in ids:
        visit(store.lineage(id_))
    return list(out.values())


@dataclasses.dataclass
class WandbRun:
    cfg: TrackingConfig
    stage: str
    """"sft", "rl" or "eval": the run's wandb job_type."""
    name: str
    run_id: str
    """The pipeline run id: the wandb group."""
    store_root: str
    config: dict
    _run: object = dataclasses.field(default=None, repr=False)

    @classmethod
    def for_stage(cls, cfg: TrackingConfig, *, stage: str, run_id: str, store, inputs: dict[str, str | None],
                  settings: dict, name: str = "") -> WandbRun | None:
        """None when `tracking.wandb` is false. `inputs`: role -> artifact id (None entries are left out)."""
        from posttrain.artifacts.codeversion import code_version

        if not cfg.wandb:
            return None
        inputs = {k: v for k, v in inputs.items() if v}
        settings = {k: to_dict(v) if dataclasses.is_dataclass(v) else v for k, v in settings.items()}
        meta = {"run_id": run_id, "stage": stage, "store": str(store.root), "inputs": inputs,
                "lineage": lineage_config(store, list(inputs.values())), "code": code_version()}
        return cls(cfg=cfg, stage=stage, name=name or f"{stage}-{run_id}", run_id=run_id,
                   store_root=str(store.root), config={**settings, "posttrain": meta})

    @property
    def id(self) -> str | None:
        return self._run.id if self._run is not None else None

    @property
    def folder(self) -> Path | None:
        """This run's offline folder (`.../wandb/offline-run-<time>-<id>`) once started."""
        return Path(self._run.dir).parent if self._run is not None else None

    def start(self, resume_id: str | None = None) -> str:
        """Open the run (the same wandb id as `resume_id` when a stage resumes); returns its id."""
        import wandb

        if self._run is None:
            if resume_id is not None:
                # A wandb-core service inherited from a parent process (WANDB_SERVICE, set by wandb in any process
                # that opened a run, e.g. an in-process stage before Elastic forked these ranks) still holds the
                # killed attempt's run as active: resuming through it fails with "run ID ... is in use". This
                # process starts a service of its own instead.
                os.environ.pop("WANDB_SERVICE", None)
            folder = run_folder(self.store_root, self.run_id)
            folder.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=self.cfg.wandb_project, name=self.name, group=self.run_id, job_type=self.stage,
                mode=self.cfg.wandb_mode, dir=str(folder), id=resume_id, resume="allow", config=self.config,
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
            print(f"{self.stage}: wandb {self.cfg.wandb_mode} run {self._run.id} in {self.folder}", flush=True)
        return self._run.id

    def log(self, metrics: dict, step: int | None = None) -> None:
        self._run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list]) -> None:
        import wandb

        self._run.log({key: wandb.Table(columns=columns, data=rows)})

    def finish(self, outputs: dict[str, str] | None = None, summary: dict | None = None, *, failed: bool = False) -> None:
        """Record the stage's output artifact ids and summary numbers, close the run and, for a remote store,
        upload its folder. Nothing when it never started or is already finished."""
        if self._run is None:
            return
        if outputs:
            self._run.config.update({"posttrain": {**self.config["posttrain"], "outputs": outputs}},
                                    allow_val_change=True)
        for k, v in (summary or {}).items():
            self._run.summary[k] = v
        folder = self.folder
        self._run.finish(exit_code=1 if failed else 0)
        self._run = None
        fs, root = fsspec.core.url_to_fs(self.store_root)
        if not is_local(fs) and self.cfg.wandb_mode == "offline":
            dest = f"{root.rstrip('/')}/wandb/{self.run_id}/{folder.name}"
            fs.put(str(folder), dest, recursive=True)
            print(f"{self.stage}: wandb run uploaded to {self.store_root.rstrip('/')}/wandb/{self.run_id}/{folder.name}",
                  flush=True)
