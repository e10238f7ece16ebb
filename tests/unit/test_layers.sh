#!/usr/bin/env bash
# scripts/check_layers.py: the tree as it is passes, and each kind of crossing it exists to catch fails,
# naming the file, the line and the include.
set -o pipefail
check="$1"
root="$2"
. "$(dirname "$0")/../lib.sh" layers-test
tmp="$TMP"
expect_fail() { # DESCRIPTION FILE INCLUDE
    local d="$tmp/$1"
    mkdir -p "$d/$(dirname "$2")"
    printf '#include <stdio.h>\n#include "%s"\n' "$3" >"$d/$2"
    if out="$(python3 "$check" "$d" 2>&1)"; then
        echo "FAIL: $1: $2 including $3 passed the check"
        fails=$((fails + 1))
    elif ! grep -qF "$2:2: includes \"$3\"" <<<"$out"; then
        echo "FAIL: $1: the error does not name $2:2 and $3: $out"
        fails=$((fails + 1))
    else
        echo "ok: $1 refused"
    fi
}
if out="$(python3 "$check" "$root" 2>&1)"; then
    echo "ok: the source tree keeps its layers"
else
    echo "FAIL: the source tree crosses a layer:"
    echo "$out"
    fails=$((fails + 1))
fi
expect_fail trainer-rollout worker/trainer/x.c worker/rollout/y.h
expect_fail rollout-trainer worker/rollout/x.c worker/trainer/trainer.h
expect_fail daemon-worker daemon/x.c worker/comm/comm.h
expect_fail ctl-worker ctl/x.h worker/plane/wire.h
expect_fail kernels-worker kernels/cpu/x.c worker/model/model.h
expect_fail step-plane worker/step/x.c worker/plane/dispatch.h
expect_fail rewards-trainer worker/rewards/x.c worker/trainer/trainer.h
expect_fail gen-agent worker/gen/x.c worker/agent/tool.h
expect_fail trainer-agent worker/trainer/x.c worker/agent/tool.h
expect_fail model-agent worker/model/x.c worker/agent/tool.h
expect_fail agent-gen worker/agent/x.c worker/gen/engine.h
expect_fail model-backend worker/model/x.c kernels/cpu/cpu_kernels.h
expect_fail model-cuda worker/model/x.c kernels/cuda/backend.h
expect_fail model-lora worker/model/model_x.c lora.h
expect_fail model-lora-internal worker/model/shard.c lora_internal.h
expect_fail layer-moe-ep worker/model/model_layer.c moe_ep.h
# an allowed include passes
mkdir -p "$tmp/allowed/worker/trainer"
printf '#include "worker/step/batch.h"\n' >"$tmp/allowed/worker/trainer/x.c"
if python3 "$check" "$tmp/allowed" >/dev/null 2>&1; then echo "ok: trainer -> step allowed"; else
    echo "FAIL: trainer including worker/step was refused"
    fails=$((fails + 1))
fi
mkdir -p "$tmp/allowed2/worker/agent"
printf '#include "worker/tokenizer/tokenizer.h"\n#include "common/log.h"\n' >"$tmp/allowed2/worker/agent/x.c"
if python3 "$check" "$tmp/allowed2" >/dev/null 2>&1; then echo "ok: agent -> tokenizer, common allowed"; else
    echo "FAIL: agent including worker/tokenizer or common was refused"
    fails=$((fails + 1))
fi
# the model's own exceptions pass: LoRA's files include its headers, the expert block includes moe_ep.h
mkdir -p "$tmp/allowed3/worker/model"
printf '#include "lora.h"\n#include "lora_internal.h"\n#include "model.h"\n' >"$tmp/allowed3/worker/model/lora_x.c"
printf '#include "moe_ep.h"\n' >"$tmp/allowed3/worker/model/model_moe.c"
if python3 "$check" "$tmp/allowed3" >/dev/null 2>&1; then echo "ok: lora -> lora.h, model_moe -> moe_ep.h allowed"; else
    echo "FAIL: LoRA's own headers or the expert block's moe_ep.h were refused"
    fails=$((fails + 1))
fi
# an include cycle among the model's rooms (a.c includes b.h, b.c includes a.h) fails, naming the include that closes it
mkdir -p "$tmp/cycle/worker/model"
touch "$tmp/cycle/worker/model/a.h" "$tmp/cycle/worker/model/b.h"
printf '#include "a.h"\n#include "b.h"\n' >"$tmp/cycle/worker/model/a.c"
printf '#include "b.h"\n#include "a.h"\n' >"$tmp/cycle/worker/model/b.c"
if out="$(python3 "$check" "$tmp/cycle" 2>&1)"; then
    echo "FAIL: an include cycle in worker/model passed the check"
    fails=$((fails + 1))
elif ! grep -qE 'worker/model/[ab]\.c:2: includes "[ab]\.h": closes an include cycle' <<<"$out"; then
    echo "FAIL: the cycle's error does not name the include that closes it: $out"
    fails=$((fails + 1))
else
    echo "ok: an include cycle among the model's rooms refused"
fi
finish
