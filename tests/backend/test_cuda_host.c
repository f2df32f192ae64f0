/* Host-side parts of the CUDA backend that need no GPU (built only with the CUDA backend; its conformance
 * suite skips without a device): supports_op for MATMUL marked SL_MATMUL_IP_ROUND (Note [Rounded weight
 * gradients]), which the cuBLAS path used to accept and then ignore, and for the ops ported from the OpenCL
 * backend (dropout, the vocab-parallel ops, the half numerics of RoPE and attention, f16 storage), so the
 * conformance suite runs their cases on a GPU instead of skipping them. cu_supports reads only the node. */
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
    /* f16 storage (Note [CUDA f16 storage]) */
    sl_tensor *x = sl_new_tensor_2d(c, SL_F32, 4, 8), *x2 = sl_new_tensor_2d(c, SL_F32, 4, 8);
    sl_tensor *h = sl_cast(c, x, SL_F16), *hf = sl_cast(c, h, SL_F32);
    TU_CHECK(h && hf && cu_supports(h) && cu_supports(hf), "cast f32 <-> f16 supported");
    TU_CHECK(cu_supports(sl_cont(c, h)) && cu_supports(sl_concat(c, h, h, 0)), "f16 cont / concat supported");
    TU_CHECK(cu_supports(sl_zeros(c, SL_F16, 2, (int64_t[]){4, 8})), "f16 zeros supported");
    sl_tensor *h2 = mm(c, SL_F16, 2, 0), *h3 = mm(c, SL_F16, 3, 0), *hr = mm(c, SL_F16, 2, SL_BF16);
    TU_CHECK(h2 && h3 && hr && cu_supports(h2) && cu_supports(h3), "f16 x f16 matmuls supported");
    TU_CHECK(hr && !cu_supports(hr), "f16 matmul rounded to bf16 refused");
    /* dropout (Note [CUDA dropout]) */
    TU_CHECK(cu_supports(sl_dropout(c, x, 0.3f, 1)), "dropout supported");
    TU_CHECK(cu_supports(sl_dropout_add(c, x, x2, 0.2f, 4)), "dropout with a residual supported");
    sl_tensor *qkv = sl_new_tensor_2d(c, SL_F32, 2 * 8, 4 * 8);
    sl_tensor *q = sl_reshape(c, qkv, 4, (int64_t[]){2, 8, 4, 8});
    sl_tensor *att = sl_attention(c, q, q, q);
    TU_CHECK(att && cu_supports(att), "attention supported");
    att = sl_attention_dropout(att, 0.25f, 7);
    att->iparams[SL_DROPOUT_IP_HEADS] = 7; /* a TP shard */
    att->iparams[SL_DROPOUT_IP_HEAD0] = 2;
    TU_CHECK(cu_supports(att), "attention with dropout supported");
    for (int hm = 1; hm <= 4; hm++) {
        att->iparams[2] = hm;
        TU_CHECK(cu_supports(att), "half attention mode %d supported", hm);
    }
    att->iparams[2] = 5;
    TU_CHECK(!cu_supports(att), "attention numerics mode 5 refused");
    sl_tensor *rope = sl_rope(c, q, 0, 10000.0f);
    for (int m = 0; m <= 6; m++) {
        rope->iparams[2] = m;
        TU_CHECK(cu_supports(rope), "rope numerics %d supported", m);
    }
    rope->iparams[2] = 7;
    TU_CHECK(!cu_supports(rope), "rope numerics 7 refused");
    /* the vocabulary-parallel ops (Note [CUDA tensor parallelism]) */
    sl_tensor *tab = sl_new_tensor_2d(c, SL_F32, 16, 8), *ids = sl_new_tensor_1d(c, SL_I32, 4);
    TU_CHECK(cu_supports(sl_embedding_shard(c, tab, ids, 16)), "vocab-shard embedding supported");
    sl_tensor *ce = sl_cross_entropy_vp(c, sl_new_tensor_2d(c, SL_F32, 4, 16), ids, 16, 2);
    TU_CHECK(ce && ce->op == SL_OP_CE_VP && cu_supports(ce), "CE_VP supported");
    const sl_tensor *st = ce;
    for (int i = 0; i < 4 && st && st->op != SL_OP_CE_VP_STATS; i++)
        st = st->src[st->op == SL_OP_CE_VP ? 2 : 0];
    TU_CHECK(st && st->op == SL_OP_CE_VP_STATS && cu_supports(st), "CE_VP_STATS supported");
    sl_ctx_free(c);
    return tu_finish("test_cuda_host");
}
