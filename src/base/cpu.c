/* CPU feature detection via CPUID/XGETBV, with SUANLI_ISA override for tests. */
#include "suanli/base.h"

#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static sl_cpu_features g_feat;
static int g_feat_init;

#if defined(__x86_64__) || defined(__i386__)
static uint64_t xgetbv0(void) {
    uint32_t a, d;
    __asm__ volatile("xgetbv" : "=a"(a), "=d"(d) : "c"(0));
    return ((uint64_t)d << 32) | a;
}
#endif

/* Note [AMX permission]
 * AMX needs three things: CPUID (leaf 7: AMX-TILE, EDX bit 24; AMX-BF16, bit 22), the OS saving the tile
 * state (XCR0 bits 17 XTILECFG and 18 XTILEDATA), and, on Linux 5.16 and later, this process's permission
 * to use the 8 KiB of tile data, asked for once with arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
 * The permission is the process's (every thread, and children after fork), so it is asked for here, at
 * the first feature query; where it is refused (an older kernel, a sandbox) AMX is reported absent and the
 * AVX-512 kernels run. */
#if defined(__x86_64__) || defined(__i386__)
static int amx_usable(unsigned edx7, uint64_t xcr0) {
    if (!((edx7 >> 24) & 1) || !((edx7 >> 22) & 1)) return 0;
    if ((xcr0 & (3ull << 17)) != (3ull << 17)) return 0;
#if defined(__x86_64__) && defined(__linux__)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}
#endif

static void detect(sl_cpu_features *f) {
    memset(f, 0, sizeof *f);
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) { /* vendor: EBX, EDX, ECX */
        char v[13];
        memcpy(v, &b, 4), memcpy(v + 4, &d, 4), memcpy(v + 8, &c, 4), v[12] = 0;
        f->zen = !strcmp(v, "AuthenticAMD") || !strcmp(v, "HygonGenuine");
    }
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = xgetbv0();
    int ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
    if (!ymm_ok) return;
    f->fma = fma;
    f->f16c = (c >> 29) & 1;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    f->avx2 = (b >> 5) & 1;
    if (zmm_ok) {
        f->avx512f = (b >> 16) & 1;
        f->avx512bw = (b >> 30) & 1;
        f->avx512vl = (b >> 31) & 1;
        f->avx512_vnni = (c >> 11) & 1;
        unsigned a1, b1, c1, d1;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) f->avx512_bf16 = (a1 >> 5) & 1;
        f->amx_bf16 = amx_usable(d, xcr0);
    }
#endif
}

const sl_cpu_features *sl_cpu_features_get(void) {
    if (!g_feat_init) {
        sl_cpu_features f;
        detect(&f);
        const char *isa = getenv("SUANLI_ISA");
        if (isa && !strcmp(isa, "scalar")) {
            int zen = f.zen;         /* the vendor is not an ISA */
            memset(&f, 0, sizeof f); /* f16c too: the scalar f16 conversions run */
            f.zen = zen;
        } else if (isa && !strcmp(isa, "avx2")) {
            f.avx512f = f.avx512bw = f.avx512vl = f.avx512_bf16 = f.avx512_vnni = f.amx_bf16 = 0;
        } else if (isa && !strcmp(isa, "avx512")) {
            f.amx_bf16 =
                0; /* the AVX-512 kernels, AMX left out (SUANLI_ISA=amx or unset: everything found) */
        }
        g_feat = f;
        g_feat_init = 1;
    }
    return &g_feat;
}

const char *sl_cpu_isa_name(void) {
    const sl_cpu_features *f = sl_cpu_features_get();
    if (f->avx512f && f->avx512bw && f->avx512vl) return "avx512";
    if (f->avx2 && f->fma) return "avx2";
    return "scalar";
}
