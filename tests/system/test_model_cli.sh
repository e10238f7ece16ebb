#!/usr/bin/env bash
# grpo-model as a user meets it: info, convert (GGUF -> HF, when the bundled model is present), tokenize,
# logits to .npy (checked against the transformers fixture), generate, --help, and clear errors.
# Usage: test_model_cli.sh GRPO_MODEL   (from the source root)
set -u
tool="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
has() { grep -qF -- "$2" "$1"; }
tiny=tests/fixtures/models/tiny-qwen2-bias

"$tool" --help >"$tmp/help" 2>&1; expect "--help exits 0" $?
for c in info init convert tokenize logits generate; do
    "$tool" "$c" --help >"$tmp/h" 2>&1 && has "$tmp/h" "usage: grpo-model $c"
    expect "$c --help" $?
done
"$tool" info "$tiny" >"$tmp/info" 2>&1; expect "info on a HF directory" $?
has "$tmp/info" "Qwen2ForCausalLM"; expect "info names the architecture" $?
grep -Eq "q/k/v bias +true" "$tmp/info"; expect "info shows the q/k/v bias" $?
has "$tmp/info" "F32 x"; expect "info lists tensor dtypes" $?

# logits of the fixture's ids, compared with transformers' logits.npy (standard-library Python)
ids="$(tr -d '[] \n' <"$tiny/input_ids.json")"
"$tool" logits "$tiny" --ids "$ids" --out "$tmp/l.npy" >"$tmp/log" 2>&1; expect "logits writes a .npy" $?
python3 - "$tmp/l.npy" "$tiny/logits.npy" <<'PY'
import ast, struct, sys
def load(p):
    b = open(p, "rb").read()
    assert b[:6] == b"\x93NUMPY", p
    hl = struct.unpack("<H", b[8:10])[0]
    h = ast.literal_eval(b[10:10 + hl].decode())
    assert h["descr"] == "<f4" and not h["fortran_order"], h
    n = 1
    for d in h["shape"]:
        n *= d
    return h["shape"], struct.unpack("<%df" % n, b[10 + hl:10 + hl + 4 * n])
(s1, a), (s2, b) = load(sys.argv[1]), load(sys.argv[2])
assert tuple(s1) == tuple(s2), (s1, s2)
worst = max(abs(x - y) for x, y in zip(a, b))
print("max |ours - transformers| =", worst)
sys.exit(0 if worst < 1e-4 else 1)
PY
expect "logits match transformers (shape and values)" $?
"$tool" logits "$tiny" --ids 1,2,x --out "$tmp/x.npy" >"$tmp/err" 2>&1; [ $? -eq 2 ]; expect "bad --ids exits 2" $?
"$tool" logits "$tiny" --ids 1,99999 --out "$tmp/x.npy" >"$tmp/err" 2>&1; [ $? -eq 2 ]
expect "out-of-vocabulary id exits 2" $?
has "$tmp/err" "outside the vocabulary"; expect "and says so" $?
# a PEFT LoRA adapter (made by peft: tests/fixtures/models/lora-qwen3): info, logits with it, the merged export
lora=tests/fixtures/models/lora-qwen3
"$tool" merge-lora --help >"$tmp/h" 2>&1 && has "$tmp/h" "usage: grpo-model merge-lora"; expect "merge-lora --help" $?
"$tool" info "$lora/adapter" >"$tmp/info" 2>&1; expect "info on a LoRA adapter directory" $?
has "$tmp/info" "LoRA adapter        rank 2, alpha 3 (scale 1.5), on q_proj, v_proj, down_proj" &&
    has "$tmp/info" "Qwen3ForCausalLM" && has "$tmp/info" "adapter parameters  960"
expect "info prints the adapter's rank, alpha and targets, and its base model" $?
lids="$(tr -d '[] \n' <"$lora/input_ids.json")"
"$tool" logits tests/fixtures/models/tiny-qwen3 --adapter "$lora/adapter" --ids "$lids" --out "$tmp/la.npy" \
    >"$tmp/log" 2>&1; expect "logits with --adapter" $?
