"""The Ray entry point of the RL stage: placement + role actors + ONE controller actor, then wait.

    result = run_rl(rl_cfg=..., reward_cfg=..., placement_cfg=..., max_seq_len=32, tracking_cfg=..., start_model_dir=...,
                    dataset_dir=..., store_root=..., run_id=..., parents=[start_id, dataset_id],
                    state_dir=..., start_model_id=start_id)

Works where Ray is already initialised (inside the Flyte Ray task, whose pre_execute called `ray.init`);
otherwise it starts a local Ray sized to this machine and shuts it down afterwards. Steps:
1. plan placement from `ray.available_resources()` and create the placement groups (fail fast, no hang);
2. create every role's actors in their bundles (placement.create_role_actors, the one `ray.remote`);
3. create the controller actor (num_cpus=0) with the actor handles; inside it the role groups, the
   prompt sampler, the tracker and the checkpointer are built and `Controller.run` resumes and loops;
4. wait for it: its start within a timeout, then a watchdog that polls the controller's progress (a second
   thread of the controller actor) and fails when no step finishes within `rl.step_timeout_s`, naming the
   step and the stage; a failed run raises the controller's own exception (e.g. StaleWeightsError);
5. kill the actors and remove the placement groups, whatever happened.

Restarts (`rl.max_restarts`): when a worker is lost (`WorkerLostError`: its actor died - killed, crashed,
its node gone - or the controller actor itself died) or a call or step timed out, steps 1-5 run again: every
role actor and the controller are new, and the controller resumes from the run's last checkpoint (policy and
optimizer state, sampler cursor, RNG, step history), so the steps after it are re-done from the same state
and the run ends with exactly `rl.steps` updates, none lost or repeated. Errors that a restart would only
repeat (settings, stale weights, drift, non-finite numbers, a failing reward function) end the run at once.
Rebuilding every role, not only the one that died, is deliberate: the policy ranks must form a new
process group anyway and the rollout workers must get the restored policy's weights.

Leaves out: replacing one actor in place while the others keep their state (Ray's own `max_restarts` would
restart an actor with its constructor's state, silently behind the policy version).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from posttrain.artifacts import ArtifactRef
from posttrain.config import ModelConfig, PlacementConfig, RewardConfig, RLConfig, TrackingConfig, to_dict
from posttrain.rl import placement as pl
from posttrain.rl import weight_transfer
from posttrain.rl.metrics import StepMetrics
from posttrain.rl.remote import RemoteTimeoutError, WorkerLostError
from posttrain.rl.roles import composed, registry
from posttrain.tracking.wandb_run import WandbRun

WAIT_CALLS_PER_STEP = 10
"""Backstop for the driver's wait for the controller's start (role actors reporting, the policy group
joining): fewer than this many remote calls, each bounded by rl.remote_timeout_s."""
WATCHDOG_POLL_S = 2.0
"""How often the driver asks the controller actor for its progress while the run goes on."""


class StepTimeoutError(TimeoutError):
    """No RL step finished within rl.step_timeout_s; names the step and the controller's stage."""


@dataclass(frozen=True, kw_only=True)
class RLResult:
    model: ArtifactRef
    """The final policy as a `model` artifact (parents: start model, dataset)."""
    steps: int
    """Updates done in total (including those before a resume)."""
    last_metrics: StepMetrics | None
    history: list[StepMetrics]
    restarts: int = 0
    """How many times the actors were rebuilt after a lost worker or a timeout (rl.max_restarts)."""
    placement: dict = field(default_factory=dict)
    """Where the actors that finished the run ran: {"nodes": {role: [Ray node id (12 hex) of each rank]},
    "weights": how the policy's weights reached the rollout workers}."""


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything the controller actor needs besides the actor handles."""

    rl_cfg: RLConfig
    reward_cfg: RewardConfig
    placement_cfg: PlacementConfig
    tracking_cfg: TrackingConfig
    max_seq_len: int
    start_model_dir: str
    dataset_dir: str
    store_root: str
    run_id: str
    parents: list[str]
    state_dir: str
    start_model_id: str
    weights_folder: str = ""
    """Shared-memory folder for policy -> rollout weight transfer on one node (posttrain.rl.weight_transfer);
    "" or rollout workers on another node than policy rank 0: Ray's object store."""
    wandb_run: WandbRun | None = None
    """The RL stage's wandb run, not started yet (None: no wandb)."""
    model_cfg: ModelConfig | None = None

    def settings(self) -> registry.RunSettings:
        return registry.RunSettings(rl=self.rl_cfg, reward=self.reward_cfg, placement=self.placement_cfg,
                                    model=self.model_cfg, start_model_dir=self.start_model_dir)


