/* Trainable mixture-of-experts kernels: routing, the router losses, token gather / combine, the expert-parallel
 * pack / unpack / regroup of (token, expert) pairs and the SwiGLU pointwise steps of the routed experts
 * (semantics: src/device/cpu/kernels/moe.c, moe_ep.c, moe_packed.c; launches: opencl_ops_moe.c, Note [OpenCL
 * MoE kernels] there). The route node's memory: weights (N, E), then scores (N, E), mask (N, E: 0 unrouted, 1
 * kept, 2 dropped by capacity), E routed counts, E kept counts. Every loop below runs in the CPU kernel's order
 * (one work-item per row, per expert or per output element), so selections are the CPU's and sums are its
 * sums. */
#pragma OPENCL FP_CONTRACT OFF

#ifdef SL_FP64 /* glibc's expf is correctly rounded but for rare cases: the double exp rounded once is too */
inline float moe_expf(float x) { return (float)exp((double)x); }
#else
inline float moe_expf(float x) { return exp(x); }
#endif

/* hm & 3: 1 the bf16 value, 2 the f16 value, 0 v (the half kind of a route, a packed expert, ...) */
inline float moe_hr(float v, int hm) { return (hm & 3) == 1 ? rbf16(v) : (hm & 3) == 2 ? rf16(v) : v; }

/* One row of MOE_ROUTE: scores, (group-limited) top-k into the mask, weights. The choice values live in the
 * weight row and the taken flags in the mask row until the weights are written. */
