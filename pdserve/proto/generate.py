"""Regenerate the committed gRPC stubs from protos/pdserve/v1/*.proto (`make protos`).

Stubs land flat in pdserve/proto/ and import each other as `pdserve.proto.X_pb2`; the proto
package stays `pdserve.v1`, which is what clients and reflection see.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos"
OUT_DIR = Path(__file__).resolve().parent


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs into out_dir; returns the files written."""
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "pdserve/v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"]
        if protoc.main(args + sources) != 0:
            raise RuntimeError("protoc failed")
        written = []
        for f in sorted((Path(tmp) / "pdserve/v1").iterdir()):
            text = re.sub(r"from pdserve\.v1 import", "from pdserve.proto import", f.read_text())
            dest = out_dir / f.name
            dest.write_text(text)
            written.append(dest)
        return written


if __name__ == "__main__":
    for path in generate(OUT_DIR):
        print(path.relative_to(ROOT))
    sys.exit(0)
