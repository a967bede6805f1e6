"""gateway.hf_tokenizer.Tokenizer gives what transformers' AutoTokenizer gives (transformers is
imported here only), on the real default model and on small folders built here with `tokenizers`:
a byte-level BPE and a SentencePiece-style (Metaspace) Unigram, under tokenizer_config variants."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.detokenizer import ByteLevelDetokenizer, ByteTable, IncrementalDetokenizer, make_detokenizer
from gateway.hf_tokenizer import Tokenizer
from gateway.tokenizer import encode_prompt, load_tokenizer
from pdserve.core.sampling import ValidationError

ROOT = Path(__file__).resolve().parents[2]

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Isn't it nice? We're here, they've gone!",
    "Héllo wörld, naïve café: ça déjà vu. Ελληνικά, русский. 中文文本测试，日本語のテキスト。",
    "Party 🎉🎊 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 done. def f(x):\n    return x ** 2  # 平方\n",
    "user assistant system tool hello world says something about the weather in Paris today",
]
TEXTS = [
    "Hello world", "", " ", "  two  spaces\n\ttab\nend", "Héllo 🎉 中文 👍🏽 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "a <s> b</s>c<unk> <|im_start|>user<|im_end|> <tool>x</tool>", "It 's a test , is n't it ? yes !",
    "The quick brown fox jumps over the lazy dog. " * 150,
]

# A template that uses what transformers gives templates: raise_exception, tojson's arguments, loop
# controls, namespace(), dict(), strftime_now, tools, documents, special tokens, an extra variable
# and the {% generation %} block.
TEMPLATE = """{{ bos_token }}{% set ns = namespace(n=0) %}{% if tools %}<tools>{% for t in tools %}
{{ t | tojson(indent=2, sort_keys=True) }}{{ t.function.name | tojson }}{% endfor %}</tools>
{% endif %}{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}
{{ raise_exception('unknown role ' + m.role) }}{% endif %}{% if m.role == 'system' and not loop.first %}{% continue %}
{% endif %}{% set ns.n = ns.n + 1 %}<|{{ m.role }}|>{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}
{{ c.function | tojson(separators=(',', ':')) }}{% endfor %}{% endif %}{% if 'name' in m %}[{{ m.name }}]{% endif %}
{% if m.reasoning_content %}<think>{{ m.thinking }}|{{ m.reasoning_content }}</think>{% endif %}
{% if m.content == 'STOP' %}{% break %}{% endif %}{{ eos_token }}
{% endfor %}{{ dict(a=ns.n) | tojson }} {{ documents is none }}{{ documents[0].text if documents }} {{ strftime_now('%Y') }}
{% if enable_thinking is defined %}thinking={{ enable_thinking }}{% endif %}
{% if add_generation_prompt %}{% generation %}<|assistant|>{% endgeneration %}{% endif %}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, «°C»",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo 🎉"},
     {"role": "system", "content": "skipped"}, {"role": "assistant", "content": "Ok", "tool_calls": None}],
    [{"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
     {"role": "tool", "content": "12", "tool_call_id": "c1", "name": "get_weather"},
     {"role": "assistant", "content": "12 °C", "reasoning_content": "easy"}],
    [{"role": "user", "content": "STOP"}, {"role": "user", "content": "never shown"}],
]


# ---------------------------------------------------------------------- tokenizer folders


def _byte_level_bpe() -> Any:
    from tokenizers import Tokenizer as Raw
    from tokenizers import decoders, models, pre_tokenizers, trainers

    raw = Raw(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    raw.train_from_iterator(CORPUS * 4, trainer)
    return raw


def _metaspace_unigram() -> Any:
    from tokenizers import Tokenizer as Raw
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    raw = Raw(models.Unigram())
    raw.normalizer = normalizers.NFKC()
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>",
                                      show_progress=False)
    raw.train_from_iterator(CORPUS * 4, trainer)
    return raw


def _with_bos_eos(raw: Any) -> Any:
    from tokenizers import processors

    raw.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>",
        special_tokens=[("<s>", raw.token_to_id("<s>")), ("</s>", raw.token_to_id("</s>"))])
    return raw


