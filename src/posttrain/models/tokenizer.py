"""A byte-level BPE tokenizer trained on the data with `tokenizers`, saved in HF format.

Digits are split one per token before BPE (so numbers are never merged into multi-digit tokens), and text at
word boundaries (GPT-2's regex) unless `split_words` is False; special
tokens `<|pad|>`, `<|end|>` (eos), `<|system|>`, `<|user|>`, `<|assistant|>`; a ChatML-like chat template that
renders every turn as `<|role|>` newline content `<|end|>` newline, and the generation prompt as `<|assistant|>`
newline. (Measured: with the tighter `<|user|>Q<|assistant|>A<|end|>` layout a tiny model trained on addition
stayed at ~0.02 greedy accuracy for three init seeds where this layout reached 0.92 on the same weights and
data.) Training is deterministic: the same texts give byte-identical files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from posttrain.data.examples import read_examples

SPECIALS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def tokenizer_training_texts(dataset_dir: str | Path) -> Iterator[str]:
    for ex in read_examples(dataset_dir, "train"):
        for m in ex["messages"] + ex.get("chosen", []) + ex.get("rejected", []):  # pairs: both completions too
            yield m["content"]


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path, *,
                    split_words: bool = True) -> PreTrainedTokenizerFast:
    """`split_words` False lets merges cross word boundaries (data.tokenizer.split_words)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_words),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>",
                                   additional_special_tokens=SPECIALS[2:], clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast
