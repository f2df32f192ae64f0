/* Reed–Solomon erasure code of pooled checkpoints (sl_ckpt_ec_encode/decode over ISA-L): for several k+m and
 * block lengths, every pattern of up to m lost blocks decodes to the original data bytes; fewer than k
 * intact blocks is an error. Skipped (passes with a note) in a build without ISA-L, where both calls must
 * return SL_ERR_UNSUPPORTED. */
#include <stdlib.h>
#include <string.h>

#include "suanli/ckpt.h"
#include "testutil.h"

int main(void) {
    if (!sl_ckpt_ec_available()) {
        uint8_t b[64], *p[2] = {b, b};
        int present[2] = {1, 1};
        TU_CHECK(sl_ckpt_ec_encode(1, 1, 64, p, p + 1) == SL_ERR_UNSUPPORTED, "encode without ISA-L");
        TU_CHECK(sl_ckpt_ec_decode(1, 1, 64, p, present) == SL_ERR_UNSUPPORTED &&
                     strstr(sl_errmsg(), "libisal-dev"),
                 "decode without ISA-L names the package");
        printf("note: no ISA-L in this build\n");
        return tu_finish("test_ckpt_ec");
    }
    const int km[][2] = {{1, 1}, {2, 1}, {3, 2}, {4, 2}, {6, 3}, {16, 8}};
    const size_t lens[] = {64, 4096 + 64, 1 << 20};
    for (size_t t = 0; t < sizeof km / sizeof km[0]; t++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            int k = km[t][0], m = km[t][1], n = k + m;
            size_t len = lens[l];
            if (n > 12 && len > 4096 + 64) continue; /* 2^24 patterns would be too many: small blocks only */
            uint8_t *mem = malloc(len * (size_t)n * 2), *blk[24], *orig[24];
            for (int i = 0; i < n; i++) {
                blk[i] = mem + len * (size_t)i;
                orig[i] = mem + len * (size_t)(n + i);
            }
            uint64_t s = 0x9e3779b97f4a7c15ull * (t * 7 + l + 1);
            for (size_t i = 0; i < len * (size_t)k; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                blk[i / len][i % len] = (uint8_t)(s >> 56);
            }
            TU_CHECK(sl_ckpt_ec_encode(k, m, len, blk, blk + k) == SL_OK, "encode %d+%d", k, m);
            for (int i = 0; i < n; i++) memcpy(orig[i], blk[i], len);
            int patterns = 0, bad = 0;
            for (unsigned mask = 0; mask < (1u << n); mask++) { /* mask: lost blocks */
                int lost = __builtin_popcount(mask);
                if (lost > m || (n > 12 && lost > 2)) continue;
                int present[24];
                for (int i = 0; i < n; i++) {
                    present[i] = !(mask >> i & 1);
                    if (!present[i]) memset(blk[i], 0xA5, len);
                }
                if (sl_ckpt_ec_decode(k, m, len, blk, present) != SL_OK) bad++;
                for (int i = 0; i < k; i++) bad += memcmp(blk[i], orig[i], len) != 0;
                for (int i = 0; i < n; i++) memcpy(blk[i], orig[i], len);
                patterns++;
            }
            TU_CHECK(bad == 0, "%d+%d, %zu-byte blocks: %d of %d loss patterns decoded wrongly", k, m, len,
                     bad, patterns);
            /* m+1 lost blocks: an error, not garbage */
            int present[24];
            for (int i = 0; i < n; i++) present[i] = i > m;
            TU_CHECK(sl_ckpt_ec_decode(k, m, len, blk, present) == SL_ERR_FORMAT, "%d+%d: %d lost is refused",
                     k, m, m + 1);
            free(mem);
        }
    return tu_finish("test_ckpt_ec");
}
