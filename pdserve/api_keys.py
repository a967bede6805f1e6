"""API keys as vLLM takes them: `--api-key` flags first, else the PDSERVE_API_KEY environment
variable, else VLLM_API_KEY. Shared by the gateway (which requires one of its keys) and the
clients (which send theirs as `Bearer <key>`); pure Python, no grpc."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ENV_VARS = ("PDSERVE_API_KEY", "VLLM_API_KEY")  # first set (and non-empty) wins
SCHEME = "Bearer"


def check_key(key: str, source: str) -> str:
    """key, or ValueError naming source (a flag or a variable) where it cannot travel in an HTTP
    header and gRPC metadata as `Bearer <key>`: empty, or not printable ASCII without spaces."""
    if not key:
        raise ValueError(f"{source}: an API key cannot be empty")
    if not all("!" <= c <= "~" for c in key):
        raise ValueError(f"{source}: an API key must be printable ASCII without spaces")
    return key


def from_env(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable name, key) of the first of ENV_VARS that is set and non-empty (compose passes an
    unset variable as ""), checked; None where none is."""
    for name in ENV_VARS:
        value = environ.get(name, "")
        if value:
            return name, check_key(value, name)
    return None


def resolve(flags: Sequence[str] | None, environ: Mapping[str, str], flag: str = "--api-key") -> tuple[str, ...]:
    """The keys a gateway accepts: every `flag` given, else the environment's one; () when none
    (no key is required). ValueError names the flag or variable of a bad key."""
    if flags:
        return tuple(check_key(k, flag) for k in flags)
    found = from_env(environ)
    return () if found is None else (found[1],)


def bearer(key: str) -> str:
    """The `authorization` value that carries key."""
    return f"{SCHEME} {key}"


def client_authorization(api_key: str | None, environ: Mapping[str, str]) -> str:
    """What a client sends as `authorization` for api_key (None: the environment's key, as the
    gateway reads its own); "" where there is no key."""
    if api_key is None:
        found = from_env(environ)
        api_key = None if found is None else found[1]
    return "" if api_key is None else bearer(check_key(api_key, "api_key"))