kernel void k_moe_route_row(global float *rt, long ro, global const float *x, long xo, long xs, long N, long E,
                            global const float *bias, long bo, int has_bias, int k, int sigm, int norm, int ng,
                            int tg, float scale, int hm) {
    long r = get_global_id(0);
    if (r >= N) return;
    global float *c = rt + ro + r * E, *s = c + N * E, *m = c + 2 * N * E;
    global const float *xr = x + xo + r * xs;
    if (sigm) {
        for (long e = 0; e < E; e++) s[e] = 1.0f / (1.0f + moe_expf(-xr[e]));
    } else {
        float mx = -INFINITY, sum = 0;
        for (long e = 0; e < E; e++) mx = xr[e] > mx ? xr[e] : mx;
        for (long e = 0; e < E; e++) sum += (s[e] = moe_expf(xr[e] - mx));
        for (long e = 0; e < E; e++) s[e] /= sum;
    }
    int ops = hm & 4; /* SL_MOE_ROUTE_HALF_OPS: every step a half op, as the CPU's route_row */
    if (ops)
        for (long e = 0; e < E; e++) s[e] = moe_hr(s[e], hm);
    for (long e = 0; e < E; e++) c[e] = s[e] + (has_bias ? bias[bo + e] : 0.0f);
    if (ng > 1) { /* keep the tg groups with the largest sum of their top two (ties: the lower index) */
        long gs = E / ng;
        float gscore[64];
        uchar gtaken[64];
        for (int g = 0; g < ng; g++) {
            global const float *cg = c + g * gs;
            long i1 = 0, i2 = -1;
            for (long i = 1; i < gs; i++)
                if (cg[i] > cg[i1]) i1 = i;
            for (long i = 0; i < gs; i++)
                if (i != i1 && (i2 < 0 || cg[i] > cg[i2])) i2 = i;
            gscore[g] = cg[i1] + cg[i2];
            gtaken[g] = 0;
        }
        for (int j = 0; j < tg; j++) {
            int best = -1;
            for (int g = 0; g < ng; g++)
                if (!gtaken[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            gtaken[best] = 1;
        }
        for (int g = 0; g < ng; g++)
            if (!gtaken[g])
                for (long i = 0; i < gs; i++) c[g * gs + i] = -INFINITY;
    }
    for (long e = 0; e < E; e++) m[e] = 0.0f;
    for (int j = 0; j < k; j++) {
        long best = -1;
        for (long i = 0; i < E; i++)
            if (m[i] == 0.0f && (best < 0 || c[i] > c[best])) best = i;
        m[best] = 1.0f;
    }
    float sum = 0;
    for (long e = 0; e < E; e++)
        if (m[e] != 0.0f) sum += s[e];
    if (ops) {
        float d = moe_hr(moe_hr(sum, hm) + 1e-20f, hm);
        for (long e = 0; e < E; e++)
            c[e] = m[e] != 0.0f ? moe_hr((norm ? moe_hr(s[e] / d, hm) : s[e]) * scale, hm) : 0.0f;
        return;
    }
    float inv = norm && sum > 0 ? 1.0f / sum : 1.0f;
    for (long e = 0; e < E; e++) { /* hm: half weights (Note [Half routing weights], src/nn/moe.c) */
        float v = m[e] != 0.0f ? s[e] * inv * scale : 0.0f;
        c[e] = moe_hr(v, hm);
    }
}

/* One work-item per expert: routed / kept counts, and the capacity (the first `cap` tokens in token order) */
/* The capacity scan, one work-item per expert in token order. P > 0: a sequence shard (me of P) of a batch of
 * B rows (Note [Capacity under sequence parallelism], src/nn/moe.c): a token's position among the tokens
 * routed to e counts, at the start of each batch row b, every shard's selections of the earlier rows and the
 * earlier shards' of row b (pc: P x B x E counts, whole numbers, so the float sums are exact) */
kernel void k_moe_route_cap(global float *rt, long ro, long N, long E, long cap, global const float *pc, long po,
                            long P, long B, long me) {
    long e = get_global_id(0);
    if (e >= E) return;
    global float *y = rt + ro, *m = y + 2 * N * E, *cnt = y + 3 * N * E;
    float routed = 0, kept = 0, before = 0, pos = 0;
    long Nb = P > 0 ? N / B : N;
    for (long r = 0; r < N; r++) {
        if (P > 0 && r % Nb == 0) {
            long b = r / Nb;
            pos = before;
            for (long p = 0; p < P; p++) {
                float c = pc[po + (p * B + b) * E + e];
                before += c;
                if (p < me) pos += c;
            }
        }
        if (m[r * E + e] == 0.0f) continue;
        routed += 1;
        if (cap > 0 && (P > 0 ? pos : kept) >= (float)cap) {
            m[r * E + e] = 2.0f;
            y[r * E + e] = 0.0f;
        } else {
            kept += 1;
        }
        pos += 1;
    }
    cnt[e] = routed;
    cnt[E + e] = kept;
}

kernel void k_moe_route_back(global float *d, long dO, global const float *rt, long ro, global const float *g,
                             long go, long gs, long N, long E, int sigm, int norm, float scale, int hm) {
    long r = get_global_id(0);
    if (r >= N) return;
    global const float *s = rt + ro + N * E + r * E, *m = s + N * E, *dy = g + go + r * gs;
    global float *du = d + dO + r * E;
    float S = 0, dot = 0;
    if (hm & 4) { /* SL_MOE_ROUTE_HALF_OPS: torch's half autograd, as the CPU's route_back_half_ops */
        for (long e = 0; e < E; e++) {
            du[e] = m[e] == 1.0f ? moe_hr(moe_hr(dy[e], hm) * scale, hm) : 0.0f;
            if (m[e] != 0.0f) S += s[e];
        }
        if (norm) {
            float dd = moe_hr(moe_hr(S, hm) + 1e-20f, hm), gd = 0;
            for (long e = 0; e < E; e++)
                if (m[e] != 0.0f) gd -= moe_hr(du[e] * moe_hr(moe_hr(s[e] / dd, hm) / dd, hm), hm);
            gd = moe_hr(gd, hm);
            for (long e = 0; e < E; e++) du[e] = m[e] != 0.0f ? moe_hr(moe_hr(du[e] / dd, hm) + gd, hm) : 0.0f;
        }
        if (sigm) {
            for (long e = 0; e < E; e++) du[e] = du[e] * (1.0f - s[e]) * s[e];
        } else {
            float d2 = 0;
            for (long e = 0; e < E; e++) d2 += du[e] * s[e];
            for (long e = 0; e < E; e++) du[e] = s[e] * (du[e] - d2);
        }
        return;
    }
    for (long e = 0; e < E; e++) {
        du[e] = m[e] == 1.0f ? moe_hr(dy[e], hm) * scale : 0.0f;
        if (m[e] != 0.0f) S += s[e];
    }
    if (norm && S > 0) {
        for (long e = 0; e < E; e++) dot += du[e] * s[e];
        for (long e = 0; e < E; e++) du[e] = m[e] != 0.0f ? (du[e] - dot / S) / S : 0.0f;
    }
    if (sigm) {
        for (long e = 0; e < E; e++) du[e] = du[e] * (s[e] * (1.0f - s[e]));
    } else {
        float d2 = 0;
        for (long e = 0; e < E; e++) d2 += du[e] * s[e];
        for (long e = 0; e < E; e++) du[e] = s[e] * (du[e] - d2);
    }
}

#ifdef SL_FP64 /* the router losses sum in double as the CPU does (refused by name without fp64) */
inline float moe_row_lse(global const float *x, long E) {
    float mx = -INFINITY;
    double sum = 0;
    for (long e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    for (long e = 0; e < E; e++) sum += exp((double)x[e] - mx);
    return mx + (float)log(sum);
}

/* one work-item: the whole (row, expert) sum in the CPU's order */
kernel void k_moe_router_loss(global float *out, long oo, global const float *x, long xo, long xs,
                              global const float *rt, long ro, long N, long E, int k, int sigm, float ca,
                              float cz) {
    if (get_global_id(0) != 0) return;
    global const float *ps = rt + ro + N * E, *cnt = rt + ro + 3 * N * E;
    double aux = 0, z = 0;
    for (long r = 0; r < N; r++) {
        global const float *s = ps + r * E;
        float S = 0;
        for (long e = 0; e < E; e++) S += s[e];
        for (long e = 0; e < E; e++) aux += (double)cnt[e] * (sigm ? s[e] / S : s[e]);
        double l = moe_row_lse(x + xo + r * xs, E);
        z += l * l;
    }
    aux = N ? aux * (double)E / ((double)N * (double)N * k) : 0;
    z = N ? z / (double)N : 0;
    out[oo] = (float)(ca * aux + cz * z);
    out[oo + 1] = (float)aux;
    out[oo + 2] = (float)z;
}

kernel void k_moe_router_loss_back(global float *d, long dO, global const float *x, long xo, long xs,
                                   global const float *rt, long ro, global const float *dl, long dlo, long N,
                                   long E, int k, int sigm, float f0, float f1) {
    long r = get_global_id(0);
    if (r >= N) return;
    float g = dl[dlo];
    float ca = f0 * g * (float)E / ((float)N * (float)N * (float)k), cz = f1 * g * 2.0f / (float)N;
    global const float *s = rt + ro + N * E + r * E, *cnt = rt + ro + 3 * N * E, *xr = x + xo + r * xs;
    global float *dr = d + dO + r * E;
    float S = 0, dot = 0;
    for (long e = 0; e < E; e++) S += s[e];
    for (long e = 0; e < E; e++) dot += ca * cnt[e] * (sigm ? s[e] / S : s[e]);
    for (long e = 0; e < E; e++) {
        float dp = ca * cnt[e];
        dr[e] = sigm ? (dp - dot) / S * s[e] * (1.0f - s[e]) : s[e] * (dp - dot);
    }
    if (cz != 0) {
        float l = moe_row_lse(xr, E);
        for (long e = 0; e < E; e++) dr[e] += cz * l * moe_expf(xr[e] - l);
    }
}
#endif

/* One work-item: expert e's kept tokens in token order. map[0..R): the token of row r (-1 past the count),
 * tok = map + R, tok[0..N): the row of token n (-1 if e does not keep it). More than R kept tokens (the CPU
 * fails there) set flag (1, count) and map none past R. */
kernel void k_moe_kept_map(global int *map, global const float *rt, long ro, long N, long E, long e, long R,
                           global int *flag) {
    if (get_global_id(0) != 0) return;
    global const float *m = rt + ro + 2 * N * E;
    global int *tok = map + R;
    long c = 0;
    for (long n = 0; n < N; n++) {
        int row = -1;
        if (m[n * E + e] == 1.0f) {
            if (c < R) map[c] = (int)n, row = (int)c;
            c++;
        }
        tok[n] = row;
    }
    if (c > R) flag[0] = 1, flag[1] = (int)c;
    for (; c < R; c++) map[c] = -1;
}

/* o[q] = (weight of row map[q]) * x[map[q]], else (fill 1) zero, (fill 2) acc[q], (fill 0) unwritten; 2-D:
 * columns x rows */
kernel void k_moe_rows(global float *o, long oo, long ldo, global const float *x, long xo, long ldx,
                       global const int *map, long mo, long C, long nrows, int fill, global const float *acc, long ao,
                       long lda, global const float *w, long wo, long ws, long wc, int weighted) {
    long c = get_global_id(0), q = get_global_id(1);
    if (c >= C || q >= nrows) return;
    int src = map[mo + q];
    if (src >= 0)
        o[oo + q * ldo + c] =
            weighted ? w[wo + src * ws + wc] * x[xo + src * ldx + c] : x[xo + src * ldx + c];
    else if (fill == 1)
        o[oo + q * ldo + c] = 0.0f;
    else if (fill == 2)
        o[oo + q * ldo + c] = acc[ao + q * lda + c];
}

/* MOE_COMBINE: acc (or 0) + (weight *) y of the token's row for expert e */
kernel void k_moe_combine(global float *o, long oo, global const float *y, long yo, long ldy,
                          global const int *tok, long to, global const float *acc, long ao, long lda, int has_acc,
                          global const float *w, long wo, long E, long e, int weighted, long C, long N) {
    long c = get_global_id(0), n = get_global_id(1);
    if (c >= C || n >= N) return;
    float v = has_acc ? acc[ao + n * lda + c] : 0.0f;
    int r = tok[to + n];
    if (r >= 0) {
        float s = weighted ? w[wo + n * E + e] : 1.0f;
        v += weighted == 2 ? rbf16(s * y[yo + r * ldy + c]) : s * y[yo + r * ldy + c];
    }
    o[oo + n * C + c] = v;
}

/* MOE_COMBINE_BACK_GATE: column e = dy . y of the token's row, zero elsewhere; one work-item per (n, j) */
kernel void k_moe_combine_back_gate(global float *o, long oo, global const float *y, long yo, long ys,
                                    global const float *dy, long dyo, long ds, global const int *tok, long to,
                                    long N, long E, long e, long C) {
    long i = get_global_id(0);
    if (i >= N * E) return;
    long n = i / E, j = i % E;
    float dot = 0;
    int r = j == e ? tok[to + n] : -1;
    if (r >= 0)
        for (long c = 0; c < C; c++) dot += y[yo + r * ys + c] * dy[dyo + n * ds + c];
    o[oo + i] = dot;
}

/* ---------------- expert-parallel pairs ---------------- */

/* MOE_EP_COUNTS: one work-item per expert, token order */
/* kept tokens per expert; B > 1: per block of N / B rows, (B E) (sl_moe_route_block_counts). One work-item
 * per (block, expert). */
kernel void k_moe_ep_counts(global float *o, long oo, global const float *rt, long ro, long N, long E, long B) {
    long i = get_global_id(0);
    if (i >= B * E) return;
    long e = i % E, b = i / E, Nb = N / B;
    global const float *m = rt + ro + 2 * N * E;
    float v = 0;
    for (long n = b * Nb; n < (b + 1) * Nb; n++) v += m[n * E + e] == 1.0f;
    o[oo + i] = v;
}

/* The packed row of every kept pair, expert-major then token order: cnt[e] (ints) first, then row[n E + e]
 * (-1: not kept, or past the S rows) after them. One work-item per expert each time. */
kernel void k_moe_col_count(global int *cnt, global const float *rt, long ro, long N, long E) {
    long e = get_global_id(0);
    if (e >= E) return;
    global const float *m = rt + ro + 2 * N * E;
    int v = 0;
    for (long n = 0; n < N; n++) v += m[n * E + e] == 1.0f;
    cnt[e] = v;
}
kernel void k_moe_pair_rows(global int *cnt, global const float *rt, long ro, long N, long E, long S,
                            global int *flag) {
    long e = get_global_id(0);
    if (e >= E) return;
    global int *row = cnt + E;
    global const float *m = rt + ro + 2 * N * E;
    long c = 0;
    for (long j = 0; j < e; j++) c += cnt[j];
    for (long n = 0; n < N; n++) {
        int r = -1;
        if (m[n * E + e] == 1.0f) r = c < S ? (int)c : -1, c++;
        row[n * E + e] = r;
    }
    if (c > S) flag[0] = 1, flag[1] = (int)c; /* more kept pairs than packed rows (the CPU fails there) */
}

/* MOE_EP_PACK: every kept pair's row of x (times the weight) */
kernel void k_moe_pack(global float *o, long oo, global const float *x, long xo, long xs, global const int *row,
                       long rowo, global const float *w, long wo, int weighted, long N, long E, long C) {
    long c = get_global_id(0), t = get_global_id(1);
    if (c >= C || t >= N) return;
    for (long e = 0; e < E; e++) {
        int r = row[rowo + t * E + e];
        if (r < 0) continue;
        float s = weighted ? w[wo + t * E + e] : 1.0f;
        o[oo + r * C + c] = s * x[xo + t * xs + c];
    }
}

/* MOE_EP_UNPACK: per token the sum of its rows in expert order from zero */
kernel void k_moe_unpack(global float *o, long oo, global const float *y, long yo, long ys, global const int *row,
                         long rowo, global const float *w, long wo, int weighted, long N, long E, long C) {
    long c = get_global_id(0), t = get_global_id(1);
    if (c >= C || t >= N) return;
    float v = 0;
    for (long e = 0; e < E; e++) {
        int r = row[rowo + t * E + e];
        if (r < 0) continue;
        float s = weighted ? w[wo + t * E + e] : 1.0f;
        v += s * y[yo + r * ys + c];
    }
    o[oo + t * C + c] = v;
}

kernel void k_moe_unpack_back_gate(global float *o, long oo, global const float *y, long yo, long ys,
                                   global const float *dy, long dyo, long ds, global const int *row, long rowo,
                                   long N, long E, long C) {
    long i = get_global_id(0);
    if (i >= N * E) return;
    int r = row[rowo + i];
    float dot = 0;
    if (r >= 0)
        for (long c = 0; c < C; c++) dot += y[yo + r * ys + c] * dy[dyo + (i / E) * ds + c];
    o[oo + i] = dot;
}

/* a received count as a whole number in [0, hi], else 0 and flag (1, -1): a corrupt exchange (the CPU fails) */
inline long moe_whole(float v, long hi, global int *flag) {
    if (v >= 0 && v <= (float)hi && v == (float)(long)v) return (long)v;
    flag[0] = 1, flag[1] = -1;
    return 0;
}

/* One work-item: the row map of the received rows (block p from source rank p: rcnt[p El + j] rows for local
 * expert j). mode 0: MOE_EP_GATHER (row r of local expert l's nmap rows <- received row), mode 1:
 * MOE_EP_SCATTER (received row q of nmap <- row of y, lrows of them), mode 2: MOE_EP_REGROUP to expert-major
 * (row q <- received row), mode 3: and back. -1: unmapped. sel > 0 (modes 0 and 1): source sel - 1's rows
 * only (iparams[3] of the node). Counts that are not whole numbers within the rows (the CPU fails on them)
 * set flag (1, -1) and map only rows within the tensors. */
kernel void k_moe_ep_map(global int *map, global const float *rc, long rco, long P, long El, long l, long sel,
                         long rows, long lrows, long nmap, int mode, global int *flag) {
    if (get_global_id(0) != 0) return;
    for (long q = 0; q < nmap; q++) map[q] = -1;
    if (mode <= 1) {
        long base = 0, r = 0;
        for (long p = 0; p < P; p++) {
            long o = base;
            for (long j = 0; j < El; j++) {
                long v = moe_whole(rc[rco + p * El + j], rows, flag);
                if (j < l) o += v;
                base += v;
            }
            long cn = moe_whole(rc[rco + p * El + l], rows, flag);
            if (sel > 0 && p != sel - 1) cn = 0;
            for (long i = 0; i < cn; i++, r++) {
                long src = o + i;
                if (src >= rows) break;
                if (mode == 0 && r < nmap) map[r] = (int)src;
                if (mode == 1 && r < lrows && src < nmap) map[src] = (int)r;
            }
        }
        if (base > rows || r > (mode == 0 ? nmap : lrows)) flag[0] = 1, flag[1] = -1; /* as the CPU's check */
        return;
    }
    long dst = 0;
    for (long j = 0; j < El; j++)
        for (long p = 0; p < P; p++) {
            long s = 0; /* where block (p, j) starts in the received layout */
            for (long i = 0; i < p * El + j; i++) s += moe_whole(rc[rco + i], rows, flag);
            long v = moe_whole(rc[rco + p * El + j], rows, flag);
            for (long i = 0; i < v; i++)
                if (s + i < nmap && dst + i < nmap) {
                    if (mode == 2)
                        map[dst + i] = (int)(s + i);
                    else
                        map[s + i] = (int)(dst + i);
                }
            dst += v;
        }
    if (dst > nmap) flag[0] = 1, flag[1] = -1;
}

/* ---------------- the SwiGLU steps of the routed experts ---------------- */

/* Under autocast (Note [Packed experts under autocast], src/device/cpu/kernels/moe_packed.c) the values are
 * rounded where the CPU's kernels round: hm 1 = bf16, 2 = f16, 0 = none. */

/* h = silu(a1) * a3, under autocast R(R(silu(a1)) * a3) */
kernel void k_moe_swiglu(global float *h, long ho, global const float *a1, long a1o, global const float *a3,
                         long a3o, long n, int hm) {
    long i = get_global_id(0);
    if (i >= n) return;
    float a = a1[a1o + i];
    h[ho + i] = hm ? moe_hr(moe_hr(a / (1.0f + moe_expf(-a)), hm) * a3[a3o + i], hm)
                     : a / (1.0f + moe_expf(-a)) * a3[a3o + i];
}

/* from dh (in d1) the pre-activation gradients: d(w3 x) into d3, d(w1 x) into d1 (rounded as the CPU's
 * back_pointwise under autocast) */
kernel void k_moe_swiglu_back(global float *d1, long d1o, global float *d3, long d3o, global const float *a1,
                              long a1o, global const float *a3, long a3o, long n, int hm) {
    long i = get_global_id(0);
    if (i >= n) return;
    float a = a1[a1o + i], sg = 1.0f / (1.0f + moe_expf(-a)), d = d1[d1o + i];
    if (!hm) {
        d3[d3o + i] = d * a * sg;
        d1[d1o + i] = d * a3[a3o + i] * sg * (1.0f + a * (1.0f - sg));
        return;
    }
    d = moe_hr(d, hm);
    d3[d3o + i] = moe_hr(d * moe_hr(a / (1.0f + moe_expf(-a)), hm), hm);
    float ds = moe_hr(d * a3[a3o + i], hm);
    d1[d1o + i] = moe_hr(ds * sg * (1.0f + a * (1.0f - sg)), hm);
}

/* rows x cols of src (rows ld apart) rounded into packed rows of dst: f32 values (bf = 0) or bf16 bits (bf = 1,
 * sl_f32_to_bf16's: the high hm of rbf16) */
kernel void k_moe_round(global float *d, long dO, global ushort *db, long dbo, global const float *s, long so,
                        long ld, long cols, long n, int hm, int bf) {
    long i = get_global_id(0);
    if (i >= n) return;
    float v = moe_hr(s[so + (i / cols) * ld + i % cols], hm);
    if (bf)
        db[dbo + i] = (ushort)(as_uint(v) >> 16);
    else
        d[dO + i] = v;
}

/* dx = R(dx) + R(t): the two linears' rounded input gradients summed */
kernel void k_moe_add_rounded(global float *dx, long dxo, global const float *t, long to, long n, int hm) {
    long i = get_global_id(0);
    if (i >= n) return;
    dx[dxo + i] = moe_hr(dx[dxo + i], hm) + moe_hr(t[to + i], hm);
}

/* dw += R(t): a source rank's rounded weight-gradient block summed in f32 (Note [EP weight gradients per
 * source rank], src/device/cpu/kernels/moe_packed.c) */
kernel void k_moe_acc_rounded(global float *dw, long dwo, global const float *t, long to, long n, int hm) {
    long i = get_global_id(0);
    if (i >= n) return;
    dw[dwo + i] += moe_hr(t[to + i], hm);
}

/* MOE_EXPERT's bf16 numerics (Note [OpenCL bf16 experts], opencl_ops_moe.c). One work-item: the rows routed to
 * expert e (gate[n, e] != 0) in token order, as sl_k_moe_expert scans them: map[0..cnt) their tokens,
 * map[N] = cnt, tok = map + N + 1: tok[n] the row of token n, or -1 */
kernel void k_moe_gate_map(global int *map, long mo, global const float *gate, long go, long gs, long N, long e) {
    if (get_global_id(0) != 0) return;
    map += mo;
    global int *tok = map + N + 1;
    int c = 0;
    for (long n = 0; n < N; n++) {
        int r = -1;
        if (gate[go + n * gs + e] != 0.0f) map[c] = (int)n, r = c++;
        tok[n] = r;
    }
    map[N] = c;
}

/* the routed rows of h (C wide) as bf16 bits (sl_f32_to_bf16's: the high half of rbf16), n = cnt * C */
kernel void k_moe_gate_rows_bf(global ushort *xb, long xbo, global const float *h, long ho, global const int *map,
                               long mo, long C, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    xb[xbo + i] = (ushort)(as_uint(rbf16(h[ho + (long)map[mo + i / C] * C + i % C])) >> 16);
}

/* y[n, c] = o[row of n, c] * gate[n, e] for the routed tokens (unrounded: Note [bf16 Mixtral experts] in
 * src/nn/llama.c), 0 for the others; one work-item per element of y (N x C) */
kernel void k_moe_gate_scatter(global float *y, long yo, global const float *o, long oo, global const int *map,
                               long mo, long N, global const float *gate, long go, long gs, long e, long C) {
    long i = get_global_id(0);
    if (i >= N * C) return;
    long n = i / C;
    int r = map[mo + N + 1 + n];
    y[yo + i] = r < 0 ? 0.0f : o[oo + (long)r * C + i % C] * gate[go + n * gs + e];
}
