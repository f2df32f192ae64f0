/* libFuzzer target: the safetensors reader must reject any malformed file with an error, never crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "suanli/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_scratch("st", ".safetensors", 0);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    sl_safetensors *st;
    if (sl_safetensors_open(path, &st) == SL_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < sl_safetensors_count(st); i++) {
            const sl_st_tensor *t = sl_safetensors_get(st, i);
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)sl_safetensors_find(st, t->name);
        }
        (void)sl_safetensors_meta(st, "format");
        (void)sink;
        sl_safetensors_close(st);
    }
    return 0;
}
