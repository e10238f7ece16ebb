/* ISA variants of a loop kernel, chosen at run time by cpu_isa() (kernels/cpu/isa.c).
 *
 * CPU_ISA_VARIANTS(linkage, name, params, args) defines `linkage void name params`, which calls name##_body (a
 * static inline function the file defines first) compiled three times: for AVX-512, for AVX2 and for the baseline
 * x86-64, the compiler vectorising each copy for its ISA. It replaces GCC's target_clones, whose choice followed the
 * CPU alone: the same three variants (the same target strings), but GRPO_CPU_ISA and the tests choose among them. */
#ifndef GRPO_KERNELS_CPU_ISA_VARIANTS_H
#define GRPO_KERNELS_CPU_ISA_VARIANTS_H

#include "cpu_kernels.h"

/* linkage is `static` or nothing, params and args parenthesised lists: none of them can take parentheses */
// NOLINTBEGIN(bugprone-macro-parentheses)
#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_ISA_VARIANTS(linkage, name, params, args)                                                                  \
    __attribute__((target("avx512f"))) static void name##_avx512 params { name##_body args; }                          \
    __attribute__((target("avx2"))) static void name##_avx2 params { name##_body args; }                               \
    static void name##_base params { name##_body args; }                                                               \
    linkage void name params                                                                                           \
    {                                                                                                                  \
        switch (cpu_isa()) {                                                                                           \
        case CPU_ISA_AVX512: name##_avx512 args; return;                                                               \
        case CPU_ISA_AVX2: name##_avx2 args; return;                                                                   \
        default: name##_base args; return;                                                                             \
        }                                                                                                              \
    }
#else
#define CPU_ISA_VARIANTS(linkage, name, params, args)                                                                  \
    linkage void name params { name##_body args; }
#endif
// NOLINTEND(bugprone-macro-parentheses)

#endif
