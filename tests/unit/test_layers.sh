#!/usr/bin/env bash
# scripts/check_layers.py: the tree as it is passes, and each kind of crossing it exists to catch fails,
# naming the file, the line and the include (and, for the layers of worker/ and kernels/, the rule); the build runs
# the check, so a crossing fails the build.
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
# expect_fail_rule DESCRIPTION FILE INCLUDE RULE: as expect_fail, and the error names the rule (text of it)
expect_fail_rule() {
    local d="$tmp/$1"
    mkdir -p "$d/$(dirname "$2")"
    printf '#include <stdio.h>\n#include "%s"\n' "$3" >"$d/$2"
    if out="$(python3 "$check" "$d" 2>&1)"; then
        echo "FAIL: $1: $2 including $3 passed the check"
        fails=$((fails + 1))
    elif ! grep -F "$2:2: includes \"$3\"" <<<"$out" | grep -qF "$4"; then
        echo "FAIL: $1: the error does not name $2:2, $3 and the rule '$4': $out"
        fails=$((fails + 1))
    else
        echo "ok: $1 refused, naming the rule"
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
# the layers of every folder of worker/ and kernels/ (DEPENDS): the interfaces include no back-end, a back-end no
# other back-end, and each folder only the folders below it
expect_fail_rule model-pool worker/model/ring_attn.c kernels/cpu/pool.h "worker/model/ may include kernels/*, "
expect_fail_rule model-backend-rule worker/model/x.c kernels/cpu/cpu_kernels.h "never on a back-end"
expect_fail_rule interface-backend kernels/kernels.h kernels/cpu/cpu_kernels.h \
    "kernels/* may include nothing of worker/ and kernels/ (the kernel interface includes no back-end"
expect_fail_rule interface-cuda kernels/kernels.c kernels/cuda/cuda_kernels.h "the kernel interface includes no back-end"
expect_fail_rule cpu-cuda kernels/cpu/x.c kernels/cuda/cuda_kernels.h "includes no other back-end"
expect_fail_rule cuda-cpu kernels/cuda/backend.c kernels/cpu/cpu_kernels.h "includes no other back-end"
expect_fail_rule main-backend worker/grpo_worker.c kernels/cpu/pool.h "never on a back-end"
expect_fail_rule comm-model worker/comm/x.c worker/model/model.h "worker/comm/ may include worker/flight/ ("
expect_fail_rule flight-comm worker/flight/x.c worker/comm/comm.h "worker/flight/ may include nothing"
expect_fail_rule formats-tokenizer worker/formats/x.c worker/tokenizer/tokenizer.h "worker/formats/ may include nothing"
expect_fail_rule metrics-control worker/metrics/x.c worker/control/control.h "worker/metrics/ may include nothing"
expect_fail_rule tokenizer-data worker/tokenizer/x.c worker/data/dataset.h "worker/tokenizer/ may include"
expect_fail_rule data-step worker/data/x.c worker/step/batch.h "worker/data/ may include"
expect_fail_rule control-launch worker/control/x.c worker/launch/launch.h "worker/control/ may include"
expect_fail_rule plan-trainer worker/plan/x.c worker/trainer/trainer.h "worker/plan/ may include"
expect_fail_rule launch-model worker/launch/x.c worker/model/model.h "worker/launch/ may include"
expect_fail_rule rewards-gen worker/rewards/x.c worker/gen/generate.h "worker/rewards/ may include"
expect_fail_rule trainer-hybrid worker/trainer/x.c worker/hybrid/units.h "worker/trainer/ may include"
# the trainer library knows none of its step sources, nor the split-run protocol; the sources do not cross
expect_fail trainer-split-source worker/trainer/trainer_step.c worker/split/split_internal.h
expect_fail trainer-local-source worker/trainer/trainer.c worker/hybrid/hybrid_source.h
expect_fail_rule trainer-plane worker/trainer/x.c worker/plane/wire.h "worker/trainer/ may include"
expect_fail hybrid-split worker/hybrid/x.c worker/split/async_stream.h
expect_fail split-hybrid worker/split/x.c worker/hybrid/units.h
expect_fail rollout-split worker/rollout/x.c worker/split/split_internal.h
# a new folder of worker/ (or kernels/) must state its layer
mkdir -p "$tmp/newroom/worker/newroom"
printf '#include "common/log.h"\n' >"$tmp/newroom/worker/newroom/x.c"
# refused TREE WHAT REGEX: the check fails on TREE (WHAT: the case) with an error matching REGEX
refused() {
    local out
    if out="$(python3 "$check" "$1" 2>&1)"; then
        echo "FAIL: $2 passed the check"
        fails=$((fails + 1))
    elif ! grep -qE "$3" <<<"$out"; then
        echo "FAIL: the error for $2 does not match '$3': $out"
        fails=$((fails + 1))
    else
        echo "ok: $2 refused"
    fi
}
refused "$tmp/newroom" "a folder of worker/ without a layer" 'worker/newroom/x\.c: worker/newroom/ has no layer'
# the build runs the check (meson.build's check-layers target, built by default): a crossing fails the build
if grep -A2 "custom_target('check-layers'" "$root/meson.build" | grep -q "build_by_default : true" &&
    grep -A2 "custom_target('check-layers'" "$root/meson.build" | grep -q "scripts/check_layers.py"; then
    echo "ok: the build runs check_layers.py by default"
else
    echo "FAIL: meson.build's check-layers target is gone or not built by default"
    fails=$((fails + 1))
fi
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
refused "$tmp/cycle" "an include cycle among the model's rooms" \
    'worker/model/[ab]\.c:2: includes "[ab]\.h": closes an include cycle'
finish
