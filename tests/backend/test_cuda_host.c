/* Host-side parts of the CUDA backend that need no GPU (built only with the CUDA backend; its conformance
 * suite skips without a device): supports_op for MATMUL marked SL_MATMUL_IP_ROUND (Note [Rounded weight
 * gradients]), which the cuBLAS path used to accept and then ignore. cu_supports reads only the node. */
#include "suanli/ops.h"
#include "testutil.h"

int cu_supports(const sl_tensor *n); /* src/device/cuda/cuda_ops.c */

static sl_tensor *mm(sl_ctx *c, sl_dtype dt, int ndim, int round) {
    sl_tensor *a = ndim == 2 ? sl_new_tensor_2d(c, dt, 4, 8) : sl_new_tensor_3d(c, dt, 2, 4, 8);
    sl_tensor *b = ndim == 2 ? sl_new_tensor_2d(c, dt, 8, 6) : sl_new_tensor_3d(c, dt, 2, 8, 6);
    sl_tensor *m = sl_matmul(c, a, b, 0, 0);
    if (m) m->iparams[SL_MATMUL_IP_ROUND] = round;
    return m;
}

int main(void) {
    sl_ctx *c = sl_ctx_new(256);
    TU_CHECK(c != NULL, "ctx");
    for (int bf = 0; bf <= 1; bf++) {
        sl_dtype dt = bf ? SL_BF16 : SL_F32;
        sl_tensor *m2 = mm(c, dt, 2, 0), *r2 = mm(c, dt, 2, SL_BF16), *r3 = mm(c, dt, 3, SL_BF16);
        sl_tensor *m3 = mm(c, dt, 3, 0), *rf = mm(c, dt, 2, SL_F16);
        TU_CHECK(m2 && r2 && r3 && m3 && rf, "matmul nodes (%s)", sl_dtype_name(dt));
        if (!(m2 && r2 && r3 && m3 && rf)) break;
        TU_CHECK(cu_supports(m2) && cu_supports(m3), "plain %s matmuls supported", sl_dtype_name(dt));
        TU_CHECK(cu_supports(r2), "2-D %s matmul rounded to bf16 supported", sl_dtype_name(dt));
        TU_CHECK(!cu_supports(r3), "batched %s matmul rounded to bf16 refused (CPU: 2-D only)",
                 sl_dtype_name(dt));
        TU_CHECK(!cu_supports(rf), "%s matmul with an unknown rounding refused", sl_dtype_name(dt));
    }
    sl_ctx_free(c);
    return tu_finish("test_cuda_host");
}
