"""RL on a real local Ray (the `ray_local` fixture: 4 logical CPUs): placement, the controller with real
role actors, the teacher role of on-policy distillation and DAPO's extra draws through real actors, and a stale
rollout worker stopping the run. (RL raising held-out accuracy is the acceptance
test in test_pipeline_e2e.py: the default recipe end to end.)

Run alone: `pytest -m ray tests/integration/test_rl_ray.py` (Ray tests run in their own pytest process)."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from posttrain.config import PlacementConfig, PlacementMode, RewardConfig, RLConfig, TrackingConfig
from posttrain.rl import placement as pl
from posttrain.rl.roles.rollout import RolloutWorker
from posttrain.rl.types import WeightReport

pytestmark = pytest.mark.ray

TRACKING = TrackingConfig(wandb=False, log_every=1)


def _counts(placement: PlacementConfig, *, kl: bool) -> dict[str, int]:
    """Role -> workers as the registry declares them for a GRPO run with or without a KL reference."""
    from posttrain.rl.roles.registry import RunSettings, role_counts

    return role_counts(RunSettings(rl=RLConfig(kl_coef=0.01 if kl else 0.0), reward=RewardConfig(),
                                   placement=placement, model=None, start_model_dir=""))


class Probe:
    """Reports the placement group and bundle Ray put it in, read from inside the actor."""

    def __init__(self, role: str, rank: int):
        self.role, self.rank = role, rank

    def where(self) -> tuple[str, int, str | None, int | None]:
        return (self.role, self.rank, *pl.current_bundle())

    def malloc(self) -> tuple[str | None, int]:
        """MALLOC_ARENA_MAX as this process sees it, and the glibc heaps (arenas) in use while 4 threads each
        hold a block: glibc gives each new thread that allocates its own arena, up to the cap."""
        return os.environ.get("MALLOC_ARENA_MAX"), _malloc_heaps(threads=4)


def _malloc_heaps(*, threads: int) -> int:
    """The heaps glibc's `malloc_info` lists while `threads` threads each hold a malloc'ed block."""
    import ctypes
    import tempfile
    import threading

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
    allocated, report = threading.Barrier(threads + 1), threading.Barrier(threads + 1)

    def hold():
        block = libc.malloc(4096)
        allocated.wait()
        report.wait()
        libc.free(block)

    workers = [threading.Thread(target=hold) for _ in range(threads)]
    for t in workers:
        t.start()
    allocated.wait(timeout=30)
    with tempfile.NamedTemporaryFile(suffix=".xml") as f:
        fp = libc.fopen(f.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        xml = Path(f.name).read_text()
    report.wait(timeout=30)
    for t in workers:
        t.join()
    return xml.count("<heap nr=")


@pytest.mark.parametrize("mode", [PlacementMode.COLOCATED, PlacementMode.SPLIT])
def test_every_actor_runs_in_its_roles_bundle(ray_local, mode):
    ray = ray_local
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = PlacementConfig(mode=mode, policy_workers=2, rollout_workers=1, reward_workers=1, reference_workers=1)
    plan = pl.plan_placement(cfg, counts=_counts(cfg, kl=True), available=pl.free_resources(min_cpu=4.0))
    total = sum(b["CPU"] for g in plan.groups for b in g.bundles)
    assert total <= ray.available_resources()["CPU"] + 1e-6  # fits by construction: no silent hang
    pgs = pl.create_placement_groups(plan, timeout_s=30)
    try:
        actors = {role: pl.create_role_actors(Probe, rp, pgs, lambda rank, role=role: {"role": role, "rank": rank})
                  for role, rp in plan.roles.items()}
        seen = ray.get([a.where.remote() for acts in actors.values() for a in acts], timeout=60)
        for role, rank, pg_id, bundle in seen:
            rp = plan.roles[role]
            assert pg_id == pgs[rp.group].id.hex(), (role, rank)
            assert bundle == rp.bundle_indices[rank], (role, rank, bundle)
        groups = {pg for _, _, pg, _ in seen}
        if mode == PlacementMode.COLOCATED:  # one group; rank i of every role shares bundle i
            assert len(groups) == 1
            assert {(r, k) for r, k, _, b in seen if b == 0} == {("rollout", 0), ("reward", 0), ("reference", 0),
                                                                  ("policy", 0)}
        else:  # one group per role
            assert len(groups) == 4
        for acts in actors.values():
            for a in acts:
                ray.kill(a)
    finally:
        pl.remove_placement_groups(pgs)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="MALLOC_ARENA_MAX is glibc's")
@pytest.mark.parametrize("arenas", [2, 0])
def test_role_workers_start_with_the_configured_malloc_arenas(ray_local, arenas):
    """placement.malloc_arena_max reaches every role worker's environment before its first malloc: with 2,
    four threads allocating share 2 heaps; with 0 (glibc's default, if the driver does not set it) each gets
    its own."""
    ray = ray_local
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = PlacementConfig(policy_workers=2, rollout_workers=1, reward_workers=1, malloc_arena_max=arenas)
    plan = pl.plan_placement(cfg, counts=_counts(cfg, kl=False), available=pl.free_resources(min_cpu=4.0))
    pgs = pl.create_placement_groups(plan, timeout_s=30)
    try:
        actors = [a for role, rp in plan.roles.items()
                  for a in pl.create_role_actors(Probe, rp, pgs, lambda rank, role=role: {"role": role, "rank": rank})]
        seen = ray.get([a.malloc.remote() for a in actors], timeout=60)
        assert len(seen) == 4
        inherited = os.environ.get("MALLOC_ARENA_MAX")
        for env, heaps in seen:
            if arenas:
                assert (env, heaps) == ("2", 2)
            else:
                assert env == inherited
                if inherited is None:
                    assert heaps >= 5  # the main heap and one per thread
        for a in actors:
            ray.kill(a)
    finally:
        pl.remove_placement_groups(pgs)


def test_plan_sizes_actors_to_the_free_cpus():
    two_cores = {"CPU": 2.0}  # five actors at 0.5 CPU would hang forever here (shared/FACTS.md)
    plan = pl.plan_placement(PlacementConfig(), counts=_counts(PlacementConfig(), kl=True), available=two_cores)
    assert {r.num_cpus for r in plan.roles.values()} == {0.4}
    assert plan.groups[0].bundles == [{"CPU": 1.6}, {"CPU": 0.4}]  # slot 0: all four roles; slot 1: policy rank 1
    split = pl.plan_placement(PlacementConfig(mode=PlacementMode.SPLIT), counts=_counts(PlacementConfig(), kl=False),
                              available={}, nodes=[pl.Node(name=f"{g}-0", resources={"CPU": 8.0, "GPU": 1.0, g: 1000.0})
                                                   for g in ("rollout", "train")])
    assert {g.name: len(g.bundles) for g in split.groups} == {"rollout": 1, "reward": 1, "policy": 2}
    assert split.roles["policy"].num_cpus == 1.0  # capped: a CPU share is a budget, not threads
    assert split.groups[0].bundles[0]["rollout"] == pl.GROUP_RESOURCE_SLIVER  # pinned to the rollout pods
    assert split.groups[2].bundles[0]["train"] == pl.GROUP_RESOURCE_SLIVER


def test_over_asking_fails_fast_instead_of_hanging(ray_local):
    with pytest.raises(pl.PlacementError, match="GPU"):
        pl.plan_placement(PlacementConfig(gpus_per_worker=1.0), counts=_counts(PlacementConfig(), kl=False), available={"CPU": 4.0})
    plan = pl.PlacementPlan(mode=PlacementMode.SPLIT, roles={},
                            groups=[pl.PlacementGroupSpec(name="huge", bundles=[{"CPU": 64.0}])])
    with pytest.raises(pl.PlacementError, match="not ready within 2s"):
        pl.create_placement_groups(plan, timeout_s=2)


# --------------------------------------------------------------------------------------------- real runs


def _assert_released(ray, timeout_s: float = 20.0) -> None:
    """Every actor and placement group of the run was given back (Ray frees them asynchronously)."""
    import time

    deadline = time.time() + timeout_s
    while ray.available_resources().get("CPU", 0) < 4.0 and time.time() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 4.0


def _store_inputs(tmp_path: Path, tiny):
    from posttrain.artifacts import ArtifactStore

    store = ArtifactStore(tmp_path / "store")
    model = store.put("model", "sft", tiny["model_dir"], run_id="test", parents=[], config={})
    data = store.put("dataset", "addition", tiny["dataset_dir"], run_id="test", parents=[], config={})
    return store, model, data


def _run(tmp_path, tiny, cfg: RLConfig, placement: PlacementConfig, max_seq_len: int = 32, **kw):
    from posttrain.rl.run import run_rl

    store, model, data = _store_inputs(tmp_path, tiny)
    return store, run_rl(rl_cfg=cfg, reward_cfg=RewardConfig(), placement_cfg=placement, max_seq_len=max_seq_len,
                         tracking_cfg=TRACKING,
                         start_model_dir=tiny["model_dir"], dataset_dir=tiny["dataset_dir"], store_root=str(store.root),
                         run_id="test", parents=[model.id, data.id], state_dir=tmp_path / "state",
                         start_model_id=model.id, **kw), model, data


SMALL = RLConfig(steps=2, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=8, kl_coef=0.02,
                 checkpoint_every=1, remote_timeout_s=60)


@pytest.mark.timeout(900)
def test_controller_with_real_ray_actors(ray_local, tiny_sft_model, tmp_path):
    store, res, model, data = _run(tmp_path, tiny_sft_model, SMALL,
                                   PlacementConfig(policy_workers=2, rollout_workers=1, reward_workers=1))
    assert res.steps == 2 and [m.policy_version for m in res.history] == [1, 2]
    m = res.last_metrics
    assert set(m.compute_s) == {"rollout", "reward", "reference", "update"} and m.kl >= 0
    assert m.drift < SMALL.drift_threshold and 0 < m.orchestration_overhead < 1 and m.generated_tokens > 0
    manifest = store.manifest(res.model)
    assert manifest.kind == "model" and manifest.parents == [model.id, data.id]
    assert manifest.extra["policy_version"] == 2 and manifest.extra["reward"]["kind"] == "verifier"
    assert len(manifest.extra["reward"]["source_sha256"]) == 64
    assert (store.get(res.model) / "model.safetensors").exists()
    _assert_released(ray_local)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("rollout_workers", [1, 0])
def test_lora_policy_through_real_actors_serves_its_own_reference_and_stores_an_adapter(ray_local, tiny_sft_model,
                                                                                       tmp_path, rollout_workers):
    """model.lora on Ray: two policy ranks (DDP; AdamW over the adapters) with kl_coef > 0 and no reference
    actor - the policy ranks answer with adapters off; the rollout worker holds the merged weights (no drift),
    or with placement.rollout_workers 0 no rollout actor starts and each policy rank generates its share;
    each checkpoint is an adapter artifact of the start model, which evaluation opens merged."""
    from posttrain import stages
    from posttrain.config import EvalConfig, LoraConfig, ModelConfig

    model_cfg = ModelConfig(lora=LoraConfig(rank=4, alpha=8.0))
    store, res, model, data = _run(tmp_path, tiny_sft_model, replace(SMALL, lr=1e-3),
                                   PlacementConfig(policy_workers=2, rollout_workers=rollout_workers),
                                   model_cfg=model_cfg)
    assert res.steps == 2 and "reference" not in res.placement["nodes"]  # no reference actor started
    assert ("rollout" in res.placement["nodes"]) == (rollout_workers > 0)
    for m in res.history:
        assert m.compute_s["reference"] > 0 and m.kl >= 0 and m.drift < 1e-5
    assert res.history[-1].kl > 0  # the adapters moved the policy away from its base
    manifest = store.manifest(res.model)
    assert manifest.extra["adapter_of"] == model.id and model.id in manifest.parents
    assert (store.get(res.model) / "adapter_model.safetensors").exists()
    assert not (store.get(res.model) / "model.safetensors").exists()
    e = stages.evaluate(EvalConfig(num_problems=20), RewardConfig(), model=res.model, dataset=data, run_id="t",
                        store=store)
    assert 0 <= e.greedy_accuracy <= 1 and (Path(store.root) / "merged" / res.model.id / "model.safetensors").exists()
    _assert_released(ray_local)


@pytest.mark.timeout(900)
def test_on_policy_distillation_through_the_rl_stage_names_its_teacher(ray_local, tiny_sft_model, tmp_path):
    """stages.rl end to end: the teacher folder (a noised copy of the start model) is stored, started as its own
    actor, scores the samples, and the distilled model names it as a parent."""
    from posttrain import stages
    from posttrain.config import Algorithm
    from tests.files import noised_model_copy

    teacher = noised_model_copy(tiny_sft_model["model_dir"], tmp_path / "teacher", 0.05)
    store, model, data = _store_inputs(tmp_path, tiny_sft_model)
    cfg = replace(SMALL, algorithm=Algorithm.ON_POLICY_DISTILL, teacher=str(teacher), kl_coef=0.0)
    ref = stages.rl(cfg, RewardConfig(), PlacementConfig(policy_workers=2, rollout_workers=1), TRACKING,
                    max_seq_len=32, start_model=model, dataset=data, run_id="opd", store=store)
    manifest = store.manifest(ref)
    teacher_ids = [p for p in manifest.parents if p not in (model.id, data.id)]
    assert len(teacher_ids) == 1 and (store.get(store.ref(teacher_ids[0])) / "model.safetensors").exists()
    history = manifest.extra["history"]
    assert [h["policy_version"] for h in history] == [1, 2]
    assert all(h["distill/reverse_kl"] != 0 and h["compute/teacher_s"] > 0 for h in history)
    _assert_released(ray_local)


@pytest.mark.timeout(900)
def test_dapo_draws_more_prompts_through_real_actors(ray_local, tiny_sft_model, tmp_path):
    from posttrain.config import Algorithm

    cfg = replace(SMALL, algorithm=Algorithm.DAPO, kl_coef=0.0, max_extra_draws=2, overlong_buffer=2)
    _store, res, _model, _data = _run(tmp_path, tiny_sft_model, cfg, PlacementConfig(policy_workers=2, rollout_workers=1))
    assert res.steps == 2
    for m in res.history:
        kept, dropped, draws = (m.extra[f"dapo/{k}"] for k in ("kept_groups", "dropped_groups", "draws"))
        assert kept + dropped >= SMALL.prompts_per_step and 0 <= draws <= 2
        assert m.num_samples == SMALL.prompts_per_step * SMALL.samples_per_prompt * (1 + int(draws))
        assert kept == SMALL.prompts_per_step or m.extra["dapo/short_batch"] == 1
    _assert_released(ray_local)


class StaleRolloutWorker(RolloutWorker):
    """Acknowledges each new version but keeps the weights of the previous sync (a dropped transfer)."""

    def load_weights(self, state, version: int) -> WeightReport:
        held = {k: v.clone() for k, v in self.engine.model.state_dict().items()}
        super().load_weights(state, version)  # reads the transfer (shared file or object store) as usual
        if getattr(self, "_synced", False):
            self.engine.load_weights(held)  # ... then puts the previous sync's weights back
        self._synced = True
        return WeightReport(worker=self.id, version=version, checksum=self.engine.checksum())


@pytest.mark.timeout(900)
def test_stale_rollout_worker_stops_the_run(ray_local, tiny_sft_model, tmp_path):
    from posttrain.rl.weight_sync import StaleWeightsError

    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # caught at the first update that actually changes the weights (an all-equal-reward step changes nothing)
    with pytest.raises(StaleWeightsError, match=r"rollout\[0/1\].*reports version \d+ checksum"):
        _run(tmp_path, tiny_sft_model, replace(SMALL, kl_coef=0.0),
             PlacementConfig(policy_workers=1), workers={"rollout": StaleRolloutWorker})
    _assert_released(ray_local)


@pytest.mark.timeout(900)
def test_multi_turn_episodes_through_real_actors(ray_local, tiny_sft_model, tmp_path):
    """rl.environment on Ray: an environment actor (its sandboxed tool process imports the test's Retry game by
    import path) answers the rollout worker's turns; two GRPO steps train on whole episodes, the game's reward
    joins the verifier's, the episode metrics are logged and the RL model names the game's source hash."""
    from posttrain.config import EpisodeConfig

    game = "retry_env:Retry"
    cfg = replace(SMALL, kl_coef=0.0, environment=game,
                  episode=EpisodeConfig(python_path=[str(Path(__file__).parent)], max_turns=3, max_total_tokens=40))
    store, res, _model, _data = _run(tmp_path, tiny_sft_model, cfg,
                                     PlacementConfig(policy_workers=2, rollout_workers=1, environment_workers=1),
                                     max_seq_len=64)  # room for a prompt and 3 attempts with the game's answers
    assert res.steps == 2 and [m.policy_version for m in res.history] == [1, 2]
    assert max(m.extra["env/turns_mean"] for m in res.history) > 1  # wrong first attempts were answered and retried
    for m in res.history:
        assert 1 <= m.extra["env/turns_mean"] <= 3 and m.extra["env/tool_calls_mean"] == 0
        assert 0 <= m.extra["reward/env_mean"] <= 1 and "environment" in m.phase_s
        # the game's reward joined the verifier's: a sample right on the first attempt scores 1 + 1
        assert m.reward_mean <= 2.0 and m.generated_tokens > 0
    manifest = store.manifest(res.model)
    assert set(manifest.extra["environment"]) == {game} and len(manifest.extra["environment"][game]) == 64
    shown = manifest.extra["episodes"]  # the last step's first episodes, turn by turn, for the RL page
    assert len(shown) == 3 and all(e["turns"][0][0] == "policy" and e["prompt"] for e in shown)
    assert res.history[-1].phase_s["rollout"] > 0  # the game's answering time moved out of it, not all of it
    _assert_released(ray_local)
