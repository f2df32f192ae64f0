/* libFuzzer target: checkpoint manifests (verify + inspect) must fail cleanly on any input. A small valid
 * shard file sits next to the manifest so well-formed inputs reach the shard and checksum paths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "suanli/ckpt.h"
#include "suanli/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *dir, *path;
    if (!dir) {
        dir = fuzz_scratch("ck", "", 1);
        float v[4] = {1, 2, 3, 4};
        sl_st_tensor t = {
            .name = "param/a@0", .dtype = "F32", .ndim = 1, .shape = {4}, .data = v, .nbytes = sizeof v};
        sl_safetensors_write(fuzz_scratch_file(0, "shard-r00000.safetensors"), &t, 1, NULL);
        path = fuzz_scratch_file(1, "manifest.json");
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    (void)sl_ckpt_verify(dir);
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        (void)sl_ckpt_inspect(dir, null);
        fclose(null);
    }
    return 0;
}
