/* The vector ISA the kernels we write run with: the best this CPU has, capped by GRPO_CPU_ISA or by a test.
 *
 * Why one choice for every kernel: a run's bits depend on the ISA (an AVX-512 variant contracts a*b+c into one
 * fused multiply-add where the AVX2 variant rounds twice, and the few-row products sum in 16 lanes instead of 8), so
 * sampled tokens, and a whole trajectory, differ between an AVX2 and an AVX-512 CPU. GCC's target_clones picked a
 * variant per function from the CPU alone, so nothing could make this machine compute what an AVX2 machine
 * computes. With one capped choice, GRPO_CPU_ISA=avx2 (and OPENBLAS_CORETYPE=Haswell) runs here what an AVX2 CPU
 * runs, bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

static enum cpu_isa best_isa(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return CPU_ISA_AVX2;
#endif
    return CPU_ISA_NONE;
}

static int g_forced = -1; /* a test's choice, or -1 */

/* GRPO_CPU_ISA=avx512, avx2 or none caps the choice. An unknown value, or one this CPU cannot run, is ignored with a
 * line on stderr. */
static enum cpu_isa capped_isa(void)
{
    enum cpu_isa best = best_isa();
    const char *cap = getenv("GRPO_CPU_ISA");
    if (!cap || !*cap)
        return best;
    enum cpu_isa want = strcmp(cap, "avx512") == 0 ? CPU_ISA_AVX512
                        : strcmp(cap, "avx2") == 0 ? CPU_ISA_AVX2
                        : strcmp(cap, "none") == 0 ? CPU_ISA_NONE
                                                   : CPU_ISA_AUTO;
    if (want == CPU_ISA_AUTO || (int)want > (int)best) {
        fprintf(stderr, "GRPO_CPU_ISA=%s ignored: expected avx512, avx2 or none, and one this CPU runs (%s)\n", cap,
                cpu_isa_name(best));
        return best;
    }
    return want;
}

enum cpu_isa cpu_isa(void)
{
    static int chosen = -1;
    if (chosen < 0)
        chosen = (int)capped_isa();
    return g_forced >= 0 ? (enum cpu_isa)g_forced : (enum cpu_isa)chosen;
}

bool cpu_force_isa(enum cpu_isa isa)
{
    if (isa == CPU_ISA_AUTO) {
        g_forced = -1;
        return true;
    }
    if ((int)isa > (int)best_isa())
        return false; /* this CPU cannot run it */
    g_forced = (int)isa;
    return true;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_AVX512: return "avx512";
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_NONE: return "none";
    default: return "auto";
    }
}
