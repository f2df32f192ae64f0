/* Philox-4x32-10 counter-based RNG (Salmon et al., SC'11). Pure function of key and counter. */
#include "suanli/base.h"

#include <math.h>

void sl_philox4x32(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32), c2 = (uint32_t)ctr_hi,
             c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t sl_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint32_t o[4];
    sl_philox4x32(seed, stream, counter, o);
    return ((uint64_t)o[1] << 32) | o[0];
}

double sl_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (double)(sl_rng_u64(seed, stream, counter) >> 11) * (1.0 / 9007199254740992.0);
}

void sl_rng_fill_normal(float *out, int64_t n, uint64_t seed, uint64_t stream, float mean, float std) {
    for (int64_t i = 0; i < n; i += 2) {
        uint32_t o[4];
        sl_philox4x32(seed, stream, (uint64_t)(i / 2), o);
        double u1 = ((double)o[0] + 1.0) * (1.0 / 4294967297.0); /* (0,1) */
        double u2 = (double)o[1] * (1.0 / 4294967296.0);
        double r = sqrt(-2.0 * log(u1));
        out[i] = (float)(mean + std * r * cos(2.0 * M_PI * u2));
        if (i + 1 < n) out[i + 1] = (float)(mean + std * r * sin(2.0 * M_PI * u2));
    }
}

uint32_t sl_dropout_threshold(float p) {
    double t = (double)p * 4294967296.0; /* exact for a float p >= 2^-32: no rounding to reproduce */
    return t <= 0 ? 0u : t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

uint64_t sl_dropout_ctr_hi(uint64_t stream, int site) { return (stream << 16) | (uint64_t)(site & 0xffff); }

void sl_rng_dropout(uint64_t seed, uint64_t ctr_hi, uint64_t e0, int64_t n, float p, float *out) {
    uint32_t thr = sl_dropout_threshold(p), o[4];
    float keep = (float)(1.0 / (1.0 - (double)p)); /* as torch: scale = 1 / (1 - p) in double */
    int64_t i = 0;
    while (i < n) {
        uint64_t e = e0 + (uint64_t)i;
        sl_philox4x32(seed, ctr_hi, e >> 2, o);
        for (unsigned l = (unsigned)(e & 3); l < 4 && i < n; l++, i++) out[i] = o[l] >= thr ? keep : 0.0f;
    }
}
