"""The committed stubs equal what `make protos` generates from protos/ (no drift)."""

from __future__ import annotations

from pathlib import Path

from pdserve.proto.generate import OUT_DIR, generate


def test_stubs_match_proto_sources(tmp_path: Path):
    fresh = {p.name: p.read_text() for p in generate(tmp_path)}
    committed = {p.name: p.read_text() for p in OUT_DIR.glob("*_pb2*.py*")}
    assert set(fresh) == set(committed), "stub files differ: run `make protos`"
    for name, text in fresh.items():
        assert committed[name] == text, f"{name} is stale: run `make protos`"