def _added(content: str, special: bool = True, **flags: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": not special, "rstrip": False, "single_word": False,
            "special": special, **flags}


def _typed(content: str, **flags: bool) -> dict:
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True, "rstrip": False,
            "single_word": False, **flags}


BASE = {"tokenizer_class": "TokenizersBackend", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# name -> (backend, tokenizer_config.json, other files)
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "bpe": ("bpe", {**BASE, "chat_template": TEMPLATE}, {}),
    "bpe-add-bos-eos": ("bpe", {**BASE, "add_bos_token": True, "add_eos_token": True, "chat_template": TEMPLATE}, {}),
    "bpe-post-processor-no-add-bos": ("bpe+bos", {**BASE, "add_bos_token": False, "chat_template": TEMPLATE}, {}),
    "bpe-v4-class": ("bpe+bos", {**BASE, "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "</s>",
                                 "chat_template": TEMPLATE}, {}),
    "bpe-added-token-dicts": ("bpe", {
        "tokenizer_class": "TokenizersBackend", "bos_token": _typed("<|begin|>"), "eos_token": _typed("<|end|>", special=True),
        "unk_token": _typed("<unk>"), "pad_token": _typed("<|pad|>", normalized=False), "chat_template": TEMPLATE}, {}),
    "bpe-extra-special-and-model-tokens": ("bpe", {
        **BASE, "additional_special_tokens": ["<tool>", "</tool>", "<s>"], "image_token": "<image>",
        "audio_token": _typed("<audio>"), "chat_template": TEMPLATE}, {}),
    "bpe-added-tokens-decoder": ("bpe", {
        **BASE, "added_tokens_decoder": {"0": _added("<unk>"), "1": _added("<s>"), "2": _added("</s>"),
                                         "400": _added("<|im_start|>"), "401": _added("<|im_end|>"),
                                         "402": _added("<tool>", special=False), "3": _added("!", special=True)},
        "pad_token": "<|im_end|>", "chat_template": TEMPLATE}, {}),
    "bpe-template-list": ("bpe", {**BASE, "chat_template": [
        {"name": "default", "template": TEMPLATE},
        {"name": "tool_use", "template": "TOOLS {{ tools | tojson }}" + TEMPLATE}]}, {}),
    "bpe-template-file": ("bpe", {**BASE, "chat_template": "ignored {{ messages }}"},
                          {"chat_template.jinja": TEMPLATE}),
    "bpe-template-dir": ("bpe", {**BASE}, {"chat_template.jinja": TEMPLATE,
                                           "additional_chat_templates/tool_use.jinja": "T {{ tools | tojson }}"}),
    "bpe-no-template-split-special": ("bpe", {**BASE, "split_special_tokens": True}, {}),
    "bpe-cleanup-ignored": ("bpe", {**BASE, "clean_up_tokenization_spaces": True, "chat_template": TEMPLATE}, {}),
    "bpe-legacy-special-tokens-map": ("bpe+bos", {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}, {
        "special_tokens_map.json": json.dumps({"bos_token": {"content": "<s>", "lstrip": False, "normalized": False,
                                                             "rstrip": False, "single_word": False},
                                               "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<|pad|>"})}),
    "metaspace": ("unigram", {**BASE, "chat_template": TEMPLATE}, {}),
    "metaspace-cleanup-bos": ("unigram+bos", {**BASE, "clean_up_tokenization_spaces": True, "add_bos_token": False,
                                              "additional_special_tokens": ["<sep>"], "chat_template": TEMPLATE}, {}),
    "metaspace-no-config": ("unigram", {}, {}),
}


