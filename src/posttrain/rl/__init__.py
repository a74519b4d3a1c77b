"""On-policy RL on Ray (GRPO, PPO): one controller, role groups declared once, algorithms as loops, typed handoffs.

Where to read what:
- types.py        the frozen handoffs (PromptBatch -> Trajectories -> Rewards -> ... -> WeightReport)
- roles/registry.py  every role declared once (worker, group, trains, KubeRay group, count)
- loops/          one file per algorithm: its step, top to bottom (grpo.py, ppo.py); common.py: the shared
                  phases with their gates
- controller.py   `Controller`: resume, the algorithm's step, weight sync, metrics, checkpoints
- roles/          one file per role: the worker and its group (shard -> .remote -> gather -> merge); spmd.py
                  the training roles' shared SPMD machinery
- algorithms/     GRPO's and PPO's advantages and losses as pure tensor functions
- weight_sync.py  policy -> rollout version + checksum verification; rollout/policy drift check
- placement.py    placement groups per role, sized to the cluster; the one place that applies ray.remote
- state.py        checkpoints (model artifacts + resumable state) and the cursor-based prompt sampler
- metrics.py      StepMetrics, orchestration overhead, console + wandb
- model_inputs.py the models roles read through settings (reward.models, rl.critic_init), stored for lineage
- run.py          `run_rl(...)`: the entry point the Flyte Ray task calls

Nothing is imported here, so `import posttrain.rl.types` stays light (no Ray, no transformers).
"""
