/* OpenBLAS chooses its kernels from the CPU when it is loaded, and Debian 12's OpenBLAS 0.3.21 does not know
 * some recent CPUs (Sapphire Rapids as a VM shows it): it falls back to its Prescott (SSE3) kernels, 5-10x
 * slower. Only the OPENBLAS_CORETYPE environment variable, read at load, overrides that choice. So before main
 * (an ELF constructor, which runs after OpenBLAS's own), a binary whose CPU has AVX-512 or AVX2 while OpenBLAS
 * chose older kernels runs itself again, once, with OPENBLAS_CORETYPE naming the kernels the CPU can run
 * (SkylakeX, Haswell). A user's OPENBLAS_CORETYPE is left alone, and GRPO_BLAS_AUTO=0 turns this off. */
#include <cblas.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "pool.h"

static const char *g_reason = "OpenBLAS's own choice";
static const char *g_better; /* the kernels the CPU runs when a user's OPENBLAS_CORETYPE names older ones */

/* The kernels the CPU can run, best first: NULL when it has neither AVX-512 (with BW) nor AVX2 with FMA. */
static const char *wanted(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL;
}

/* Whether OpenBLAS's kernels `core` are at least as good as `want` (its names, any case). */
static bool good_enough(const char *core, const char *want)
{
    static const char *const avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
    static const char *const avx2[] = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"};
    const bool is512 = strcmp(want, "SkylakeX") == 0;
    const char *const *ok = is512 ? avx512 : avx2;
    const size_t n = is512 ? sizeof avx512 / sizeof *avx512 : sizeof avx2 / sizeof *avx2;
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(core, ok[i]) == 0)
            return true;
    return false;
}

__attribute__((constructor)) static void blas_select(int argc, char **argv)
{
    (void)argc;
    const char *auto_env = getenv("GRPO_BLAS_AUTO"), *set = getenv("OPENBLAS_CORETYPE");
    if (set) {
        g_reason = getenv("GRPO_BLAS_REEXEC") ? "chosen for this CPU" : "OPENBLAS_CORETYPE";
        const char *want = wanted();
        if (want && !getenv("GRPO_BLAS_REEXEC") && !good_enough(set, want))
            g_better = want;
        return;
    }
    /* GRPO_BLAS_PRETEND_CORE (tests): act as if OpenBLAS had chosen these kernels */
    const char *pretend = getenv("GRPO_BLAS_PRETEND_CORE");
    const char *want = wanted(), *core = pretend && *pretend ? pretend : openblas_get_corename();
    if ((auto_env && strcmp(auto_env, "0") == 0) || !want || !core || good_enough(core, want) || !argv)
        return;
    /* once: the new image finds OPENBLAS_CORETYPE set and goes on */
    unsetenv("GRPO_BLAS_PRETEND_CORE");
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("GRPO_BLAS_REEXEC", "1", 1);
    /* by its real path, not /proc/self/exe: the new image's name (ps, pgrep, /proc/PID/comm, what an operator's
     * pkill grpo-worker matches) is the path's last part, so it stays grpo-worker rather than "exe" */
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        execv(self, argv);
    }
    execv("/proc/self/exe", argv);
    /* no /proc, or exec refused: go on with the slow kernels, and say so */
    fprintf(stderr,
            "warning: OpenBLAS runs its %s kernels on a CPU that can run %s ones, and re-running with "
            "OPENBLAS_CORETYPE=%s failed; set it yourself for full speed\n",
            core, want, want);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("GRPO_BLAS_REEXEC");
}

const char *blas_kernels(char *buf, size_t len)
{
    const char *core = openblas_get_corename();
    const int threads = cpu_pool_threads();
    const char *cap = getenv("GRPO_CPU_ISA");
    snprintf(buf, len, "OpenBLAS %s kernels (%s); our kernels: %s%s; few-row products: %s; %d thread%s",
             core ? core : "?", g_reason, cpu_isa_name(cpu_isa()), cap && *cap ? " (GRPO_CPU_ISA)" : "",
             cpu_isa() == CPU_ISA_NONE ? "OpenBLAS" : cpu_isa_name(cpu_isa()), threads, threads == 1 ? "" : "s");
    return buf;
}

const char *blas_kernels_better(void) { return g_better; }
