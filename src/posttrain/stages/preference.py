"""The preference stages: pairs from a model's own samples (posttrain.eval.pairs) and a reward model's pairwise
evaluation (posttrain.eval.pairwise), each cached on its inputs like every stage in `posttrain.stages`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from posttrain.artifacts import ArtifactRef, ArtifactStore
from posttrain.config import PairsConfig, RewardConfig, to_dict
from posttrain.models.folders import model_folder
from posttrain.stages.support import source_digest


def pairs(cfg: PairsConfig, reward: RewardConfig, *, model: ArtifactRef, dataset: ArtifactRef, run_id: str,
          store: ArtifactStore | None = None) -> ArtifactRef:
    """Preference pairs from `model`'s own samples of the dataset's prompts (posttrain.eval.pairs): a `dataset`
    artifact of preference examples whose parents are the model and the prompts."""
    from posttrain.eval.pairs import make_pairs

    store = store or ArtifactStore()
    reward = reward.function_only()  # pairs are scored by the function or verifier alone
    key = store.cache_key("pairs", to_dict(cfg), to_dict(reward), model.id, dataset.id,
                          source_digest("eval", "models", "rewards", "data/verifiers.py"))
    hit = store.cache_get(key)
    if hit is not None:
        print(f"pairs: cache hit -> dataset {hit.short}")
        return hit
    with tempfile.TemporaryDirectory(prefix="posttrain-pairs-") as tmp:
        info = make_pairs(model_folder(store, model), store.get(dataset), cfg, reward, Path(tmp) / "pairs")
        ref = store.put("dataset", f"pairs-{dataset.name}", Path(tmp) / "pairs", run_id=run_id,
                        parents=[model.id, dataset.id], config={"pairs": to_dict(cfg), "reward": to_dict(reward)},
                        metrics={"num_train": info.num_train, "num_eval": info.num_eval,
                                 "all_correct": info.all_correct, "all_wrong": info.all_wrong,
                                 "reward_failures": info.reward_failures},
                        extra={"schema": "preference", "stage": "pairs", "source_model": model.id})
    store.cache_put(key, ref)
    print(f"pairs: dataset {ref.short} ({info.num_train} train / {info.num_eval} eval pairs from model {model.short})")
    return ref


def evaluate_reward_model(*, reward_model: ArtifactRef, pairs: ArtifactRef, run_id: str, num_pairs: int = 0,
                          store: ArtifactStore | None = None) -> ArtifactRef:
    """Pairwise accuracy and score distributions of a reward model on the eval pairs of a preference dataset
    (posttrain.eval.pairwise) -> an `eval` artifact whose parents are the reward model and the pairs."""
    from posttrain.eval.pairwise import evaluate_pairs

    store = store or ArtifactStore()
    key = store.cache_key("eval_pairs", num_pairs, reward_model.id, pairs.id,
                          source_digest("eval/pairwise.py", "models", "data/examples.py"))
    ref = store.cache_get(key)
    if ref is None:
        result = evaluate_pairs(model_folder(store, reward_model), store.get(pairs), num_pairs=num_pairs)
        with tempfile.TemporaryDirectory(prefix="posttrain-eval-pairs-") as tmp:
            (Path(tmp) / "pairwise.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
            metrics = {"pairwise_accuracy": result["pairwise_accuracy"], "num_pairs": result["num_pairs"],
                       "chosen_mean": result["chosen"]["mean"], "rejected_mean": result["rejected"]["mean"],
                       "margin_mean": result["margin_mean"]}
            ref = store.put("eval", f"eval-{reward_model.name}", Path(tmp), run_id=run_id,
                            parents=[reward_model.id, pairs.id],
                            config={"num_pairs": num_pairs, "dataset_id": pairs.id, "model_id": reward_model.id},
                            metrics=metrics, extra={"stage": "eval_pairs"})
        store.cache_put(key, ref)
    m = store.manifest(ref.id).metrics
    print(f"eval {ref.short} of reward model {reward_model.short}: pairwise accuracy {m['pairwise_accuracy']:.3f} on "
          f"{m['num_pairs']} held-out pairs (mean score chosen {m['chosen_mean']:+.3f}, rejected "
          f"{m['rejected_mean']:+.3f})")
    return ref
