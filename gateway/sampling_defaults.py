"""The model's own sampling defaults (vLLM's --generation-config): generation_config.json's
temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens stand in for a request's
unset fields, as vLLM does by default; "vllm" keeps the built-in defaults."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pdserve.core.sampling import SamplingParams, ValidationError

log = logging.getLogger(__name__)

# generation_config.json key -> SamplingParams field (the ones vLLM takes)
KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
        "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def load(source: str, model_dir: Path) -> dict[str, Any]:
    """The defaults for --generation-config `source`: "auto" (the model folder's file), "vllm"
    (none) or a folder holding a generation_config.json. Raises ValueError saying what is wrong."""
    if source == "vllm":
        return {}
    path = (model_dir if source == "auto" else Path(source)) / "generation_config.json"
    if not path.is_file():
        if source == "auto":
            return {}
        raise ValueError(f"{path} does not exist")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    defaults = {field: config[key] for key, field in KEYS.items() if config.get(key) is not None}
    if defaults.get("top_k") == 0:  # transformers' "off"
        defaults["top_k"] = -1
    try:
        SamplingParams(**defaults).validate()
    except (TypeError, ValidationError) as e:
        raise ValueError(f"{path}: {e}") from None
    if defaults:
        log.info("sampling defaults from %s for requests that leave them unset: %s", path, defaults)
    return defaults
