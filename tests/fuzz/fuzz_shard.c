/* libFuzzer target: the token-shard reader (sl_shard_read) must reject any malformed file with an error and
 * never crash, hang or leak; a shard it accepts must keep the promises of its contract (every token in
 * [0, vocab_size), num_tokens from the header). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "suanli/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_scratch("shard", ".bin", 0);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    sl_shard_header h;
    int32_t *tokens = NULL;
    int64_t n = -1;
    if (sl_shard_read(path, &h, &tokens, &n) == SL_OK) {
        if (n < 0 || (uint64_t)n != h.num_tokens) abort();
        for (int64_t i = 0; i < n; i++)
            if (tokens[i] < 0 || (uint32_t)tokens[i] >= h.vocab_size) abort();
    }
    free(tokens);
    return 0;
}
