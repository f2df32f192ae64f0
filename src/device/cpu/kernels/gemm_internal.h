/* gemm_internal.h — what the GEMM driver (gemm.c) and its ISA-specific kernels (gemm_avx2.c,
 * gemm_avx512.c) share. Not part of any public API.
 *
 * Note [GEMM structure]
 * A GotoBLAS/BLIS-style blocked GEMM on row-major data. For each block of MC rows of op(A) and KC of K,
 * op(A) is packed into micro-panels of MR rows (k-major: panel[k][0..MR)); for each chunk of at most NC
 * columns of op(B), op(B) is packed into micro-panels of NR columns (k-major: panel[k][0..NR)). The
 * micro-kernel multiplies one A micro-panel (kept in L1) by one B micro-panel (streamed from L2) into an
 * MR x NR tile of C held in registers. Packing absorbs the four transpose cases and zero-pads the edges,
 * so kernels only see full tiles (they mask the stores of partial ones). Packed elements may be fp32
 * (esz 4, kgran 1) or bf16 pairs for vdpbf16ps (esz 2, kgran 2: panel[k/2][i][k%2]).
 * Each element of C is summed over K in the same order (KC blocks in sequence, k ascending inside the
 * micro-kernel) whatever the thread partition, so results do not depend on the thread count. For that,
 * every partition (thread shares, MC blocks, NC chunks) starts at a multiple of MR / NR from 0, so an element
 * always lands in the same kind of tile (full or edge: their writebacks may round differently).
 * Blocking (Note [GEMM blocking on Zen 3] in gemm_avx2.c for the AVX2 numbers): kc and nc are fixed per
 * kernel; the rows of a thread are packed in one block when they are at most mc_max, else in blocks of mc.
 * Bias (sl_sgemm_bias): in the first K block the driver writes the bias into each tile's rows of C just
 * before the tile's kernel (in L1 when the kernel reads it) and runs the kernels with beta = 1, so C =
 * ((bias + sum over K block 0) + sum over K block 1) + ...: a fixed order, whatever the partition. (It used
 * to write the whole chunk's rows first, mc x nc, up to 2 MiB, read back from L2 or beyond: the baby GPT's
 * step, 128-deep products with a bias, 2-4 % shorter at 1 thread, two builds side by side; GPT-2
 * 124M the same.)
 */
#ifndef SL_DEVICE_CPU_KERNELS_GEMM_INTERNAL_H
#define SL_DEVICE_CPU_KERNELS_GEMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

typedef struct sl_gemm_args {
    int transA, transB;
    int64_t M, N, K;
    float alpha, beta;
    const void *A; /* float or uint16_t (bf16) */
    int64_t lda;
    const void *B;
    int64_t ldb;
    float *C;
    int64_t ldc;
    const float *bias; /* NULL, or N floats added to every row of C (then beta is 0) */
    /* 1: B is fp32 that enters the product rounded to bf16 (sl_f32_to_bf16), A bf16 (Note [Fused weight
     * casts], src/ops/backward.c); only impls with b_f32 set see it, the others get a rounded copy of B */
    int b_f32;
    /* SL_GEMM_ROUND_STORE / _ADD: C (= | +=) the product rounded to bf16 (sl_round_bf16_f32), applied to
     * each micro-tile as the kernel finishes it (Note [Rounded products in the GEMM], gemm.c); only with
     * K <= the impl's kc, alpha 1, no bias. SL_GEMM_ROUND_OUT: the finished value of each element of C
     * (alpha, beta and bias applied) rounded to bf16 in place, any K (Note [Rounded Linear outputs],
     * gemm.c). 0: plain alpha / beta / bias. */
    int c_round;
} sl_gemm_args;
enum { SL_GEMM_ROUND_NONE, SL_GEMM_ROUND_STORE, SL_GEMM_ROUND_ADD, SL_GEMM_ROUND_OUT };
enum {
    SL_GEMM_TILE_MAX = 32 * 48
}; /* the largest mr x nr (a rounded product's micro-tile is on the stack) */

/* Pack rows [i0, i0+ni) of op(A), k in [k0, k0+kc), into ceil(ni/mr) consecutive micro-panels of
 * ceil(kc/kgran)*kgran*mr elements each, zero-padding rows past ni and k past kc. */
typedef void (*sl_gemm_pack_a_fn)(const sl_gemm_args *g, int64_t i0, int64_t ni, int64_t k0, int64_t kc,
                                  int mr, void *dst);
