"""Gateway text pieces: prompt encoding, incremental detokenization, stop strings."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.detokenizer import ByteLevelDetokenizer, ByteTable, IncrementalDetokenizer, make_detokenizer
from gateway.hf_tokenizer import Tokenizer
from gateway.stops import StopChecker
from gateway.tokenizer import encode_prompt, load_tokenizer
from pdserve.core.sampling import ValidationError

SAMPLES = [
    "Héllo wörld, naïve café: ça déjà vu. Ελληνικά, русский.",
    "中文文本测试，日本語のテキスト、한국어 텍스트。",
    "Party 🎉🎊 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👍🏽 done.",
    "mixed: a😀b中c\u00e9d  two  spaces\n\ttab\nend 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "def f(x):\n    return x ** 2  # 平方\n",
]


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Tokenizer:
    return load_tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def chat_prompt(tok: Any) -> list[int]:
    return encode_prompt(tok, messages=[("user", "Say something.")])


def _stream(detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    deltas = [detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.flush())
    return deltas


# ---------------------------------------------------------------- detokenizer


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("chunk", [1, 3])
def test_deltas_concatenate_to_full_decode(tok: Any, chat_prompt: list[int], text: str, chunk: int) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    deltas = _stream(IncrementalDetokenizer(tok, chat_prompt), ids, chunk)
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("text", SAMPLES)
def test_rust_decode_path_gives_the_same_deltas(tok: Any, chat_prompt: list[int], text: str,
                                                default_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(default_model_dir), local_files_only=True)
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    fast = IncrementalDetokenizer(tok, chat_prompt)
    slow = IncrementalDetokenizer(tok, chat_prompt)
    # through transformers' decode, as before the gateway stopped using transformers
    slow._backend_decode = lambda ids, skip_special_tokens: hf.decode(  # type: ignore[method-assign]
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
    assert _stream(fast, ids) == _stream(slow, ids)


def test_samples_really_split_characters(tok: Any) -> None:
    # Guards the test above: without tokens that hold partial characters it proves nothing.
    ids = tok.encode(SAMPLES[2], add_special_tokens=False)
    assert any(tok.decode([i]) == "\ufffd" for i in ids)


def test_multibyte_character_emitted_once_complete(tok: Any) -> None:
    ids = tok.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tok, tok.encode("Hi ", add_special_tokens=False))
    deltas = [detok.add([i]) for i in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == "🎉"
    assert detok.pending_tokens == 0


def test_empty_prompt(tok: Any) -> None:
    ids = tok.encode(SAMPLES[0], add_special_tokens=False)
    assert "".join(_stream(IncrementalDetokenizer(tok, []), ids)) == SAMPLES[0]


def test_special_tokens_skipped_by_default(tok: Any) -> None:
    ids = tok.encode("Paris.", add_special_tokens=False) + [tok.eos_token_id]
    assert "".join(_stream(IncrementalDetokenizer(tok, [1]), ids)) == "Paris."
    kept = "".join(_stream(IncrementalDetokenizer(tok, [1], skip_special_tokens=False), ids))
    assert kept == "Paris." + tok.eos_token


def test_cost_per_token_is_bounded(tok: Any, chat_prompt: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    ids = tok.encode(" ".join(SAMPLES) * 6, add_special_tokens=False)
    assert len(ids) > 500
    sizes: list[int] = []
    detok = IncrementalDetokenizer(tok, chat_prompt * 20)
    real = detok._decode

    def spy(token_ids: list[int]) -> str:
        sizes.append(len(token_ids))
        return real(token_ids)

    monkeypatch.setattr(detok, "_decode", spy)
    out = "".join(_stream(detok, ids))
    monkeypatch.undo()
    assert out == tok.decode(ids)
    assert max(sizes) <= 16, max(sizes)
    assert len(detok._ids) < 100  # memory stays O(window) too


def test_invalid_bytes_do_not_stall_forever(tok: Any) -> None:
    lead_byte = tok.encode("🎉", add_special_tokens=False)[0]  # a lone UTF-8 lead byte
    detok = IncrementalDetokenizer(tok, [])
    out = [detok.add([lead_byte]) for _ in range(40)]
    assert detok.pending_tokens < 8
    assert "\ufffd" in "".join(out)  # the full text has U+FFFD too: it is sent, not hidden


def test_leading_space_tokenizer() -> None:
    # SentencePiece-style: decoding drops the space of the first token ("▁world" -> "world"),
    # so decoding token by token would glue words together.
    from tokenizers import Tokenizer as Raw
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, ",": 3, "▁how": 4, "▁are": 5, "▁you": 6, "?": 7}
    raw = Raw(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    sp = Tokenizer(raw, {"unk_token": "<unk>"})
    ids = [1, 2, 3, 4, 5, 6, 7]
    assert sp.decode([2]) == "world"  # the trap
    deltas = _stream(IncrementalDetokenizer(sp, [1]), ids[1:])
    assert "".join(deltas) == " world, how are you?"
    assert deltas[0] == " world"


# ---------------------------------------------------------------- byte-level fast path


@pytest.fixture(scope="module")
def table(tok: Any) -> ByteTable:
    built = ByteTable.build(tok)
    assert built is not None  # the default model's decoder is ByteLevel
    return built


def test_byte_table_only_for_byte_level_decoders() -> None:
    from tokenizers import Tokenizer as Raw
    from tokenizers import decoders, models

    raw = Raw(models.WordLevel({"<unk>": 0, "▁a": 1}, unk_token="<unk>"))
    raw.decoder = decoders.Metaspace()
    sp = Tokenizer(raw, {"unk_token": "<unk>"})
    assert ByteTable.build(sp) is None
    assert isinstance(make_detokenizer(sp, [1], None), IncrementalDetokenizer)


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("chunk", [1, 3])
def test_byte_level_deltas_concatenate_to_full_decode(tok: Any, table: ByteTable, text: str, chunk: int) -> None:
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    deltas = _stream(ByteLevelDetokenizer(table), ids, chunk)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)  # a character is only sent once complete


def test_byte_level_matches_full_decode_on_random_ids(tok: Any, table: ByteTable) -> None:
    # Random ids over the whole vocabulary: special and added tokens, lone and invalid UTF-8 bytes.
    rng = random.Random(8)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            out = "".join(_stream(ByteLevelDetokenizer(table, skip_special_tokens=skip), ids, rng.choice([1, 2, 5])))
            assert out == tok.decode(ids, skip_special_tokens=skip), ids


def test_byte_level_holds_a_split_character_then_sends_it(tok: Any, table: ByteTable) -> None:
    ids = tok.encode("a🎉", add_special_tokens=False)
    detok = ByteLevelDetokenizer(table)
    deltas = [detok.add([i]) for i in ids]
    assert "".join(deltas) == "a🎉" and deltas[-1].endswith("🎉") and len(deltas) > 2
    assert detok.pending_tokens == 0
    lead = tok.encode("🎉", add_special_tokens=False)[0]
    assert detok.add([lead]) == "" and detok.pending_tokens == 1
    assert detok.flush() == "\ufffd"  # the end: held bytes are sent, as a full decode shows them


# ---------------------------------------------------------------- stop strings


def _feed_all(checker: StopChecker, deltas: list[str]) -> tuple[str, str | None]:
    out, matched = [], None
    for d in deltas:
        text, stop = checker.feed(d)
        out.append(text)
        matched = matched or stop
    out.append(checker.flush())
    return "".join(out), matched


def test_stop_split_across_deltas() -> None:
    checker = StopChecker(("\nUser:",))
    assert checker.feed("Hello\nUs") == ("Hello", None)
    assert checker.feed("er") == ("", None)
    assert checker.feed(": more") == ("", "\nUser:")
    assert checker.matched == "\nUser:"
    assert checker.feed("later") == ("", None)
    assert checker.flush() == ""


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_earliest_stop_wins_regardless_of_chunking(chunk: int) -> None:
    text = "one two three four"
    deltas = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    assert _feed_all(StopChecker(("four", "two", "three")), deltas) == ("one ", "two")
    # "o t" completes before "two three" does, though it starts later
    assert _feed_all(StopChecker(("two three", "o t")), deltas) == ("one tw", "o t")
    # among stops completing at the same character, the earliest start wins
    assert _feed_all(StopChecker(("ee", "three")), deltas) == ("one two ", "three")
    assert _feed_all(StopChecker(("wo", "two")), deltas) == ("one ", "two")


def test_partial_match_that_is_not_a_stop_is_emitted() -> None:
    checker = StopChecker(("STOP",))
    assert checker.feed("go ST") == ("go ", None)
    assert checker.feed("O") == ("", None)
    assert checker.feed("P") == ("", "STOP")
    checker = StopChecker(("STOP",))
    assert checker.feed("go STO") == ("go ", None)
    assert checker.feed("RM") == ("STORM", None)


def test_overlapping_prefix_holds_only_what_is_needed() -> None:
    checker = StopChecker(("aab",))
    assert checker.feed("xaa") == ("x", None)
    assert checker.feed("a") == ("a", None)  # "aaa": only the last "aa" can still start "aab"
    assert checker.feed("b!") == ("", "aab")


def test_flush_returns_held_text() -> None:
    checker = StopChecker(("</s>", "###"))
    assert checker.feed("end <") == ("end ", None)
    assert checker.feed("/") == ("", None)
    assert checker.flush() == "</"


def test_no_stops_passes_through() -> None:
    checker = StopChecker(())
    assert checker.feed("abc") == ("abc", None)
    assert checker.flush() == ""
    with pytest.raises(ValueError):
        StopChecker(("",))


# ---------------------------------------------------------------- prompt encoding


def test_encode_text(tok: Any) -> None:
    assert encode_prompt(tok, text="Hello world") == tok.encode("Hello world", add_special_tokens=True)


def test_encode_messages_forms(tok: Any) -> None:
    expected = tok.render_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], add_generation_prompt=True,
    )
    assert expected.endswith("<|im_start|>assistant\n")
    want = tok.encode(expected, add_special_tokens=False)
    assert encode_prompt(tok, messages=[("system", "Be brief."), ("user", "Hi")]) == want
    as_dicts = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert encode_prompt(tok, messages=as_dicts) == want
    as_objs = [SimpleNamespace(role="system", content="Be brief."), SimpleNamespace(role="user", content="Hi")]
    assert encode_prompt(tok, messages=as_objs) == want
    assert tok.decode(want).count("<|im_start|>") == 3  # no doubled special tokens


def test_encode_token_ids(tok: Any) -> None:
    assert encode_prompt(tok, token_ids=(5, 6, 7)) == [5, 6, 7]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "prompt"),
        ({"text": "a", "token_ids": [1]}, "prompt"),
        ({"text": ""}, "prompt"),
        ({"messages": []}, "prompt"),
        ({"token_ids": []}, "prompt"),
        ({"token_ids": [1, "2"]}, "prompt_token_ids"),
        ({"token_ids": [1, True]}, "prompt_token_ids"),
        ({"messages": [("user", "hi"), ("robot", "beep")]}, "messages[1].role"),
        ({"messages": [("user", None)]}, "messages[0].content"),
        ({"messages": [("user",)]}, "messages[0]"),
        ({"messages": "hello"}, "messages"),
    ],
)
def test_encode_errors(tok: Any, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        encode_prompt(tok, **kwargs)
    assert info.value.field == field


def test_messages_without_chat_template(default_model_dir: Path) -> None:
    bare = load_tokenizer(default_model_dir)
    bare.chat_template = None
    with pytest.raises(ValidationError) as info:
        encode_prompt(bare, messages=[("user", "hi")])
    assert info.value.field == "messages"
    assert encode_prompt(bare, text="hi")


def test_load_tokenizer_is_local_only(tmp_path: Path) -> None:
    with pytest.raises((OSError, ValueError)):
        load_tokenizer(tmp_path / "HuggingFaceTB" / "nothing-here")
