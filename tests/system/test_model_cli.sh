#!/usr/bin/env bash
# grpo-model as a user meets it: info, convert (GGUF -> HF, when the bundled model is present), tokenize,
# logits to .npy (checked against the transformers fixture), generate, --help, and clear errors.
# Usage: test_model_cli.sh   (from the source root; the build's grpo-model by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-model-cli
tool="$(prog grpo-model)"
tiny=tests/fixtures/models/tiny-qwen2-bias

"$tool" --help >"$TMP/help" 2>&1; expect "--help exits 0" $?
for c in info init convert tokenize chat logits generate; do
    "$tool" "$c" --help >"$TMP/h" 2>&1 && has "$TMP/h" "usage: grpo-model $c"
    expect "$c --help" $?
done
# chat: fixture cases printed exactly as transformers' apply_chat_template rendered them
# (tests/fixtures/chat_templates), their token ids, and a template error naming its line
ct=tests/fixtures/chat_templates
chat_case() { # NAME: its messages, tools and kwargs as files under $TMP
    jq -c --arg n "$1" '.cases[] | select(.name == $n)' "$ct/cases.json" >"$TMP/case.json"
    jq '.messages' "$TMP/case.json" >"$TMP/m.json"
    jq '.tools' "$TMP/case.json" >"$TMP/t.json"
    jq -c '.kwargs // {}' "$TMP/case.json" | tr -d '\n' >"$TMP/kw"
}
chat_case qwen3_tools
"$tool" chat "$ct/qwen3-0.6b" --messages "$TMP/m.json" --tools "$TMP/t.json" --kwargs "$(cat "$TMP/kw")" \
    >"$TMP/chat.txt" 2>"$TMP/chat.log"; expect "chat renders Qwen3 with tools" $?
cmp -s "$TMP/chat.txt" "$ct/expected/qwen3_tools.txt"; expect "chat prints transformers' text exactly" $?
"$tool" chat "$ct/qwen3-0.6b" --messages "$TMP/m.json" --tools "$TMP/t.json" --kwargs "$(cat "$TMP/kw")" --ids \
    >"$TMP/chat.ids" 2>"$TMP/chat.log"
[ "$(cat "$TMP/chat.ids")" = "$(jq -r .ids "$TMP/case.json")" ]; expect "chat --ids prints transformers' ids" $?
chat_case smollm2_convo_nogen
"$tool" chat "$ct/smollm2-135m-instruct" --messages "$TMP/m.json" --no-generation-prompt >"$TMP/chat.txt" \
    2>"$TMP/chat.log" && cmp -s "$TMP/chat.txt" "$ct/expected/smollm2_convo_nogen.txt"
expect "chat --no-generation-prompt" $?
mkdir -p "$TMP/badtpl"
cp "$ct/qwen3-0.6b/tokenizer.json" "$ct/qwen3-0.6b/tokenizer_config.json" "$TMP/badtpl/"
printf '{%%- for m in messages %%}\n{{ m.content + }}\n{%%- endfor %%}\n' >"$TMP/badtpl/chat_template.jinja"
"$tool" chat "$TMP/badtpl" --messages "$TMP/m.json" >"$TMP/chat.txt" 2>"$TMP/chat.log"
[ $? -eq 1 ] && says "$TMP/chat.log" "chat template line 2: syntax error"; expect "chat: a template error names its line" $?
"$tool" chat "$ct/qwen3-0.6b" >"$TMP/chat.txt" 2>"$TMP/chat.log"
[ $? -eq 2 ] && says "$TMP/chat.log" "--messages"; expect "chat without --messages is a usage error" $?

"$tool" info "$tiny" >"$TMP/info" 2>&1; expect "info on a HF directory" $?
has "$TMP/info" "Qwen2ForCausalLM"; expect "info names the architecture" $?
grep -Eq "q/k/v bias +true" "$TMP/info"; expect "info shows the q/k/v bias" $?
has "$TMP/info" "F32 x"; expect "info lists tensor dtypes" $?