"$tool" merge-lora tests/fixtures/models/tiny-qwen3 "$lora/adapter" "$tmp/merged" >"$tmp/log" 2>&1
expect "merge-lora writes a merged checkpoint" $?
"$tool" logits "$tmp/merged" --ids "$lids" --out "$tmp/lm.npy" >"$tmp/log" 2>&1; expect "the merged model loads" $?
python3 - "$tmp/la.npy" "$lora/logits.npy" "$tmp/lm.npy" "$lora/merged_logits.npy" <<'PY'
import ast, struct, sys
def load(p):
    b = open(p, "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    h = ast.literal_eval(b[10:10 + hl].decode())
    n = 1
    for d in h["shape"]:
        n *= d
    return struct.unpack("<%df" % n, b[10 + hl:10 + hl + 4 * n])
a, pa, m, pm = (load(p) for p in sys.argv[1:5])
worst = max(max(abs(x - y) for x, y in zip(a, pa)), max(abs(x - y) for x, y in zip(m, pm)))
print("max |ours - peft| (adapter, merged) =", worst)
sys.exit(0 if worst < 1e-4 else 1)
PY
expect "adapter and merged logits match peft's" $?
"$tool" info /nonexistent >"$tmp/err" 2>&1; [ $? -ne 0 ]; expect "missing model fails" $?
has "$tmp/err" "/nonexistent"; expect "error names the path" $?

# a tiny model with the byte tokenizer: init, tokenize, generate (sampling is reproducible from the seed)
"$tool" init tests/fixtures/tokenizers/bytes-chatml/config.json "$tmp/tb" \
    --tokenizer-from tests/fixtures/tokenizers/bytes-chatml --seed 3 >"$tmp/log" 2>&1
expect "init a random model" $?
# OUTDIR's parents are created as by mkdir -p (the bench scripts write into a fresh checkout's runs/ tree)
"$tool" init tests/fixtures/tokenizers/bytes-chatml/config.json "$tmp/new/parents/tb" \
    --tokenizer-from tests/fixtures/tokenizers/bytes-chatml --seed 3 >"$tmp/log" 2>&1
expect "init creates OUTDIR's missing parents" $?
cmp -s "$tmp/tb/model.safetensors" "$tmp/new/parents/tb/model.safetensors"; expect "... and writes the same model there" $?
: >"$tmp/plainfile"
"$tool" init tests/fixtures/tokenizers/bytes-chatml/config.json "$tmp/plainfile/tb" \
    --tokenizer-from tests/fixtures/tokenizers/bytes-chatml >"$tmp/err" 2>&1
[ $? -ne 0 ] && has "$tmp/err" "cannot create directory $tmp/plainfile/tb"
expect "init under a regular file fails, naming the directory" $?
"$tool" tokenize "$tmp/tb" "Hi 7" >"$tmp/tok" 2>&1; expect "tokenize" $?
[ "$(cat "$tmp/tok")" = "72,105,32,55" ]; expect "byte tokenizer ids of 'Hi 7'" $?
"$tool" tokenize "$tmp/tb" "Hi" --chat >"$tmp/tok" 2>&1
grep -q "^257,117,115,101,114,10,72,105,258,10,257," "$tmp/tok"; expect "tokenize --chat applies ChatML" $?
"$tool" generate "$tmp/tb" --prompt "1+1=" --max-new-tokens 8 --temperature 1 --seed 5 --print-ids >"$tmp/g1" 2>&1
expect "generate" $?
"$tool" generate "$tmp/tb" --prompt "1+1=" --max-new-tokens 8 --temperature 1 --seed 5 --print-ids >"$tmp/g2" 2>&1
cmp -s "$tmp/g1" "$tmp/g2"; expect "same seed, same sample" $?
"$tool" generate "$tmp/tb" --prompt "x" --top-p 2 >"$tmp/err" 2>&1; [ $? -eq 2 ]; expect "top-p > 1 refused" $?

# the bundled model (fetched by scripts/test.sh): GGUF info and conversion to the HF layout
gguf="${GRPO_MODEL_GGUF:-$HOME/.cache/grpo/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ -r "$gguf" ]; then
    "$tool" info "$gguf" >"$tmp/info" 2>&1 && has "$tmp/info" "134515008"
    expect "info on the bundled GGUF (134.5 M parameters)" $?
    "$tool" convert "$gguf" "$tmp/hf" >"$tmp/log" 2>&1; expect "convert GGUF -> HF" $?
    for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
        [ -s "$tmp/hf/$f" ]; expect "convert wrote $f" $?
    done
    "$tool" convert "$gguf" "$tmp/fresh/checkout/hf" >"$tmp/log" 2>&1 && [ -s "$tmp/fresh/checkout/hf/model.safetensors" ]
    expect "convert creates OUTDIR's missing parents" $?
    a="$("$tool" tokenize "$gguf" "What is 12+30?" --chat)"
    b="$("$tool" tokenize "$tmp/hf" "What is 12+30?" --chat)"
    [ -n "$a" ] && [ "$a" = "$b" ]; expect "converted tokenizer encodes as the GGUF's" $?
    "$tool" generate "$tmp/hf" --prompt "What is 7 plus 5?" --chat --max-new-tokens 8 >"$tmp/g" 2>&1
    has "$tmp/g" "To add 7 and 5"; expect "converted model generates transformers' greedy text" $?
else
    echo "skip bundled-model checks: $gguf not found"
fi
# the BLAS kernels: named by info; chosen for the CPU when OpenBLAS picked older ones (simulated here with
# GRPO_BLAS_PRETEND_CORE, since this machine's OpenBLAS may recognise its CPU); a user's OPENBLAS_CORETYPE wins
env -u OPENBLAS_CORETYPE "$tool" info "$tiny" >"$tmp/k0" 2>&1
grep -q "^kernels  *OpenBLAS .* kernels (" "$tmp/k0"; rc=$?; expect "info names the BLAS kernels ($(grep '^kernels' "$tmp/k0"))" $rc
if grep -qw avx512bw /proc/cpuinfo || grep -qw avx2 /proc/cpuinfo; then
    want=Haswell; grep -qw avx512bw /proc/cpuinfo && want=SkylakeX
    env -u OPENBLAS_CORETYPE GRPO_BLAS_PRETEND_CORE=Prescott "$tool" info "$tiny" >"$tmp/k1" 2>&1
    has "$tmp/k1" "OpenBLAS $want kernels (chosen for this CPU)"
    expect "OpenBLAS's Prescott fallback is replaced by $want kernels with no environment variable" $?
    OPENBLAS_CORETYPE=Prescott GRPO_BLAS_PRETEND_CORE=Prescott "$tool" info "$tiny" >"$tmp/k2" 2>&1
    has "$tmp/k2" "OpenBLAS Prescott kernels (OPENBLAS_CORETYPE)"; expect "a user's OPENBLAS_CORETYPE is kept" $?
    env -u OPENBLAS_CORETYPE GRPO_BLAS_AUTO=0 GRPO_BLAS_PRETEND_CORE=Prescott "$tool" info "$tiny" >"$tmp/k3" 2>&1
    ! has "$tmp/k3" "chosen for this CPU"; expect "GRPO_BLAS_AUTO=0 turns the choice off" $?
fi
[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
