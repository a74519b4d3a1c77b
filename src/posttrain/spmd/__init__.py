"""The SPMD training core every trainer shares - SFT, DPO, reward models, distillation, the RL policy and PPO's
critic: the process group (dist.py), DDP or FSDP2 with activation checkpointing and clipping (parallel.py), the
optimizer (optim.py), mixed precision (precision.py), model and optimizer state through
torch.distributed.checkpoint (state.py), the trimmed heap (memory.py)."""
