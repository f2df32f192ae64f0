/* Compiled instead of the OpenCL backend when it is not built (SL_OPENCL=OFF or no OpenCL found at
 * configure time; cmake/opencl.cmake): sl_backend_opencl() is always declared in suanli/device.h and
 * here returns NULL with a message saying why. The registry lists "opencl" only when it is built. */
#include "suanli/device.h"

sl_backend *sl_backend_opencl(void) {
    sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: not built (configure with -DSL_OPENCL=ON and the OpenCL "
                                "headers: apt-get install ocl-icd-opencl-dev)");
    return NULL;
}

sl_backend *sl_backend_opencl_select(const char *arg) {
    (void)arg;
    return sl_backend_opencl();
}

void sl_opencl_inventory(sl_runtime_info *rt, sl_device_info *devs, int cap, int *n) {
    (void)devs;
    (void)cap;
    *n = 0;
    snprintf(rt->name, sizeof rt->name, "opencl");
    rt->built = 0;
    rt->n_devices = 0;
    snprintf(rt->note, sizeof rt->note,
             "not built (configure with -DSL_OPENCL=ON and the OpenCL headers: ocl-icd-opencl-dev)");
}