class ControllerActor:
    """Runs inside Ray: builds the groups around the role actors' handles and drives `Controller`."""

    def __init__(self, spec: RunSpec, handles: dict[str, list]):
        from posttrain.data.examples import read_examples
        from posttrain.models.io import load_tokenizer
        from posttrain.rl.controller import Controller
        from posttrain.rl.curriculum import Curriculum
        from posttrain.rl.metrics import RLTracker
        from posttrain.rl.remote import gather
        from posttrain.rl.state import Checkpointer, reward_identity

        cfg, t = spec.rl_cfg, spec.rl_cfg.remote_timeout_s
        ids = {role: gather([h.identity.remote() for h in hs], [f"{role}[{i}]" for i in range(len(hs))],
                            stage=f"{role}.start", timeout_s=t) for role, hs in handles.items()}
        ctx = registry.GroupContext(settings=spec.settings(), ids=ids, timeout_s=t, weights_folder=spec.weights_folder)
        groups = composed.run_groups(ctx, handles, spec.max_seq_len)
        curriculum = Curriculum.read(spec.dataset_dir)  # data.pass_rate.refresh_every: RL draws from the pool
        examples = curriculum.pool if curriculum else read_examples(spec.dataset_dir, "train")
        sampler = composed.prompt_sampler(examples, load_tokenizer(spec.start_model_dir), cfg, groups["rollout"],
                                          spec.max_seq_len)
        if curriculum:
            sampler.set_active(curriculum.start_rows(sampler))
        lora = spec.model_cfg.lora if spec.model_cfg is not None else None  # the checkpoints are adapters
        config = {"rl": to_dict(cfg), "reward": to_dict(spec.reward_cfg), "placement": to_dict(spec.placement_cfg),
                  "max_seq_len": spec.max_seq_len, **({"lora": to_dict(lora)} if lora else {})}
        self.checkpointer = Checkpointer(
            state_dir=spec.state_dir, store_root=spec.store_root, run_id=spec.run_id, parents=spec.parents,
            config=config, extra={"reward": reward_identity(spec.reward_cfg, [e.get("task") for e in examples]),
                                  **registry.lineage(ctx.settings, groups),
                                  "start_model": spec.start_model_id, "algorithm": cfg.algorithm.value,
                                  **({"adapter_of": spec.start_model_id} if lora else {})})
        latest = self.checkpointer.latest()
        tracker = RLTracker(spec.tracking_cfg, name=f"rl-{spec.run_id}", total=cfg.steps,
                            start=latest.step if latest else 0, wandb_run=spec.wandb_run,
                            wandb_id=latest.wandb_id if latest else None)
        self.controller = Controller(cfg, groups, sampler, tracker, self.checkpointer, curriculum)
        self.placement = {"nodes": {role: [i.node for i in ids[role]] for role in ids},
                          "weights": groups["policy"].transport}

    def ready(self) -> dict:
        """Returns once __init__ is done (every role worker started and the policy group joined): where they run."""
        return self.placement

    def run(self, steps: int) -> tuple[str, list[StepMetrics]]:
        history = self.controller.run(steps)
        return self.controller.model_id, history

    def progress(self) -> tuple[int, str]:
        """(steps done, stage now): answered from the actor's second thread while `run` goes on."""
        return self.controller.step_count, self.controller.stage


