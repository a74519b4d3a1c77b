"""posttrain: Flyte-native LLM post-training (data prep -> SFT -> RL -> eval) with artifact lineage."""

__version__ = "0.1.0"
