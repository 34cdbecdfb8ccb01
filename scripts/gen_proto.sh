#!/usr/bin/env bash
# Regenerates the committed Python gRPC stubs (python/lookahead_client/_proto/) from
# proto/lookahead/v1/lookahead.proto. CI runs it and then `git diff --exit-code`.
#
# The stubs are generated with a pinned grpcio-tools: generated code requires a grpcio and a
# protobuf runtime at least as new as the generator, so the pin is the oldest version the
# package supports (SGLang 0.5.23's floors: grpcio >= 1.81.1, protobuf >= 6.33.5).
# grpcio-tools 1.81.1 needs protobuf < 7, so it lives in its own virtual environment
# (build/protogen, created on first use) rather than in the project's.
#
# Environment:
#   LOOKAHEAD_PROTOGEN_PYTHON  a Python that already has grpcio-tools==$GRPC_TOOLS_VERSION
#                              (skips the virtual environment).
set -euo pipefail

GRPC_TOOLS_VERSION=1.81.1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ -n "${LOOKAHEAD_PROTOGEN_PYTHON:-}" ]]; then
    PY="$LOOKAHEAD_PROTOGEN_PYTHON"
else
    VENV="$ROOT/build/protogen"
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "gen_proto: creating $VENV with grpcio-tools==$GRPC_TOOLS_VERSION" >&2
        python3 -m venv "$VENV"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "grpcio-tools==$GRPC_TOOLS_VERSION"
    fi
    PY="$VENV/bin/python"
fi

found="$("$PY" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)"
if [[ "$found" != "$GRPC_TOOLS_VERSION" ]]; then
    echo "gen_proto: $PY has grpcio-tools '${found:-none}', need $GRPC_TOOLS_VERSION" >&2
    exit 1
fi

OUT=python/lookahead_client/_proto
rm -f "$OUT"/lookahead/v1/*_pb2*.py "$OUT"/lookahead/v1/*_pb2*.pyi
mkdir -p "$OUT/lookahead/v1"
# The -I mapping makes the generated modules import each other as
# lookahead_client._proto.lookahead.v1.*.
"$PY" -m grpc_tools.protoc \
    -Ilookahead_client/_proto=proto \
    --python_out=python --pyi_out=python --grpc_python_out=python \
    lookahead_client/_proto/lookahead/v1/lookahead.proto

for pkg in "$OUT" "$OUT/lookahead" "$OUT/lookahead/v1"; do
    printf '"""Generated gRPC code (scripts/gen_proto.sh); do not edit."""\n' > "$pkg/__init__.py"
done
echo "gen_proto: stubs written to $OUT (grpcio-tools $GRPC_TOOLS_VERSION)" >&2