def default_workers() -> dict[str, type]:
    """Role -> worker class, from the registry (a plain dict: tests swap in faulty workers, e.g. a stale
    rollout worker)."""
    return {name: spec.worker() for name, spec in registry.ROLES.items()}


def _role_actors(plan, pgs: dict, workers: dict[str, type], settings: registry.RunSettings) -> dict[str, list]:
    """Every role's actors, in their placement-group bundles: role -> handles in rank order, each built with
    its declaration's constructor arguments (torch threads among them)."""
    out = {}
    for role, p in plan.roles.items():
        n, spec = len(p.bundle_indices), registry.ROLES[role]
        out[role] = pl.create_role_actors(workers[role], p, pgs, lambda rank, spec=spec, n=n: spec.worker_kwargs(
            settings, rank, n))
    return out


def _wait_for(controller, cfg: RLConfig, *, role_actors: int) -> tuple[str, list[StepMetrics], dict]:
    """Wait for the controller actor to start, then for its `cfg.steps` steps under the step watchdog; a
    failure inside it is raised here as the controller's own exception, a dead controller as WorkerLostError
    and a start that overran as RemoteTimeoutError (both restartable)."""
    import ray

    t0 = time.perf_counter()
    start_timeout = cfg.remote_timeout_s * WAIT_CALLS_PER_STEP
    try:
        try:
            placement = ray.get(controller.ready.remote(), timeout=start_timeout)
        except ray.exceptions.GetTimeoutError:
            raise RemoteTimeoutError(f"rl: the controller and its role actors did not start within "
                                     f"{start_timeout:.0f}s (rl.remote_timeout_s x 10)") from None
        print(f"rl: {role_actors} role actors and the controller started in {time.perf_counter() - t0:.1f}s; "
              + ", ".join(f"{role}{list(nodes)}" for role, nodes in placement["nodes"].items())
              + f" (Ray nodes); weights via {placement['weights']}", flush=True)
        run = controller.run.remote(cfg.steps)
        seen, since = -1, time.monotonic()
        while not ray.wait([run], timeout=WATCHDOG_POLL_S)[0]:
            step, stage = ray.get(controller.progress.remote(), timeout=cfg.remote_timeout_s)
            if step != seen:
                seen, since = step, time.monotonic()
            elif time.monotonic() - since > cfg.step_timeout_s:
                raise StepTimeoutError(f"rl: step {step + 1} did not finish within rl.step_timeout_s = "
                                       f"{cfg.step_timeout_s:g}s (the controller is in stage {stage!r})")
        return (*ray.get(run), placement)
    except ray.exceptions.GetTimeoutError:
        raise RemoteTimeoutError(f"rl: the controller actor did not answer a progress query within "
                                 f"{cfg.remote_timeout_s:.0f}s") from None
    except ray.exceptions.RayTaskError as e:  # surface the controller's own exception type and message
        cause = getattr(e, "cause", None)
        if isinstance(cause, Exception):
            raise cause from e
        raise
    except ray.exceptions.RayActorError as e:
        if e.actor_init_failed:  # its __init__ raised (bad data, a failing worker): a restart would repeat it
            raise RuntimeError(f"rl: the controller actor failed to start: {e}") from e
        raise WorkerLostError(f"rl: the controller actor is gone ({type(e).__name__}): {e}") from e


RESTARTABLE = (WorkerLostError, RemoteTimeoutError, StepTimeoutError)
"""A lost worker or a timeout: new actors may well succeed. Anything else would fail the same way again."""