# logits of the fixture's ids, compared with transformers' logits.npy (standard-library Python)
ids="$(tr -d '[] \n' <"$tiny/input_ids.json")"
"$tool" logits "$tiny" --ids "$ids" --out "$TMP/l.npy" >"$TMP/log" 2>&1; expect "logits writes a .npy" $?
python3 - "$TMP/l.npy" "$tiny/logits.npy" <<'PY'
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
"$tool" logits "$tiny" --ids 1,2,x --out "$TMP/x.npy" >"$TMP/err" 2>&1; [ $? -eq 2 ]; expect "bad --ids exits 2" $?
"$tool" logits "$tiny" --ids 1,99999 --out "$TMP/x.npy" >"$TMP/err" 2>&1; [ $? -eq 2 ]
expect "out-of-vocabulary id exits 2" $?
has "$TMP/err" "outside the vocabulary"; expect "and says so" $?
# a PEFT LoRA adapter (made by peft: tests/fixtures/models/lora-qwen3): info, logits with it, the merged export
lora=tests/fixtures/models/lora-qwen3
"$tool" merge-lora --help >"$TMP/h" 2>&1 && has "$TMP/h" "usage: grpo-model merge-lora"; expect "merge-lora --help" $?
"$tool" info "$lora/adapter" >"$TMP/info" 2>&1; expect "info on a LoRA adapter directory" $?
has "$TMP/info" "LoRA adapter        rank 2, alpha 3 (scale 1.5), on q_proj, v_proj, down_proj" &&
    has "$TMP/info" "Qwen3ForCausalLM" && has "$TMP/info" "adapter parameters  960"
expect "info prints the adapter's rank, alpha and targets, and its base model" $?
lids="$(tr -d '[] \n' <"$lora/input_ids.json")"
"$tool" logits tests/fixtures/models/tiny-qwen3 --adapter "$lora/adapter" --ids "$lids" --out "$TMP/la.npy" \
    >"$TMP/log" 2>&1; expect "logits with --adapter" $?
"$tool" merge-lora tests/fixtures/models/tiny-qwen3 "$lora/adapter" "$TMP/merged" >"$TMP/log" 2>&1
expect "merge-lora writes a merged checkpoint" $?
"$tool" logits "$TMP/merged" --ids "$lids" --out "$TMP/lm.npy" >"$TMP/log" 2>&1; expect "the merged model loads" $?
python3 - "$TMP/la.npy" "$lora/logits.npy" "$TMP/lm.npy" "$lora/merged_logits.npy" <<'PY'
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
"$tool" info /nonexistent >"$TMP/err" 2>&1; [ $? -ne 0 ]; expect "missing model fails" $?
has "$TMP/err" "/nonexistent"; expect "error names the path" $?

# a tiny model with the byte tokenizer: init, tokenize, generate (sampling is reproducible from the seed)
"$tool" init tests/fixtures/tokenizers/bytes-chatml/config.json "$TMP/tb" \
    --tokenizer-from tests/fixtures/tokenizers/bytes-chatml --seed 3 >"$TMP/log" 2>&1
expect "init a random model" $?
# OUTDIR's parents are created as by mkdir -p (the bench scripts write into a fresh checkout's runs/ tree)
"$tool" init tests/fixtures/tokenizers/bytes-chatml/config.json "$TMP/new/parents/tb" \
    --tokenizer-from tests/fixtures/tokenizers/bytes-chatml --seed 3 >"$TMP/log" 2>&1
expect "init creates OUTDIR's missing parents" $?
cmp -s "$TMP/tb/model.safetensors" "$TMP/new/parents/tb/model.safetensors"; expect "... and writes the same model there" $?
: >"$TMP/plainfile"
"$tool" init tests/fixtures/tokenizers/bytes-chatml/config.json "$TMP/plainfile/tb" \
    --tokenizer-from tests/fixtures/tokenizers/bytes-chatml >"$TMP/err" 2>&1
