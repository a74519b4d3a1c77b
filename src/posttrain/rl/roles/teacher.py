"""Teacher role (on-policy distillation): a frozen teacher model's per-token log-probs of the student's samples,
in the sampling distribution the student drew them from (temperature, rl.top_k, rl.top_p), as the reference
role computes them. `rl.teacher` names the teacher: an artifact id, a folder or `channel:NAME`. It is stored and
put in the distilled model's lineage (registry `reads_models`).

The teacher must tokenize exactly as the student does, because log-probs are compared token by token. The
worker checks the two vocabularies when it starts, before any step, and names both folders when they differ.
"""

from __future__ import annotations

from posttrain.config import ModelConfig, RLConfig
from posttrain.models.io import load_tokenizer
from posttrain.rl.roles.reference import ReferenceGroup, ReferenceWorker


class TeacherVocabularyError(ValueError):
    """The teacher's tokenizer differs from the student's."""


def check_same_vocabulary(teacher_dir: str, student_dir: str) -> None:
    t, s = load_tokenizer(teacher_dir), load_tokenizer(student_dir)
    tv, sv = t.get_vocab(), s.get_vocab()
    if tv != sv:
        only_t, only_s = sorted(set(tv) - set(sv))[:5], sorted(set(sv) - set(tv))[:5]
        moved = sorted(k for k in set(tv) & set(sv) if tv[k] != sv[k])[:5]
        raise TeacherVocabularyError(
            f"rl.teacher: {teacher_dir} tokenizes differently from the student ({student_dir}): vocabularies of "
            f"{len(tv)} and {len(sv)} tokens; only the teacher's: {only_t}, only the student's: {only_s}, other "
            f"ids: {moved}. On-policy distillation compares log-probs token by token, so both need one tokenizer")


class TeacherWorker(ReferenceWorker):
    role = "teacher"

    def __init__(self, teacher_dir: str, student_dir: str, rank: int, world_size: int, cfg: RLConfig | None = None,
                 model_cfg: ModelConfig | None = None, threads: int = 1):
        check_same_vocabulary(teacher_dir, student_dir)  # before the model is loaded
        super().__init__(teacher_dir, rank, world_size, cfg, model_cfg, threads)


class TeacherGroup(ReferenceGroup):
    role = "teacher"