def run_rl(*, rl_cfg: RLConfig, reward_cfg: RewardConfig, model_cfg: ModelConfig | None = None, placement_cfg: PlacementConfig, max_seq_len: int, tracking_cfg: TrackingConfig,
           start_model_dir, dataset_dir, store_root: str, run_id: str, parents: list[str], state_dir,
           start_model_id: str, placement_timeout_s: float = 120.0, workers: dict[str, type] | None = None,
           wandb_run: WandbRun | None = None) -> RLResult:
    """Run RL on Ray; up to rl.max_restarts times, a lost worker or a timeout rebuilds the actors and resumes
    from the last checkpoint (module docstring). `wandb_run` (not started) goes to the controller actor, which
    logs every step into it and finishes it with the final model's id."""
    import ray

    workers = {**default_workers(), **(workers or {})}
    started_ray = not ray.is_initialized()
    if started_ray:  # no Flyte Ray task around us: a local Ray with one logical CPU per core
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    spec = RunSpec(rl_cfg=rl_cfg, reward_cfg=reward_cfg, placement_cfg=placement_cfg, tracking_cfg=tracking_cfg,
                   max_seq_len=max_seq_len, start_model_dir=str(start_model_dir), dataset_dir=str(dataset_dir),
                   store_root=str(store_root), run_id=run_id, parents=list(parents), state_dir=str(state_dir),
                   start_model_id=start_model_id, weights_folder=str(weight_transfer.folder_for(run_id)),
                   wandb_run=wandb_run, model_cfg=model_cfg)
    try:
        for attempt in range(rl_cfg.max_restarts + 1):
            try:
                model_id, history, placement = _attempt(spec, workers, placement_timeout_s)
                break
            except RESTARTABLE as e:
                if attempt == rl_cfg.max_restarts:
                    e.add_note(f"rl: no restarts left (rl.max_restarts = {rl_cfg.max_restarts})")
                    raise
                print(f"rl: {type(e).__name__}: {e}\nrl: restart {attempt + 1}/{rl_cfg.max_restarts}: new role actors "
                      "and controller, resuming from the last checkpoint", flush=True)
    finally:
        if started_ray:
            ray.shutdown()
    from posttrain.artifacts import ArtifactStore

    model = ArtifactStore(store_root).ref(model_id)
    return RLResult(model=model, steps=len(history), last_metrics=history[-1] if history else None, history=history,
                    restarts=attempt, placement=placement)


def _attempt(spec: RunSpec, workers: dict[str, type], placement_timeout_s: float
             ) -> tuple[str, list[StepMetrics], dict]:
    """One life of the run's actors: placement, role actors, controller, wait; then everything is released."""
    import ray

    cfg = spec.rl_cfg
    deadline, told = time.monotonic() + placement_timeout_s, False
    while True:
        available = pl.free_resources(min_cpu=min(1.0, ray.cluster_resources().get("CPU", 1.0)))
        try:
            plan = pl.plan_placement(spec.placement_cfg, counts=registry.role_counts(spec.settings()),
                                     available=available, nodes=pl.cluster_nodes())
            break
        except pl.NoPodsError as e:  # a lost pod that KubeRay is recreating: wait for it, up to the timeout
            if time.monotonic() > deadline:
                e.add_note(f"rl: waited {placement_timeout_s:.0f}s for it")
                raise
            if not told:
                print(f"rl: {e}; waiting up to {placement_timeout_s:.0f}s for one to join", flush=True)
                told = True
            time.sleep(1.0)
    print(f"rl: {plan.describe()}", flush=True)
    pgs, actors, handles = {}, [], {}
    try:
        pgs = pl.create_placement_groups(plan, timeout_s=placement_timeout_s)
        handles = _role_actors(plan, pgs, workers, spec.settings())
        actors = [h for hs in handles.values() for h in hs]
        controller = pl.create_controller_actor(ControllerActor, spec, handles)
        actors.append(controller)
        return _wait_for(controller, cfg, role_actors=len(actors) - 1)
    finally:
        if handles.get("policy"):  # the weight files live on policy rank 0's node: removed there
            try:
                ray.get(handles["policy"][0].remove_shared.remote(), timeout=10)
            except Exception as e:  # noqa: BLE001 - a dead rank or node: its pod's /dev/shm went with it
                print(f"rl: policy[0] did not remove its weight files ({type(e).__name__}); a lost pod's /dev/shm "
                      "goes with it", flush=True)
        for a in actors:
            ray.kill(a, no_restart=True)
        if pgs:
            pl.remove_placement_groups(pgs)
        weight_transfer.remove_folder(spec.weights_folder)  # on this node; a pod's /dev/shm goes with the pod
