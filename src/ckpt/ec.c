/* Reed–Solomon erasure coding of checkpoint stripes over Intel ISA-L (optional: SL_HAVE_ISAL, set by
 * cmake/optional.cmake when libisal-dev is installed). See src/ckpt/pool_internal.h.
 *
 * Note [Erasure code matrix]
 * The k+m x k encode matrix is ISA-L's Cauchy matrix (gf_gen_cauchy1_matrix): its top k rows are the
 * identity (data blocks are stored as they are) and every k x k submatrix of it is invertible, so any k
 * surviving blocks of a stripe rebuild the k data blocks. Decoding inverts the rows of the first k
 * surviving blocks and multiplies the survivors by the rows of the inverse that belong to the lost data
 * blocks (ISA-L's erasure_code example). Lost parity is not rebuilt: loading needs only the data. */
#include <string.h>

#include "ckpt/pool_internal.h"

#ifdef SL_HAVE_ISAL
#include <isa-l/erasure_code.h>

int sl_ec_available(void) { return 1; }

/* ec_encode_data takes an int length: run it over pieces of at most 1 GiB */
static void encode_pieces(size_t len, int k, int rows, unsigned char *tbls, uint8_t **src, uint8_t **dst) {
    const size_t piece = (size_t)1 << 30;
    uint8_t *s[SL_EC_MAX_K], *d[SL_EC_MAX_K + SL_EC_MAX_M];
    for (size_t off = 0; off < len; off += piece) {
        size_t n = len - off < piece ? len - off : piece;
        for (int i = 0; i < k; i++) s[i] = src[i] + off;
        for (int i = 0; i < rows; i++) d[i] = dst[i] + off;
        ec_encode_data((int)n, k, rows, tbls, s, d);
    }
}

sl_status sl_ckpt_ec_encode(int k, int m, size_t len, uint8_t **data, uint8_t **parity) {
    SL_ASSERT(k >= 1 && k <= SL_EC_MAX_K && m >= 1 && m <= SL_EC_MAX_M);
    unsigned char a[(SL_EC_MAX_K + SL_EC_MAX_M) * SL_EC_MAX_K], tbls[32 * SL_EC_MAX_K * SL_EC_MAX_M];
    gf_gen_cauchy1_matrix(a, k + m, k);
    ec_init_tables(k, m, &a[k * k], tbls);
    encode_pieces(len, k, m, tbls, data, parity);
    return SL_OK;
}

sl_status sl_ckpt_ec_decode(int k, int m, size_t len, uint8_t **blocks, const int *present) {
    SL_ASSERT(k >= 1 && k <= SL_EC_MAX_K && m >= 1 && m <= SL_EC_MAX_M);
    enum { N = SL_EC_MAX_K + SL_EC_MAX_M };
    unsigned char a[N * SL_EC_MAX_K], b[SL_EC_MAX_K * SL_EC_MAX_K], inv[SL_EC_MAX_K * SL_EC_MAX_K],
        c[SL_EC_MAX_K * SL_EC_MAX_K], tbls[32 * SL_EC_MAX_K * SL_EC_MAX_K];
    int src[SL_EC_MAX_K], lost[SL_EC_MAX_K], ns = 0, nl = 0;
    for (int i = 0; i < k + m && ns < k; i++)
        if (present[i]) src[ns++] = i;
    if (ns < k)
        return sl_fail(SL_ERR_FORMAT, "erasure code %d+%d: only %d of the %d blocks needed", k, m, ns, k);
    for (int i = 0; i < k; i++)
        if (!present[i]) lost[nl++] = i;
    if (nl == 0) return SL_OK;
    gf_gen_cauchy1_matrix(a, k + m, k);
    for (int i = 0; i < k; i++) memcpy(&b[i * k], &a[src[i] * k], (size_t)k);
    if (gf_invert_matrix(b, inv, k) != 0)
        return sl_fail(SL_ERR_INTERNAL, "erasure code %d+%d: singular decode matrix", k, m);
    for (int e = 0; e < nl; e++) memcpy(&c[e * k], &inv[lost[e] * k], (size_t)k);
    ec_init_tables(k, nl, c, tbls);
    uint8_t *s[SL_EC_MAX_K], *d[SL_EC_MAX_K];
    for (int i = 0; i < k; i++) s[i] = blocks[src[i]];
    for (int e = 0; e < nl; e++) d[e] = blocks[lost[e]];
    encode_pieces(len, k, nl, tbls, s, d);
    return SL_OK;
}

#else

int sl_ec_available(void) { return 0; }

static sl_status no_isal(void) {
    return sl_fail(SL_ERR_UNSUPPORTED,
                   "erasure coding needs Intel ISA-L: this build has none (install libisal-dev and rebuild)");
}
sl_status sl_ckpt_ec_encode(int k, int m, size_t len, uint8_t **data, uint8_t **parity) {
    (void)k, (void)m, (void)len, (void)data, (void)parity;
    return no_isal();
}
sl_status sl_ckpt_ec_decode(int k, int m, size_t len, uint8_t **blocks, const int *present) {
    (void)k, (void)m, (void)len, (void)blocks, (void)present;
    return no_isal();
}
#endif
