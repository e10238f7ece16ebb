#!/usr/bin/env bash
# Every kernel path this CPU can run, against the reference results of the kernel and model tests:
#  - OpenBLAS: each kernel set the CPU can run (OPENBLAS_CORETYPE Prescott always; Haswell with AVX2+FMA; SkylakeX
#    with AVX-512; Cooperlake with AVX512-BF16). The fp32 kernel tests (double loops, finite differences) and the
#    model test (PyTorch fixtures) run on each; `grpo-model info` shows that the set asked for is the set running.
#  - few-row products (decode): test_kernel_linear forces each ISA this CPU has itself (AVX2, AVX-512, OpenBLAS);
#    GRPO_CPU_ISA caps the products' ISA for a whole program (`grpo-model info` says which runs), and a value this
#    CPU cannot run or does not know is ignored with a line naming it.
#  - BF16 GEMMs (oneDNN): each BF16 ISA the CPU has (ONEDNN_MAX_CPU_ISA avx512_core_bf16, and avx512_core_amx on a
#    CPU with AMX) through test_kernel_bf16 and the BF16 run; and a CPU without BF16 (ONEDNN_MAX_CPU_ISA
#    avx512_core): the BF16 run falls back to float32 with one clear line and reproduces the float32 run.
# The vectorised exponential and the other auto-vectorised loops have a variant per ISA chosen by the same cap
# (kernels/cpu/isa_variants.h); test_kernel_isa forces each one and checks it bit for bit against scalar code.
# usage: test_isa_paths.sh (the build's programs and unit tests by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-isa
BF16_RUN="$(dirname "$0")/test_bf16_run.sh"
TESTS=()
for t in kernel_linear kernel_attention kernel_lmhead kernel_bf16 kernels_ctx model; do TESTS+=("$(prog "unit/$t")"); done
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
cpu_has() { [[ "$flags" == *" $1 "* ]]; }

tiny_model "$TMP/tiny"
expect "tiny model initialised" $?

sets=(Prescott)
cpu_has avx2 && cpu_has fma && sets+=(Haswell)
cpu_has avx512f && cpu_has avx512bw && sets+=(SkylakeX)
cpu_has avx512_bf16 && sets+=(Cooperlake)
echo "# OpenBLAS kernel sets this CPU runs: ${sets[*]}"
for set in "${sets[@]}"; do
    OPENBLAS_CORETYPE="$set" "$MODEL_TOOL" info "$TMP/tiny" >"$TMP/info-$set.txt" 2>&1
    grep -qi "^kernels  *OpenBLAS $set kernels (OPENBLAS_CORETYPE)" "$TMP/info-$set.txt"
    rc=$?; expect "OPENBLAS_CORETYPE=$set runs OpenBLAS's $set kernels ($(grep '^kernels' "$TMP/info-$set.txt"))" $rc
    for t in "${TESTS[@]}"; do
        OPENBLAS_CORETYPE="$set" "$t" >"$TMP/$set-$(basename "$t").log" 2>&1
        rc=$?; expect "$(basename "$t") on OpenBLAS $set" $rc
    done
done

# GRPO_CPU_ISA: the few-row products of a whole program as a CPU with less would run them
cpu_has avx2 && cpu_has fma && for cap in avx2 none; do
    GRPO_CPU_ISA=$cap "$MODEL_TOOL" info "$TMP/tiny" >"$TMP/info-cap-$cap.txt" 2>&1
    want=$cap; [ "$cap" = none ] && want=OpenBLAS
    grep -q "few-row products: $want;" "$TMP/info-cap-$cap.txt"
    rc=$?; expect "GRPO_CPU_ISA=$cap: $(grep -o 'few-row products: [^;]*' "$TMP/info-cap-$cap.txt")" $rc
    grep -q "our kernels: $cap (GRPO_CPU_ISA);" "$TMP/info-cap-$cap.txt"
    rc=$?; expect "GRPO_CPU_ISA=$cap: $(grep -o 'our kernels: [^;]*' "$TMP/info-cap-$cap.txt")" $rc
done
GRPO_CPU_ISA=avx1024 "$MODEL_TOOL" info "$TMP/tiny" >"$TMP/info-cap-bad.txt" 2>&1
grep -q "GRPO_CPU_ISA=avx1024 ignored: expected avx512, avx2 or none" "$TMP/info-cap-bad.txt"
expect "GRPO_CPU_ISA=avx1024 is ignored with a line naming it" $?

# BF16: oneDNN's ISA for the BF16 products, capped through its own variable
bf16_isas=()
cpu_has avx512_bf16 && bf16_isas+=(AVX512_CORE_BF16)
cpu_has amx_bf16 && bf16_isas+=(AVX512_CORE_AMX)
echo "# BF16 ISAs this CPU runs: ${bf16_isas[*]:-none}"
for isa in "${bf16_isas[@]}"; do
    for t in "${TESTS[@]}"; do
        case "$(basename "$t")" in
            test_kernel_bf16 | test_kernels_ctx) ;;
            *) continue ;;
        esac
        ONEDNN_MAX_CPU_ISA="$isa" "$t" >"$TMP/$isa-$(basename "$t").log" 2>&1
        rc=$?
        ! grep -q "skipped" "$TMP/$isa-$(basename "$t").log"
        rc=$((rc || $?))
        expect "$(basename "$t") with oneDNN capped at $isa (ran, not skipped)" $rc
    done
    ONEDNN_MAX_CPU_ISA="$isa" bash "$BF16_RUN" >"$TMP/$isa-run.log" 2>&1
    rc=$?
    grep -q "it says BF16 GEMMs run" "$TMP/$isa-run.log"
    rc=$((rc || $?))
    expect "BF16 run on $isa: BF16 GEMMs, within BF16 bounds of float32" $rc
done
# a CPU without BF16 products: oneDNN capped below them
ONEDNN_MAX_CPU_ISA=AVX512_CORE bash "$BF16_RUN" >"$TMP/nobf16-run.log" 2>&1
rc=$?
grep -q "a CPU without BF16 says so once and runs float32" "$TMP/nobf16-run.log"
expect "without BF16 (oneDNN capped at AVX512_CORE): one clear line, float32 reproduced" $((rc || $?))
finish
