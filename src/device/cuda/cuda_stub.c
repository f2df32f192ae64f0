/* Compiled instead of the CUDA backend when it is not built (SL_CUDA=OFF or no CUDA toolkit at configure
 * time; cmake/cuda.cmake): sl_backend_cuda() is always declared in suanli/device.h and here returns NULL
 * with a message saying why. The registry lists "cuda" only when it is built. */
#include "suanli/device.h"

sl_backend *sl_backend_cuda(void) {
    sl_fail(SL_ERR_UNSUPPORTED, "cuda backend: not built (configure with -DSL_CUDA=ON and a CUDA toolkit: "
                                "scripts/cuda_toolkit.sh)");
    return NULL;
}

void sl_cuda_inventory(sl_runtime_info *rt, sl_device_info *devs, int cap, int *n) {
    (void)devs;
    (void)cap;
    *n = 0;
    snprintf(rt->name, sizeof rt->name, "cuda");
    rt->built = 0;
    rt->n_devices = 0;
    snprintf(rt->note, sizeof rt->note,
             "not built (configure with -DSL_CUDA=ON and a CUDA toolkit: scripts/cuda_toolkit.sh)");
}
