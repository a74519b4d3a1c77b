"""GRPO post-training on Ray: one controller, four role groups, typed handoffs.

Where to read what:
- types.py        the frozen handoffs (PromptBatch -> Trajectories -> Rewards -> ... -> WeightReport) and the
                  Protocol each role group implements
- controller.py   `Controller.step()`: the loop, top to bottom, with its dataflow diagram
- roles/          one file per role: the worker and its group (shard -> .remote -> gather -> merge)
- algorithms/     GRPO advantages and loss as pure tensor functions
- weight_sync.py  policy -> rollout version + checksum verification; rollout/policy drift check
- placement.py    placement groups per role, sized to the cluster; the one place that applies ray.remote
- state.py        checkpoints (model artifacts + resumable state) and the cursor-based prompt sampler
- metrics.py      StepMetrics, orchestration overhead, console + wandb
- run.py          `run_rl(...)`: the entry point the Flyte Ray task calls

Nothing is imported here, so `import posttrain.rl.types` stays light (no Ray, no transformers).
"""
