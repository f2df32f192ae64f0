/* libFuzzer target: SentencePiece tokenizer.model loading (and encoding/decoding when it loads) must fail
 * cleanly on any input — never crash, hang or leak. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "suanli/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_scratch("sp", ".model", 0);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    sl_hf_tokenizer *t;
    if (sl_hf_tokenizer_load(path, &t) == SL_OK) {
        int32_t *ids = NULL;
        int n = 0;
        if (sl_hf_tokenizer_encode(t, "Hello,  world! \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 x\n", 1, &ids,
                                   &n) == SL_OK) {
            char buf[64], *out;
            size_t len;
            for (int i = 0; i < n; i++) (void)sl_hf_tokenizer_decode_one(t, ids[i], buf, sizeof buf);
            if (sl_hf_tokenizer_decode(t, ids, n, 1, &out, &len) == SL_OK) free(out);
        }
        free(ids);
        sl_hf_tokenizer_free(t);
    }
    return 0;
}
