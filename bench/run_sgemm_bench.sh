#!/usr/bin/env bash
# sgemm of OpenBLAS, BLIS and oneDNN side by side on the model's GEMM shapes (bench/sgemm_bench.c), at 1 and 2
# threads, OpenBLAS with the kernels kernels/blas_select.c would choose for this CPU (and, for comparison, the
# ones OPENBLAS_CORETYPE names when it is set). Installs Debian's libblis4-serial and libdnnl2 when missing.
#   bench/run_sgemm_bench.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-7}"
if [ ! -e /usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4 ] || [ ! -e /usr/lib/x86_64-linux-gnu/libdnnl.so.2 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libblis4-serial libdnnl2 >/dev/null
    else
        echo "install libblis4-serial and libdnnl2 (Debian) to compare with BLIS and oneDNN" >&2
    fi
fi
out="${OUT:-build/bench-results/sgemm-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
cc -O2 -std=c17 -Wall -o "$out/sgemm_bench" bench/sgemm_bench.c -ldl -lm
want=""
grep -qw avx512bw /proc/cpuinfo && want=SkylakeX
[ -z "$want" ] && grep -qw avx2 /proc/cpuinfo && want=Haswell
for core in ${want:+$want} ${OPENBLAS_CORETYPE:+$OPENBLAS_CORETYPE}; do
    for t in 1 2; do
        echo "== OpenBLAS $core kernels, $t thread(s) ($(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg))"
        OPENBLAS_CORETYPE=$core OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "$out/sgemm_bench" "$reps"
    done
done | tee "$out/summary.md"
