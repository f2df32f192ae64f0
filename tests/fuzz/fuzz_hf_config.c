/* libFuzzer target: an HF model directory's config.json (and generation_config.json) as
 * `suanli generate --model` / `train --init-from` read it (sl_hf_load_config): any input is either a
 * config whose fields passed their checks or a one-line error; never a crash, undefined behaviour
 * (UBSan aborts in the fuzz build) or a leak. The first input byte chooses whether the rest is also
 * written as generation_config.json. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "suanli/model_io.h"

static void put(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, size, f);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_scratch("hfcfg", "", 1), *cfg = fuzz_scratch_file(0, "config.json"),
               *gen = fuzz_scratch_file(1, "generation_config.json");
    if (size < 1) return 0;
    put(cfg, data + 1, size - 1);
    if (data[0] & 1)
        put(gen, data + 1, size - 1);
    else
        unlink(gen);
    sl_llama_config c;
    sl_hf_info info;
    if (sl_hf_load_config(dir, &c, &info) == SL_OK) {
        if (info.n_eos < 0 || info.n_eos > SL_HF_MAX_EOS) abort();
    }
    return 0;
}
