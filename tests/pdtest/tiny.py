"""A word-level tokenizer for tiny random models, so a gateway can run on them offline."""

from __future__ import annotations


def word_tokenizer(folder, vocab_size: int) -> None:
    """Save a word-level tokenizer "t0 t1 ..." (unk t0, bos t1, eos t2) into folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(folder)
