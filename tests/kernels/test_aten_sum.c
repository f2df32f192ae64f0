/* ATen's float summation order (Note [ATen's summation order], src/device/cpu/kernels/aten_sum.c) against
 * torch.sum itself: tests/fixtures/aten_sum.safetensors (scripts/gen_aten_sum_fixture.py) holds random rows
 * and matrices whose entries span 2^-8..2^8, so another order rounds differently, and their torch sums. Every
 * sum must be bitwise torch's; the same data summed in index order must differ somewhere (the check can
 * fail). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/kernels/aten_sum.h"
#include "suanli/safetensors.h"
#include "testutil.h"

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/aten_sum.safetensors", SL_SOURCE_DIR);
    sl_safetensors *st;
    if (sl_safetensors_open(path, &st) != SL_OK) {
        TU_CHECK(0, "%s", sl_errmsg());
        return tu_finish("test_aten_sum");
    }
    int rows = 0, row_diff = 0, cols = 0, col_diff = 0, seq_diff = 0;
    for (int i = 0; i < sl_safetensors_count(st); i++) {
        const sl_st_tensor *t = sl_safetensors_get(st, i);
        char key[64];
        if (!strncmp(t->name, "row.", 4)) {
            int64_t R = t->shape[0], n = t->shape[1];
            snprintf(key, sizeof key, "rsum.%s", t->name + 4);
            const sl_st_tensor *s = sl_safetensors_find(st, key);
            TU_CHECK(s && (int64_t)(s->nbytes / 4) == R, "%s: no %s", t->name, key);
            if (!s) continue;
            for (int64_t r = 0; r < R; r++) {
                const float *p = (const float *)t->data + r * n;
                float got = sl_aten_row_sum(p, n), want = ((const float *)s->data)[r], seq = 0;
                for (int64_t k = 0; k < n; k++) seq += p[k];
                rows++;
                seq_diff += seq != want;
                if (got != want) {
                    row_diff++;
                    printf("row sum n %lld, row %lld: %.9g, torch %.9g\n", (long long)n, (long long)r, got,
                           want);
                }
            }
        } else if (!strncmp(t->name, "col.", 4)) {
            int64_t R = t->shape[0], C = t->shape[1];
            snprintf(key, sizeof key, "csum.%s", t->name + 4);
            const sl_st_tensor *s = sl_safetensors_find(st, key);
            TU_CHECK(s && (int64_t)(s->nbytes / 4) == C, "%s: no %s", t->name, key);
            if (!s) continue;
            float *got = malloc(sizeof(float) * (size_t)C);
            sl_aten_col_sums(t->data, R, C, C, got);
            for (int64_t c = 0; c < C; c++) {
                const float want = ((const float *)s->data)[c];
                float seq = 0;
                for (int64_t r = 0; r < R; r++) seq += ((const float *)t->data)[r * C + c];
                cols++;
                seq_diff += seq != want;
                if (got[c] != want) {
                    col_diff++;
                    printf("column sum %lldx%lld, column %lld: %.9g, torch %.9g\n", (long long)R,
                           (long long)C, (long long)c, got[c], want);
                }
            }
            free(got);
        }
    }
    printf("torch.sum: %d row sums (%d differ), %d column sums (%d differ); index order differs in %d\n",
           rows, row_diff, cols, col_diff, seq_diff);
    TU_CHECK(rows >= 80 && cols >= 400, "fixture holds %d rows and %d columns", rows, cols);
    TU_CHECK(row_diff == 0 && col_diff == 0, "%d row and %d column sums are not torch's", row_diff, col_diff);
    TU_CHECK(seq_diff > 20,
             "index order matches torch in all but %d sums: the fixture cannot tell orders apart", seq_diff);
    sl_safetensors_close(st);
    return tu_finish("test_aten_sum");
}