[ $? -ne 0 ] && has "$TMP/err" "cannot create directory $TMP/plainfile/tb"
expect "init under a regular file fails, naming the directory" $?
"$tool" tokenize "$TMP/tb" "Hi 7" >"$TMP/tok" 2>&1; expect "tokenize" $?
[ "$(cat "$TMP/tok")" = "72,105,32,55" ]; expect "byte tokenizer ids of 'Hi 7'" $?
"$tool" tokenize "$TMP/tb" "Hi" --chat >"$TMP/tok" 2>&1
grep -q "^257,117,115,101,114,10,72,105,258,10,257," "$TMP/tok"; expect "tokenize --chat applies ChatML" $?
"$tool" generate "$TMP/tb" --prompt "1+1=" --max-new-tokens 8 --temperature 1 --seed 5 --print-ids >"$TMP/g1" 2>&1
expect "generate" $?
"$tool" generate "$TMP/tb" --prompt "1+1=" --max-new-tokens 8 --temperature 1 --seed 5 --print-ids >"$TMP/g2" 2>&1
cmp -s "$TMP/g1" "$TMP/g2"; expect "same seed, same sample" $?
"$tool" generate "$TMP/tb" --prompt "x" --top-p 2 >"$TMP/err" 2>&1; [ $? -eq 2 ]; expect "top-p > 1 refused" $?

# the bundled model (fetched by scripts/test.sh): GGUF info and conversion to the HF layout
gguf="${GRPO_MODEL_GGUF:-$HOME/.cache/grpo/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ -r "$gguf" ]; then
    "$tool" info "$gguf" >"$TMP/info" 2>&1 && has "$TMP/info" "134515008"
    expect "info on the bundled GGUF (134.5 M parameters)" $?
    "$tool" convert "$gguf" "$TMP/hf" >"$TMP/log" 2>&1; expect "convert GGUF -> HF" $?
    for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
        [ -s "$TMP/hf/$f" ]; expect "convert wrote $f" $?
    done
    "$tool" convert "$gguf" "$TMP/fresh/checkout/hf" >"$TMP/log" 2>&1 && [ -s "$TMP/fresh/checkout/hf/model.safetensors" ]
    expect "convert creates OUTDIR's missing parents" $?
    a="$("$tool" tokenize "$gguf" "What is 12+30?" --chat)"
    b="$("$tool" tokenize "$TMP/hf" "What is 12+30?" --chat)"
    [ -n "$a" ] && [ "$a" = "$b" ]; expect "converted tokenizer encodes as the GGUF's" $?
    "$tool" generate "$TMP/hf" --prompt "What is 7 plus 5?" --chat --max-new-tokens 8 >"$TMP/g" 2>&1
    has "$TMP/g" "To add 7 and 5"; expect "converted model generates transformers' greedy text" $?
else
    echo "skip bundled-model checks: $gguf not found"
fi
# the BLAS kernels: named by info; chosen for the CPU when OpenBLAS picked older ones (simulated here with
# GRPO_BLAS_PRETEND_CORE, since this machine's OpenBLAS may recognise its CPU); a user's OPENBLAS_CORETYPE wins
env -u OPENBLAS_CORETYPE "$tool" info "$tiny" >"$TMP/k0" 2>&1
grep -q "^kernels  *OpenBLAS .* kernels (" "$TMP/k0"; rc=$?; expect "info names the BLAS kernels ($(grep '^kernels' "$TMP/k0"))" $rc
if grep -qw avx512bw /proc/cpuinfo || grep -qw avx2 /proc/cpuinfo; then
    want=Haswell; grep -qw avx512bw /proc/cpuinfo && want=SkylakeX
    env -u OPENBLAS_CORETYPE GRPO_BLAS_PRETEND_CORE=Prescott "$tool" info "$tiny" >"$TMP/k1" 2>&1
    has "$TMP/k1" "OpenBLAS $want kernels (chosen for this CPU)"
    expect "OpenBLAS's Prescott fallback is replaced by $want kernels with no environment variable" $?
    OPENBLAS_CORETYPE=Prescott GRPO_BLAS_PRETEND_CORE=Prescott "$tool" info "$tiny" >"$TMP/k2" 2>&1
    has "$TMP/k2" "OpenBLAS Prescott kernels (OPENBLAS_CORETYPE)"; expect "a user's OPENBLAS_CORETYPE is kept" $?
    env -u OPENBLAS_CORETYPE GRPO_BLAS_AUTO=0 GRPO_BLAS_PRETEND_CORE=Prescott "$tool" info "$tiny" >"$TMP/k3" 2>&1
    ! has "$TMP/k3" "chosen for this CPU"; expect "GRPO_BLAS_AUTO=0 turns the choice off" $?
fi
finish
