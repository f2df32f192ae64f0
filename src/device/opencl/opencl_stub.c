/* Compiled instead of the OpenCL backend when it is not built (SL_OPENCL=OFF or no OpenCL found at
 * configure time; cmake/opencl.cmake): sl_backend_opencl() is always declared in suanli/device.h and
 * here returns NULL with a message saying why. The registry lists "opencl" only when it is built. */
#include "suanli/device.h"

sl_backend *sl_backend_opencl(void) {
    sl_fail(SL_ERR_UNSUPPORTED, "opencl backend: not built (configure with -DSL_OPENCL=ON and the OpenCL "
                                "headers: apt-get install ocl-icd-opencl-dev)");
    return NULL;
}
