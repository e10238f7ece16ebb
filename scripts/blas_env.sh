# Sourced by demo.sh and the benchmarks (not by the tests): pick OpenBLAS's kernel for this CPU when the
# environment does not. OpenBLAS 0.3.21 (Debian 12) does not recognise some recent server CPUs as seen
# inside VMs and falls back to its Prescott (SSE3) kernels, 5-10x slower; on such a CPU with AVX-512 we
# ask for the SkylakeX kernels, with AVX2 for Haswell. An OPENBLAS_CORETYPE already set is left alone,
# and the test suites never source this file (they run with whatever the machine gives).
if [ -z "${OPENBLAS_CORETYPE+x}" ] && [ -r /proc/cpuinfo ]; then
    _flags="$(grep -m1 '^flags' /proc/cpuinfo)"
    case "$_flags" in
    *avx512f*avx512bw* | *avx512bw*avx512f*) export OPENBLAS_CORETYPE=SkylakeX ;;
    *avx2*) export OPENBLAS_CORETYPE=Haswell ;;
    esac
    unset _flags
fi