/* Pack columns [j0, j0+nj) of op(B), k in [k0, k0+kc), into ceil(nj/nr) micro-panels likewise. */
typedef void (*sl_gemm_pack_b_fn)(const sl_gemm_args *g, int64_t j0, int64_t nj, int64_t k0, int64_t kc,
                                  int nr, void *dst);
/* C[0..mr)[0..nr) = alpha * (a-panel @ b-panel) + beta * C over ksteps steps of kgran k each;
 * beta == 0: C is write-only. mr <= MR, nr <= NR: only that part of the tile is read or written. */
typedef void (*sl_gemm_kernel_fn)(int64_t ksteps, const void *a, const void *b, float *c, int64_t ldc,
                                  float alpha, float beta, int mr, int nr);

typedef struct sl_gemm_impl {
    const char *name;
    int mr, nr;     /* register tile */
    int kgran;      /* k per kernel step: 1 (fp32) or 2 (bf16 pairs) */
    int esz;        /* bytes per packed element */
    int in_bf16;    /* inputs A, B are bf16 (uint16_t) rather than fp32 */
    int64_t kc;     /* K block (multiple of kgran) */
    int64_t mc;     /* rows of op(A) packed at once (multiple of mr) */
    int64_t mc_max; /* a thread with at most this many rows packs them as one block (B is packed once);
                     * with more, blocks of mc rows (an A block that stays in L2). 0: same as mc */
    int64_t nc;     /* columns of op(B) packed at once per thread (multiple of nr) */
    int kc_even; /* 1: K is cut into equal blocks of at most kc (Note [Even K blocks], gemm.c); 0: blocks of
                  * exactly kc and a remainder */
    sl_gemm_pack_a_fn pack_a;
    sl_gemm_pack_b_fn pack_b;
    sl_gemm_kernel_fn kernel;
    /* NULL, or run on each thread before its first kernel call and after its last one in a GEMM call
     * (the AMX tile configuration, Note [AMX GEMM] in gemm_amx.c) */
    void (*thread_begin)(void);
    void (*thread_end)(void);
    int b_f32; /* pack_b also takes fp32 B with sl_gemm_args.b_f32 (rounding it to bf16 as it packs) */
    /* NULL, or the kernel on mr full rows of a row-major fp32 A read in place (rows lda apart), for
     * products whose packing of A costs as much as a good part of their FMAs (Note [Unpacked A]) */
    void (*kernel_ua)(int64_t ksteps, const float *a, int64_t lda, const void *b, float *c, int64_t ldc,
                      float alpha, float beta, int mr, int nr);
    /* NULL, or the kernel on a full nr-wide panel of a K x N op(B) (transB 0) read in place, rows ldb
     * elements apart (fp32, or with in_bf16 bf16 unless b_f32), that stores the packed panel into bpack as it
     * reads it (Note [Packing B in the first tile], gemm.c). A is a packed panel (lda 0) or mr = MR rows in
     * place, lda apart. rnd (only impls with kernel_round): the tile is written as kernel_round does with
     * bias and add 0; else as kernel does. With kgran 2, ksteps k pairs: kc is even. */
    void (*kernel_pb)(int64_t ksteps, const void *a, int64_t lda, const void *b, int64_t ldb, int b_f32,
                      void *bpack, float *c, int64_t ldc, float alpha, float beta, const float *bias, int rnd,
                      int mr);
    /* NULL, or with kernel_pb: the kernel on a full packed panel (A, bias and rnd as for kernel_pb) that also
     * prefetches rows of B's next panel (pf_bytes each from pf, pf_ld bytes apart) into L1, one row for every
     * pf_every of its k (an even number: with kgran 2, one per pf_every / 2 k pairs), so that pf_every calls
     * bring in the next panel (Note [Packing B in the first tile], gemm.c) */
    void (*kernel_pf)(int64_t ksteps, const void *a, int64_t lda, const void *b, float *c, int64_t ldc,
                      float alpha, float beta, const float *bias, int rnd, int mr, const char *pf,
                      int64_t pf_ld, int pf_bytes, int pf_every);
    /* NULL, or the kernel with the bf16 rounding of its tile done in registers before the tile is stored
     * (Note [Rounding in the writeback], gemm.c): t = alpha * acc, then beta * C as the plain writeback does,
     * then + bias[j] (bias non-NULL), and C = sl_round_bf16_f32(t); with add (alpha 1, beta 0, no bias)
     * C = C + sl_round_bf16_f32(acc) */
    void (*kernel_round)(int64_t ksteps, const void *a, const void *b, float *c, int64_t ldc, float alpha,
                         float beta, const float *bias, int add, int mr, int nr);
} sl_gemm_impl;

