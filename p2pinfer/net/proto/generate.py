"""Regenerate (or, with ``--check``, verify) the checked-in protobuf code.

Why a script: the generated code must match protos/p2pinfer.proto exactly,
and the test suite calls :func:`check` so a stale copy fails CI.
"""

from __future__ import annotations

from pathlib import Path
import sys
import tempfile

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "protos"
PROTO = PROTO_DIR / "p2pinfer.proto"
OUT_DIR = Path(__file__).resolve().parent
FILES = ("p2pinfer_pb2.py", "p2pinfer_pb2.pyi")


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # test extra: grpcio-tools

    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")


def check() -> list[str]:
    """Names of checked-in files that differ from freshly generated ones."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [
            name
            for name in FILES
            if not (OUT_DIR / name).exists() or (Path(tmp) / name).read_bytes() != (OUT_DIR / name).read_bytes()
        ]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = check()
        if stale:
            print(f"stale generated code: {', '.join(stale)}; run python -m p2pinfer.net.proto.generate")
            return 1
        print("generated protobuf code is current")
        return 0
    generate(OUT_DIR)
    print(f"wrote {', '.join(FILES)} to {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