def _build(folder: Path, variant: str) -> Path:
    kind, config, files = VARIANTS[variant]
    raw = {"bpe": _byte_level_bpe, "unigram": _metaspace_unigram}[kind.split("+")[0]]()
    if kind.endswith("+bos"):
        _with_bos_eos(raw)
    folder.mkdir(parents=True)
    raw.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if config:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module", params=["default-model", *VARIANTS])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         default_model_dir: Path) -> tuple[Tokenizer, Any]:
    """(ours, transformers') for one folder."""
    from transformers import AutoTokenizer

    if request.param == "default-model":
        folder = default_model_dir
    else:
        folder = _build(tmp_path_factory.mktemp("tok") / request.param, request.param)
    return Tokenizer.from_dir(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


# ---------------------------------------------------------------------- equality with transformers


def test_vocabulary(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    assert len(ours) == len(hf)
    assert [ours.id_to_token(i) for i in range(len(ours))] == hf.convert_ids_to_tokens(list(range(len(hf))))
    assert ours.id_to_token(len(hf)) is None
    assert ours.all_special_ids == hf.all_special_ids
    assert ours.special_tokens == hf.special_tokens_map
    assert ours.added_special_ids == {i for i, t in hf.added_tokens_decoder.items() if t.special}
    for name in ("bos", "eos", "unk", "pad"):
        assert ours.special_tokens.get(f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert ours.special_token_id(f"{name}_token") == getattr(hf, f"{name}_token_id"), name


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode(pair: tuple[Tokenizer, Any], add_special_tokens: bool) -> None:
    ours, hf = pair
    for text in [*TEXTS, *CORPUS]:
        assert ours.encode(text, add_special_tokens=add_special_tokens) == \
            hf(text, add_special_tokens=add_special_tokens)["input_ids"], text[:40]
        assert hf.encode(text, add_special_tokens=add_special_tokens) == \
            ours.encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode(pair: tuple[Tokenizer, Any], skip_special_tokens: bool) -> None:
    ours, hf = pair
    rng = random.Random(3)
    cases = [hf.encode(t) for t in [*TEXTS, *CORPUS]] + [[rng.randrange(len(hf)) for _ in range(rng.randrange(0, 40))]
                                                         for _ in range(150)]
    cases += [[i] for i in range(0, len(hf), max(1, len(hf) // 500))] + [sorted(hf.all_special_ids)]
    for ids in cases:
        assert ours.decode(ids, skip_special_tokens=skip_special_tokens) == \
            hf.decode(ids, skip_special_tokens=skip_special_tokens), ids
        for cleanup in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=cleanup) == \
                hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=cleanup), ids


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_chat(pair: tuple[Tokenizer, Any], add_generation_prompt: bool) -> None:
    ours, hf = pair
    if hf.chat_template is None:
        assert ours.chat_template is None and ours.chat_templates == {}
        with pytest.raises(ValueError):
            ours.render_chat(CONVERSATIONS[0])
        return
    assert ours.chat_template == hf.get_chat_template()
    for tools in (None, TOOLS):
        for kwargs in ({}, {"enable_thinking": False}, {"bos_token": "[BOS]", "extra": {"k": [1, 2]}},
                       {"documents": [{"title": "T", "text": "doc"}]}):
            for messages in CONVERSATIONS:
                want = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                              tokenize=False, **kwargs)
                assert ours.render_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        **kwargs) == want
                if TEMPLATE in (ours.chat_template or ""):
                    ids = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                 tokenize=True, return_dict=False, **kwargs)
                    assert ours.encode(want, add_special_tokens=False) == ids


def test_template_raise_exception(pair: tuple[Tokenizer, Any]) -> None:
    import jinja2

    ours, hf = pair
    if hf.chat_template is None or TEMPLATE not in hf.get_chat_template():
        return  # the default model's template, or none: nothing raises
    bad = [{"role": "robot", "content": "beep"}]
    with pytest.raises(jinja2.TemplateError) as theirs:
        hf.apply_chat_template(bad, tokenize=False)
    with pytest.raises(jinja2.TemplateError) as mine:
        ours.render_chat(bad)
    assert str(mine.value) == str(theirs.value) == "unknown role robot"


def test_template_sandbox(pair: tuple[Tokenizer, Any]) -> None:
    import jinja2.exceptions

    ours, hf = pair
    for template in ("{% set ns = namespace(_x=1) %}", "{% set ns = namespace() %}{% set ns._x = 1 %}",
                     "{{ ''.__class__ }}{{ messages.__class__.__mro__ }}", "{{ dict.__class__ }}"):
        try:
            want: Any = hf.apply_chat_template(CONVERSATIONS[0], chat_template=template, tokenize=False)
        except jinja2.exceptions.SecurityError:
            want = jinja2.exceptions.SecurityError
        saved = ours.chat_template
        ours.chat_template = template
        try:
            if want is jinja2.exceptions.SecurityError:
                with pytest.raises(jinja2.exceptions.SecurityError):
                    ours.render_chat(CONVERSATIONS[0])
            else:
                assert ours.render_chat(CONVERSATIONS[0]) == want
        finally:
            ours.chat_template = saved


# ---------------------------------------------------------------------- detokenizers on these folders


def test_detokenizers_match_decode(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    table = ByteTable.build(ours)
    assert (table is not None) == (type(ours.backend.decoder).__name__ == "ByteLevel")
    rng = random.Random(5)
    for _ in range(60):
        ids = [rng.randrange(len(hf)) for _ in range(rng.randrange(1, 30))]
        for skip in (True, False):
            if table is not None:
                detok = ByteLevelDetokenizer(table, skip_special_tokens=skip)
                out = "".join([detok.add(ids[i:i + 2]) for i in range(0, len(ids), 2)]) + detok.flush()
                assert out == hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    prompt = hf.encode("Hello world, how are you?", add_special_tokens=False)
    for text in CORPUS:
        ids = hf.encode(text, add_special_tokens=False)
        detok = make_detokenizer(ours, prompt, table)
        assert isinstance(detok, IncrementalDetokenizer) == (table is None)  # Metaspace: the windowed decode
        out = "".join(detok.add([i]) for i in ids) + detok.flush()
        # Streaming continues the prompt: a leading word keeps its space after the prompt's text.
        want = hf.decode(prompt + ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)[
            len(hf.decode(prompt, skip_special_tokens=True, clean_up_tokenization_spaces=False)):]
        assert out == want, text[:30]


# ---------------------------------------------------------------------- loading, gateway use


def test_refuses_a_folder_without_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as info:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(info.value) and "save_pretrained" in str(info.value)
    with pytest.raises(OSError):
        load_tokenizer(tmp_path / "HuggingFaceTB" / "nothing-here")  # a hub-like name is never fetched


def test_chat_template_is_settable(default_model_dir: Path) -> None:
    tok = load_tokenizer(default_model_dir)
    assert "<|im_start|>" in (tok.chat_template or "")
    tok.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "[user] hi"
    assert tok.chat_templates == {"default": tok.chat_template}
    tok.chat_template = None
    assert tok.chat_template is None
    with pytest.raises(ValueError):
        tok.render_chat([{"role": "user", "content": "hi"}])


def test_template_errors_become_validation_errors(default_model_dir: Path) -> None:
    tok = load_tokenizer(default_model_dir)
    tok.chat_template = "{{ raise_exception('no ' + messages[0].role + ' here') }}"
    with pytest.raises(ValidationError) as info:
        encode_prompt(tok, messages=[("user", "x")])
    assert info.value.field == "messages" and "no user here" in str(info.value)
    tok.chat_template = "{% for %}"
    with pytest.raises(ValidationError) as info:
        encode_prompt(tok, messages=[("user", "x")])
    assert info.value.field == "messages"


def test_gateway_builds_without_torch_or_transformers(default_model_dir: Path) -> None:
    code = (
        "import sys, time\n"
        "t0 = time.perf_counter()\n"
        "import gateway.__main__ as m\n"
        f"a = m.parser().parse_args(['--port', '0', '--model', {str(default_model_dir)!r}, '--colocated', '127.0.0.1:1'])\n"
        "m.build(a)\n"
        "took = time.perf_counter() - t0\n"
        "print(sorted(n for n in ('torch', 'transformers') if n in sys.modules), f'{took:.2f}')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded, took = out.stdout.split("]")
    print(f"gateway import + parser + build: {float(took):.2f} s")
    assert loaded == "[", out.stdout


# ---------------------------------------------------------------------- what the variants show


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    root = tmp_path_factory.mktemp("variants")
    return {name: Tokenizer.from_dir(_build(root / name, name)) for name in VARIANTS}


def test_what_transformers_does_with_the_config(built: dict[str, Tokenizer]) -> None:
    """The behaviours test_encode/test_render_chat/test_decode check against transformers, spelled out."""
    hello = built["bpe"].encode("Hello world", add_special_tokens=False)
    # add_bos_token / add_eos_token are ignored beside a tokenizer.json: its post-processor decides.
    assert built["bpe-add-bos-eos"].encode("Hello world") == hello
    bos_eos = built["bpe-post-processor-no-add-bos"]
    assert bos_eos.encode("Hello world") == [1, *hello, 2] and bos_eos.encode("Hello world", add_special_tokens=False) == hello
    # Special tokens the vocabulary lacks are added (as AddedToken dicts too), and are special.
    dicts = built["bpe-added-token-dicts"]
    n = len(built["bpe"])
    assert len(dicts) == n + 3 and dicts.special_tokens["bos_token"] == "<|begin|>" and dicts.special_token_id("pad_token") == n + 2
    assert {n, n + 1, n + 2} <= dicts.added_special_ids and dicts.decode([n, 5, n + 1], skip_special_tokens=True) == \
        dicts.decode([5])
    extra = built["bpe-extra-special-and-model-tokens"]
    assert extra.special_tokens["image_token"] == "<image>" and extra.special_tokens["audio_token"] == "<audio>"
    assert [extra.id_to_token(i) for i in extra.all_special_ids] == \
        ["<s>", "</s>", "<unk>", "<audio>", "<image>", "<tool>", "</tool>"]
    decoder = built["bpe-added-tokens-decoder"]
    tool = decoder.token_to_id("<tool>")  # the next free id, whatever the config said
    assert tool == n + 2 and decoder.encode("<tool>x") == [tool, *decoder.encode("x")]
    bang = decoder.token_to_id("!")  # a token of the vocabulary, made a special added token
    assert bang < n and decoder.encode("a!b") == [*decoder.encode("a"), bang, *decoder.encode("b")]
    assert tool not in decoder.added_special_ids and bang in decoder.added_special_ids  # as the config's flags say
    assert decoder.decode(decoder.encode("Hi!"), skip_special_tokens=True) == "Hi"
    # Templates: a list by name ("tool_use" when tools are given), a chat_template.jinja over the config's.
    listed = built["bpe-template-list"]
    assert listed.chat_template == TEMPLATE and listed.render_chat(CONVERSATIONS[0], tools=TOOLS).startswith("TOOLS [")
    assert not listed.render_chat(CONVERSATIONS[0]).startswith("TOOLS")
    assert built["bpe-template-file"].chat_template == TEMPLATE
    assert built["bpe-template-dir"].render_chat(CONVERSATIONS[0], tools=TOOLS).startswith("T [")
    # split_special_tokens: special tokens in the text are encoded as text.
    assert 1 not in built["bpe-no-template-split-special"].encode("a <s> b")
    # Cleanup of tokenization spaces: as configured, never for BPE.
    text = "It 's a test , is n't it ?"
    for name, cleaned in (("metaspace-cleanup-bos", True), ("metaspace", False), ("bpe-cleanup-ignored", False)):
        tok = built[name]
        out = tok.decode(tok.encode(text, add_special_tokens=False))
        assert (out == "It's a test, isn't it?") is cleaned, (name, out)
    assert built["metaspace-cleanup-bos"].encode("a")[0] == 1


def test_chat_template_json_is_read_when_nothing_else_gives_one(tmp_path: Path) -> None:
    # A processor's chat_template.json: AutoTokenizer ignores it; the gateway takes it rather than have none.
    folder = _build(tmp_path / "f", "bpe-no-template-split-special")
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages[0].content }}!"}))
    assert Tokenizer.from_dir(folder).render_chat([{"role": "user", "content": "hi"}]) == "hi!"
