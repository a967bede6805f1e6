"""A Hugging Face model folder's tokenizer without transformers: the Rust `tokenizers` library over
tokenizer.json, set up from tokenizer_config.json as transformers 5's AutoTokenizer sets up its
generic fast tokenizer (TokenizersBackend), and the chat template rendered with jinja2 as its
apply_chat_template renders it. Importing transformers costs seconds of CPU; this costs ~0.3 s.

What follows transformers (tests/gateway/test_hf_tokenizer.py compares each with AutoTokenizer):
- encoding: tokenizer.json's own post-processor adds BOS/EOS; tokenizer_config.json's
  add_bos_token / add_eos_token are ignored when tokenizer.json exists (transformers 5 drops them
  then); a tokenizer.json without a post-processor gets transformers' plain "$A" template.
  No truncation or padding, whatever tokenizer.json says. `split_special_tokens` is honoured.
- special tokens: the named ones (bos, eos, unk, sep, pad, cls, mask, and any other "*_token"
  key or extra_special_tokens mapping), as strings or AddedToken dicts, and extra_special_tokens
  (additional_special_tokens) are added to the vocabulary when they are not already added
  tokens, as are tokenizer_config's added_tokens_decoder entries (in id order), with the same
  flags transformers gives them;
- decoding: the Rust decoder; clean_up_tokenization_spaces as the config says (default off,
  never for a BPE model unless clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output);
- chat templates: chat_template.jinja (and additional_chat_templates/*.jinja) over the config's
  chat_template (a string or a list of named templates); with several, "tool_use" when tools
  are given and it exists, else "default". Rendered in an ImmutableSandboxedEnvironment with
  trim_blocks, lstrip_blocks, loop controls, a no-op {% generation %} block, transformers' tojson,
  raise_exception, strftime_now, a plain dict() and an underscore-refusing namespace(); the
  variables are messages (keys whose value is None dropped, reasoning fields aliased), tools,
  documents (None), add_generation_prompt, the named special tokens and any extra keywords
  (which win over special tokens of the same name).

Beyond transformers: a folder whose only template is in chat_template.json (a processor's file,
which AutoTokenizer does not read) gets that template.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as RustTokenizer

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named special tokens every tokenizer may have.
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Names a message's reasoning may come under; templates read the first (transformers aliases them).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Cleanup of tokenization spaces (transformers' clean_up_tokenization), in its order.
_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class Tokenizer:
    """A model's tokenizer: encode, decode, the vocabulary, special tokens and the chat template.

    Build it with `Tokenizer.from_dir(folder)`; `backend` is the Rust tokenizer (read-only use)."""

    def __init__(self, backend: RustTokenizer, config: Mapping[str, Any] | None = None,
                 chat_template: str | Mapping[str, str] | None = None) -> None:
        """`backend` (set up here: added tokens, post-processor, no truncation or padding; then only
        read); `config`: tokenizer_config.json's content; `chat_template`: templates found in files,
        which win over the config's."""
        cfg = _plain_config(config or {})
        self.backend = backend
        backend.no_truncation()
        backend.no_padding()
        self._named, self._extra = _special_tokens(cfg)
        self._add_missing_tokens(cfg.get("added_tokens_decoder") or {})
        backend.encode_special_tokens = bool(cfg.get("split_special_tokens", False))
        if backend.post_processor is None:
            backend.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1",
                                                                   special_tokens=[])
        self._cleanup = bool(cfg.get("clean_up_tokenization_spaces", False))
        # transformers never cleans up a BPE model's text (it would eat real spaces) unless told to.
        self._cleanup_allowed = type(backend.model).__name__ != "BPE" or bool(
            cfg.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))
        self._templates = _templates(cfg.get("chat_template"), chat_template)
        self._env: ImmutableSandboxedEnvironment | None = None
        self._compiled: dict[str, jinja2.Template] = {}

    @classmethod
    def from_dir(cls, folder: str | Path) -> "Tokenizer":
        """The tokenizer of a local model folder (tokenizer.json, tokenizer_config.json and any chat
        template files); never the hub. A folder without tokenizer.json is refused."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder}: no tokenizer.json here (the gateway reads only the fast-tokenizer file). Make one "
                f"where transformers is installed: AutoTokenizer.from_pretrained({str(folder)!r})"
                f".save_pretrained({str(folder)!r})")
        config = _read_json(folder / "tokenizer_config.json") or {}
        config.pop("add_bos_token", None)  # with tokenizer.json, transformers 5 ignores both
        config.pop("add_eos_token", None)
        if "additional_special_tokens" in config and not config.get("extra_special_tokens"):
            config["extra_special_tokens"] = config.pop("additional_special_tokens")
        if "added_tokens_decoder" not in config:
            config = _legacy_config(folder, config, path)
        return cls(RustTokenizer.from_file(str(path)), config, _template_files(folder, config))

    # ------------------------------------------------------------------ vocabulary

    def __len__(self) -> int:
        """The vocabulary's size with the added tokens (transformers' len(tokenizer))."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        """The token's string in the vocabulary (e.g. "Ġworld"); None outside it."""
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def added_special_ids(self) -> frozenset[int]:
        """The added tokens flagged special (tokenizer.json's added_tokens and what the config added):
        those decode(skip_special_tokens=True) leaves out."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    @property
    def special_tokens(self) -> dict[str, str]:
        """The named special tokens that are set, name -> text (transformers' special_tokens_map);
        templates see them as variables."""
        return {name: str(value) for name, value in self._named.items() if value is not None}

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of the named and extra special tokens, each once, in transformers' order."""
        texts = list(dict.fromkeys([*self.special_tokens.values(), *(str(t) for t in self._extra)]))
        ids = [self.token_to_id(t) for t in texts]
        unk = self.unk_token_id
        return [i for i in (unk if i is None else i for i in ids) if i is not None]

    def special_token_id(self, name: str) -> int | None:
        """A named special token's id (e.g. "eos_token"), as transformers' <name>_id: the unknown
        token's id where the text is not in the vocabulary; None where the token is not set."""
        text = self.special_tokens.get(name)
        if text is None:
            return None
        token_id = self.token_to_id(text)
        return token_id if token_id is not None or name == "unk_token" else self.unk_token_id

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self.special_token_id("eos_token")

    @property
    def unk_token_id(self) -> int | None:
        return self.special_token_id("unk_token")

    # ------------------------------------------------------------------ text

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The text's token ids; with add_special_tokens, what tokenizer.json's post-processor adds
        (e.g. a BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """The ids' text; clean_up_tokenization_spaces None: as the config says (BPE never)."""
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        cleanup = self._cleanup if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        if cleanup and self._cleanup_allowed:
            for before, after in _CLEANUPS:
                text = text.replace(before, after)
        return text

    # ------------------------------------------------------------------ chat template

    @property
    def chat_template(self) -> str | None:
        """The template used without tools ("default"; None: none)."""
        return self._templates.get("default")

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:
        """Replace every template of the model with this one (None: no template)."""
        self._templates = {} if template is None else {"default": template}

    @property
    def chat_templates(self) -> dict[str, str]:
        """All templates by name ("default" for a single one)."""
        return dict(self._templates)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], /, *, tools: Sequence[Mapping[str, Any]] | None = None,
                    add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """The conversation rendered by the chat template, as text (it holds the template's own
        special tokens: encode it with add_special_tokens=False). `tools`: JSON schemas in the OpenAI
        form; `kwargs`: more template variables. Raises ValueError when the model has no template
        (or no default among several) and jinja2.TemplateError when the template refuses."""
        template = self._pick_template(tools)
        if len(messages) == 0:
            raise ValueError("cannot render an empty conversation")
        chat = [_with_reasoning_aliases(m) for m in _normalized(messages)]
        # Extra variables win over special tokens of the same name, and may give `documents`.
        variables = {"documents": None, **self.special_tokens, **_plain(kwargs)}
        return self._compile(template).render({  # one mapping: any name may be a variable ("self" too)
            **variables, "messages": chat, "tools": _plain(list(tools) if tools is not None else None),
            "add_generation_prompt": add_generation_prompt})

    def _pick_template(self, tools: Sequence[Any] | None) -> str:
        if not self._templates:
            raise ValueError("this model has no chat template")
        if tools is not None and "tool_use" in self._templates:
            return self._templates["tool_use"]
        if "default" in self._templates:
            return self._templates["default"]
        raise ValueError(f"this model has several chat templates and no default: {sorted(self._templates)}")

    def _compile(self, template: str) -> jinja2.Template:
        compiled = self._compiled.get(template)
        if compiled is None:
            if self._env is None:
                self._env = _template_environment()
            compiled = self._compiled[template] = self._env.from_string(template)
        return compiled

    # ------------------------------------------------------------------ set-up

    def _add_missing_tokens(self, added_tokens_decoder: Mapping[int, AddedToken]) -> None:
        """Add the config's added tokens and the special tokens the tokenizer lacks, as transformers does
        (every added_tokens_decoder entry is given to the backend again, which keeps identical ones)."""
        tokens: list[AddedToken | str] = [t for _, t in sorted(added_tokens_decoder.items())]
        present = {t.content for t in self.backend.get_added_tokens_decoder().values()} | {str(t) for t in tokens}
        for token in [*self._named.values(), *self._extra]:
            if token is not None and str(token) not in present and token not in tokens:
                tokens.append(token)
        named = {str(t) for t in self._named.values() if t}
        out = []
        for token in tokens:
            if isinstance(token, str):
                token = AddedToken(token, special=True)
            elif not token.special and token.content in named:
                token.special = True
            out.append(token)
        if out:
            self.backend.add_tokens(out)


# ---------------------------------------------------------------------- config


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _added_token(value: Any, *, untyped: bool = False) -> Any:
    """tokenizer_config's serialized AddedToken ({"__type": "AddedToken", "content": ...}) as one;
    `untyped`: a dict without "__type" too (transformers refuses those for the named tokens)."""
    if isinstance(value, Mapping) and "content" in value and (value.get("__type") == "AddedToken" or untyped):
        return AddedToken(**{k: v for k, v in value.items() if k != "__type"})
    return value


def _plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config with AddedToken dicts as AddedTokens, added_tokens_decoder keyed by int, and
    additional_special_tokens renamed extra_special_tokens (transformers 5's name)."""
    cfg = dict(config)
    decoder = {int(i): t if isinstance(t, AddedToken) else AddedToken(**t)
               for i, t in (cfg.get("added_tokens_decoder") or {}).items()}
    cfg["added_tokens_decoder"] = decoder
    if "additional_special_tokens" in cfg and "extra_special_tokens" not in cfg:
        cfg["extra_special_tokens"] = cfg.pop("additional_special_tokens")
    by_text = {t.content: t for t in decoder.values()}
    for key, value in list(cfg.items()):
        if key.endswith("_token"):
            value = _added_token(value, untyped=key in NAMED_TOKENS)
            # A named token that is also an added token takes the added token's flags.
            cfg[key] = by_text.get(str(value), value) if key in NAMED_TOKENS and value is not None else value
    extra = cfg.get("extra_special_tokens")
    if isinstance(extra, list):
        cfg["extra_special_tokens"] = [_added_token(t) for t in extra]
    elif isinstance(extra, Mapping):
        cfg["extra_special_tokens"] = {k: _added_token(v) for k, v in extra.items()}
    return cfg


def _special_tokens(cfg: Mapping[str, Any]) -> tuple[dict[str, AddedToken | str | None], list[AddedToken | str]]:
    """The named special tokens (the seven standard names, then the model's own "*_token" keys:
    AddedToken-valued ones first, then string-valued ones and an extra_special_tokens mapping, as
    transformers orders them) and the extra special tokens."""
    named: dict[str, AddedToken | str | None] = dict.fromkeys(NAMED_TOKENS)
    for key in NAMED_TOKENS:
        value = cfg.get(key)
        if isinstance(value, (str, AddedToken)):
            named[key] = value
    own = [(k, v) for k, v in cfg.items() if k.endswith("_token") and k not in NAMED_TOKENS]
    named.update((k, v) for k, v in own if isinstance(v, AddedToken))
    named.update((k, v) for k, v in own if isinstance(v, str))
    extra = cfg.get("extra_special_tokens")
    if isinstance(extra, Mapping):
        named.update((k, v) for k, v in extra.items() if isinstance(v, (str, AddedToken)))
        extra = None
    return named, [t for t in (extra or []) if isinstance(t, (str, AddedToken))]


def _legacy_config(folder: Path, config: dict[str, Any], tokenizer_json: Path) -> dict[str, Any]:
    """A config without added_tokens_decoder (saved before transformers 4.34): its named tokens from
    special_tokens_map.json, added tokens from added_tokens.json and tokenizer.json, as transformers reads them."""
    config = dict(config)
    for key, value in (_read_json(folder / "special_tokens_map.json") or {}).items():
        if isinstance(value, Mapping) and key != "extra_special_tokens":
            value = {**value, "__type": "AddedToken", "special": True}
        elif key == "extra_special_tokens" and isinstance(value, list):
            value = [*(config.get("extra_special_tokens") or []),
                     *(t for t in value if t not in (config.get("extra_special_tokens") or []))]
        config[key] = value
    decoder: dict[int, dict[str, Any]] = {}
    # As transformers: str() of each value as it stands (an AddedToken dict matches nothing).
    named = {str(config[k]) for k in NAMED_TOKENS if config.get(k)}
    named |= {str(t) for t in config.get("extra_special_tokens") or []}
    for text, index in (_read_json(folder / "added_tokens.json") or {}).items():
        decoder[int(index)] = {"content": text, "rstrip": False, "lstrip": False, "normalized": text not in named,
                               "special": text in named}
    for token in (_read_json(tokenizer_json) or {}).get("added_tokens", []):
        decoder[int(token["id"])] = {k: v for k, v in token.items() if k != "id"}
    config["added_tokens_decoder"] = decoder
    return config


def _templates(in_config: Any, in_files: str | Mapping[str, str] | None) -> dict[str, str]:
    """All chat templates by name: the files' when there are any, else the config's (a string, or a
    list of {"name", "template"})."""
    found = in_files if in_files is not None else in_config
    if found is None:
        return {}
    if isinstance(found, str):
        return {"default": found}
    if isinstance(found, Mapping):
        return dict(found)
    return {t["name"]: t["template"] for t in found}


def _template_files(folder: Path, config: Mapping[str, Any]) -> dict[str, str] | None:
    """chat_template.jinja as "default" and additional_chat_templates/NAME.jinja as NAME; without
    them, chat_template.json's template when the config has none; None: no file's."""
    found: dict[str, str] = {}
    if (folder / "chat_template.jinja").is_file():
        found["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            found[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if found:
        return found
    legacy = _read_json(folder / "chat_template.json")
    if config.get("chat_template") is None and isinstance(legacy, Mapping) and legacy.get("chat_template"):
        return _templates(legacy["chat_template"], None)
    return None


# ---------------------------------------------------------------------- templates


class _GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} (marks the assistant's part for training masks): its body, as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """dict() for templates, without the class's attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """namespace() that refuses names starting with "_" (no way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's Namespace signature
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a template cannot set {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Not jinja's own tojson, which escapes HTML characters.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _template_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _plain(value: Any) -> Any:
    """What a template may see: JSON-like data only (str/int/float subclasses as the base type,
    dataclasses and pydantic models as dicts); anything else becomes a "<TypeName>" placeholder."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    if callable(getattr(value, "item", None)) and type(value).__module__ == "numpy":
        return _plain(value.item())
    return f"<{type(value).__name__}>"


def _normalized(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Each message as a plain dict without the keys whose value is None (templates handle a missing key)."""
    out = []
    for message in _plain(list(messages)):
        if not isinstance(message, dict):
            raise TypeError(f"chat messages must be dicts, got {message!r:.60}")
        out.append({k: v for k, v in message.items() if v is not None})
    return out


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    """A message's reasoning under every name templates read it by (reasoning_content, and thinking)."""
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}