/* Per-thread buffers, grown on demand and reused (no allocation in steady state), freed when the thread
 * exits: the packing workspace, the rounded copy of an fp32 B (gemm.c), the AMX packer's rounding buffer
 * (gemm_amx.c). NULL if the allocation fails (the caller falls back). */
enum { SL_GEMM_TLB_PACK, SL_GEMM_TLB_BROUND, SL_GEMM_TLB_BCONV, SL_GEMM_TLB_COUNT };
void *sl_gemm_tlbuf(int slot, size_t bytes);

/* Tests: 0 packs every A, 1 (the default) reads a row-major fp32 A in place where Note [Unpacked A] says */
void sl_gemm_unpacked_a_set(int on);
/* Tests: 0 packs every B chunk before its kernels; 1 (the default) walks full B panels one at a time where
 * the impl can, packed by the first row panel's kernel or just before it (Note [Packing B in the first
 * tile]), on the blocks Note [Walk or chunk] gives it; 2 walks every block the impl can */
void sl_gemm_fused_b_pack_set(int mode);

/* Run the blocked GEMM with `nthr` threads (1: on the calling thread, no OpenMP region). */
void sl_gemm_run(const sl_gemm_args *g, const sl_gemm_impl *im, int nthr);

/* Generic packers (any mr/nr, kgran 1): fp32 -> fp32 and bf16 -> fp32 (exact widening). */
void sl_gemm_pack_a_f32(const sl_gemm_args *g, int64_t i0, int64_t ni, int64_t k0, int64_t kc, int mr,
                        void *dst);
void sl_gemm_pack_b_f32(const sl_gemm_args *g, int64_t j0, int64_t nj, int64_t k0, int64_t kc, int nr,
                        void *dst);
void sl_gemm_pack_a_bf16_f32(const sl_gemm_args *g, int64_t i0, int64_t ni, int64_t k0, int64_t kc, int mr,
                             void *dst);
void sl_gemm_pack_b_bf16_f32(const sl_gemm_args *g, int64_t j0, int64_t nj, int64_t k0, int64_t kc, int nr,
                             void *dst);

/* ISA variants; each file defines its impls (the kernel functions are compiled for that ISA). */
extern const sl_gemm_impl sl_gemm_impl_avx512_f32;
extern const sl_gemm_impl sl_gemm_impl_avx512_bf16emu; /* bf16 widened to fp32 by packing, fp32 kernel */
/* FLOP/s of vdpbf16ps over that of fp32 FMAs on this core (Note [Widened bf16 GEMM], gemm.c); AVX512_BF16 */
double sl_gemm_avx512_dp_ratio(void);
extern const sl_gemm_impl sl_gemm_impl_avx512_bf16; /* vdpbf16ps */
extern const sl_gemm_impl sl_gemm_impl_amx_bf16;    /* AMX tiles (tdpbf16ps) */
/* A few rows times a bf16 weight on AMX without packing the weight (Note [AMX GEMM for a few rows] in
 * gemm_amx.c): 1 if it computed g (bitwise sl_gemm_run with the AMX impl), 0 if g is not such a product.
 * _set(0) switches it off (tests compare the two). */
int sl_gemm_amx_few_rows(const sl_gemm_args *g, int nthr);
void sl_gemm_amx_few_rows_set(int on);
extern const sl_gemm_impl sl_gemm_impl_avx2_f32;
extern const sl_gemm_impl sl_gemm_impl_avx2_bf16emu;

/* M == 1 (Note [GEMV for decoding] in gemv.c): rows_*(x, B, ldb, K, n, y) sets y[j] = dot(x, B[j, 0..K))
 * for j < n (x and B fp32 or bf16). */
typedef void (*sl_gemv_rows_fn)(const void *x, const void *b, int64_t ldb, int64_t K, int64_t n, float *y);
typedef struct sl_gemv_impl {
    const char *name;
    sl_gemv_rows_fn rows_f32, rows_bf16;
} sl_gemv_impl;
extern const sl_gemv_impl sl_gemv_scalar, sl_gemv_avx2, sl_gemv_avx512, sl_gemv_avx512_bf16;
/* Computes g when it is one row times a row-major B^T (M == 1, !transA, transB) and returns 1; else 0
 * (the caller runs the blocked GEMM). Same alpha / beta / bias semantics as sl_gemm_run. */
int sl_gemv_run(const sl_gemm_args *g, const sl_gemv_impl *im, int in_bf16, int nthr);

#endif
