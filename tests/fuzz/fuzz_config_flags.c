/* libFuzzer target: a `--config FILE.json` as every command reads it (src/cli/flags.c, the same flag
 * types as `suanli train`: integers with ranges, floats, strings, booleans): any input is applied or
 * refused with a one-line error naming the key; never a crash, undefined behaviour or a leak. A value that
 * was accepted must lie in its flag's range. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli/flags.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_scratch("config", ".json", 0);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    const char *config = NULL, *data_path = NULL, *dtype = "f32";
    int64_t layers = 12, iters = 10, seed = 1234;
    double lr = 1e-3, clip = 1.0;
    int bf16 = 0, fp16 = 0;
    sl_flag flags[] = {
        {"config", SL_FLAG_STR, &config, 0, 0, "", 0},
        {"data-path", SL_FLAG_STR, &data_path, 0, 0, "", 0},
        {"dtype", SL_FLAG_STR, &dtype, 0, 0, "", 0},
        {"num-layers", SL_FLAG_INT, &layers, 1, 4096, "", 0},
        {"train-iters", SL_FLAG_INT, &iters, 0, 1e12, "", 0},
        {"seed", SL_FLAG_INT, &seed, 0, 9.007199254740992e15, "", 0},
        {"lr", SL_FLAG_FLOAT, &lr, 0, 10, "", 0},
        {"clip-grad", SL_FLAG_FLOAT, &clip, 0, 1e30, "", 0},
        {"bf16", SL_FLAG_BOOL, &bf16, 0, 1, "", 0},
        {"fp16", SL_FLAG_BOOL, &fp16, 0, 1, "", 0},
    };
    int nf = (int)(sizeof flags / sizeof flags[0]);
    char *argv[] = {"train", "--config", path, NULL};
    if (sl_flags_parse(flags, nf, 3, argv, 1) == SL_OK) {
        if (layers < 1 || layers > 4096 || iters < 0 || seed < 0 || !(lr >= 0 && lr <= 10) ||
            !(clip >= 0 && clip <= 1e30) || (bf16 != 0 && bf16 != 1) || (fp16 != 0 && fp16 != 1) || !dtype ||
            !*dtype)
            abort();
    }
    sl_flags_config_release(); /* the strings a config file gave to string flags */
    return 0;
}
