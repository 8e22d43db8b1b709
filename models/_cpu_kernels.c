/* Fused CPU kernels for training with dropout (archhpo.models._cpu_kernels builds and loads this).
 *
 * PyTorch's CPU flash attention has no dropout, so SDPA with dropout_p > 0 on CPU materialises the
 * (B, h, L, L) scores and draws a Bernoulli for each of them: 2-3.5x the dropout-free step.  Here
 * attention with dropout is computed a few query rows at a time, like flash attention: the rows'
 * scores, softmax and dropped probabilities live in L-long buffers, only the log-sum-exp per row
 * is kept for backward (which recomputes the scores), and the dropout mask is never stored: it is
 * a hash of the element's index and a per-call seed, recomputed in backward.  Each (batch, head)
 * slice is computed by one thread in a fixed order, so results do not depend on the thread count.
 * BENCHMARKS.md section 9 has the measurements that chose this layout.
 *
 * Layout: q, k, v, out, dout, dq, dk, dv are float32 (B, H, L, D) views with unit stride along D,
 * read and written in place through their strides (q, k, v are usually views into one projected
 * (B, L, 3, H, D) tensor, out a view of (B, L, H, D): no copies either way); lse is (BH, L); the
 * additive mask (may be NULL) is read at mask[b*msb + h*msh + i*msi + j] (row-contiguous).
 *
 * Masked keys are skipped: for each block of query rows, keys past the last block of W keys that
 * any of its rows can see (`jend`) have probability exactly 0, so their products (q k^T, P v and,
 * in backward, dout v, dS k, dS^T q, P^T dout) add exact zeros and are not computed, nor are their
 * exponentials and dropout hashes.  Under a causal mask that is about half of the work.  The
 * softmax's max and sums still run over the whole row in the same order, and masked keys before
 * `jend` are computed as before, so the results are bit for bit those of computing every key,
 * whatever the mask.  `jend` comes from a table made once per call for each distinct mask slice.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANE_SHIFT 17 /* keep iff the top 15 bits of the hash are >= thr (thr = round(p * 2^15)) */

static inline uint32_t mix32(uint32_t x) { /* "lowbias32" (C. Wellons): a bijection, full avalanche */
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* The dropout factor of element idx of a call seeded (s0, s1): 0 or scale. */
static inline float keep_factor(uint32_t idx, uint32_t s0, uint32_t s1, uint32_t thr, float scale) {
    uint32_t h = mix32(mix32(idx ^ s0) + s1);
    return (h >> LANE_SHIFT) >= thr ? scale : 0.0f;
}

/* exp(x) for x <= 0 (softmax arguments), vectorisable: 2^n * p(f), |rel. error| < 2e-7. */
static inline float exp_nonpos(float x) {
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.44269504088896341f;
    float n = __builtin_floorf(t + 0.5f); /* floor vectorises, round does not */
    float f = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.9875691500e-4f;
    p = p * f + 1.3981999507e-3f;
    p = p * f + 8.3334519073e-3f;
    p = p * f + 4.1665795894e-2f;
    p = p * f + 1.6666665459e-1f;
    p = p * f + 5.0000001201e-1f;
    p = p * f * f + f + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x <= -87.0f ? 0.0f : p * scale;
}

/* Sums with 32 independent lanes (four AVX vectors): one accumulator would wait on the add's
 * latency at every step.  The order is fixed, so results repeat exactly. */
#define LANES 32
static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int u = 0; u < LANES; u++) acc[u] += a[j + u] * b[j + u];
    float t = 0.0f;
    for (; j < n; j++) t += a[j] * b[j];
    for (int u = 0; u < LANES; u++) t += acc[u];
    return t;
}

static inline float sum(const float *restrict a, int64_t n) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int u = 0; u < LANES; u++) acc[u] += a[j + u];
    float t = 0.0f;
    for (; j < n; j++) t += a[j];
    for (int u = 0; u < LANES; u++) t += acc[u];
    return t;
}

static inline float max(const float *restrict a, int64_t n) {
    float acc[LANES];
    for (int u = 0; u < LANES; u++) acc[u] = -INFINITY;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int u = 0; u < LANES; u++) acc[u] = a[j + u] > acc[u] ? a[j + u] : acc[u];
    float t = -INFINITY;
    for (; j < n; j++) t = a[j] > t ? a[j] : t;
    for (int u = 0; u < LANES; u++) t = acc[u] > t ? acc[u] : t;
    return t;
}

void dropout_apply(const float *x, float *y, int64_t n, uint32_t s0, uint32_t s1, uint32_t thr,
                   float scale, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t c = 0; c < n; c += 4096) {
        int64_t end = c + 4096 < n ? c + 4096 : n;
#pragma omp simd
        for (int64_t e = c; e < end; e++) y[e] = x[e] * keep_factor((uint32_t)e, s0, s1, thr, scale);
    }
}

typedef struct { /* element (b, h, i, d) of a (B, H, L, D) view is p[b*sb + h*sh + i*sl + d] */
    float *p;
    int64_t sb, sh, sl;
} view;

typedef struct {
    int64_t B, H, L, D, msb, msh, msi;
    const float *mask;
    float scale; /* 1/sqrt(D) */
    uint32_t s0, s1, thr;
    float dscale; /* 1/(1 - rate) */
} attn_args;

/* Query rows are taken R at a time and keys/features W at a time, so that the inner loops keep
 * R x W accumulators in vector registers (a small matrix-multiply kernel) instead of streaming
 * one row through memory per feature.  Rows, keys and features are zero-padded to multiples of
 * R, W and W in per-thread buffers; padded keys get score -inf (probability 0) and padded query
 * rows get a zero output gradient, so padding changes no result. */
#define R 6
#define W 16
#define PAD(n, m) (((n) + (m)-1) / (m) * (m))

typedef struct {      /* one (batch, head) slice in padded per-thread buffers */
    int64_t L, Lr, Lp, D, Dp;
    int64_t jend;    /* keys [jend, Lp) are masked for every row of the current block of R rows */
    float *q;        /* (Lr, Dp) queries times 1/sqrt(D) */
    float *k, *kt;   /* (Lp, Dp) keys and (Dp, Lp) transposed */
    float *v, *vt;   /* the same for values */
    float *dout;     /* (Lr, Dp) output gradient (backward) */
    float *dk, *dv;  /* (Lp, Dp) accumulated gradients (backward) */
    float *s, *t;    /* (R, Lp) rows of scores / probabilities and of their gradients */
    float *o;        /* (R, Dp) rows of output or dq, written back unpadded */
} slice;

static int64_t slice_floats(int64_t L, int64_t D) {
    int64_t Lr = PAD(L, R), Lp = PAD(L, W), Dp = PAD(D, W);
    return 3 * Lr * Dp + 6 * Lp * Dp + 2 * R * Lp + R * Dp;
}

static slice slice_init(float *buf, int64_t L, int64_t D) {
    slice sl = {L, PAD(L, R), PAD(L, W), D, PAD(D, W)};
    int64_t rows = sl.Lr * sl.Dp, keys = sl.Lp * sl.Dp;
    memset(buf, 0, sizeof(float) * slice_floats(L, D));
    sl.q = buf, sl.dout = buf + rows, sl.k = buf + 3 * rows;
    sl.kt = sl.k + keys, sl.v = sl.kt + keys, sl.vt = sl.v + keys, sl.dk = sl.vt + keys, sl.dv = sl.dk + keys;
    sl.s = sl.dv + keys, sl.t = sl.s + R * sl.Lp, sl.o = sl.t + R * sl.Lp;
    return sl;
}

static float *row0(view v, int64_t bh, int64_t H) { return v.p + (bh / H) * v.sb + (bh % H) * v.sh; }

static void load_rows(float *dst, view v, int64_t bh, const slice *sl, int64_t H, float mul) {
    const float *src = row0(v, bh, H);
    for (int64_t i = 0; i < sl->L; i++)
        for (int64_t d = 0; d < sl->D; d++) dst[i * sl->Dp + d] = src[i * v.sl + d] * mul;
}

static void load_keys(float *rows, float *cols, view v, int64_t bh, const slice *sl, int64_t H) {
    const float *src = row0(v, bh, H);
    for (int64_t j = 0; j < sl->L; j++)
        for (int64_t d = 0; d < sl->D; d++) rows[j * sl->Dp + d] = cols[d * sl->Lp + j] = src[j * v.sl + d];
}

static void store_rows(view v, int64_t bh, int64_t H, int64_t i0, int64_t n, const float *src, int64_t Dp,
                       int64_t D, float mul) { /* rows i0..i0+n-1 of slice bh from an (n, Dp) buffer */
    float *dst = row0(v, bh, H);
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) dst[(i0 + r) * v.sl + d] = src[r * Dp + d] * mul;
}

/* GCC vector extensions: 8 floats (one AVX register; two SSE registers where there is no AVX). */
typedef float v8 __attribute__((vector_size(32)));
static inline v8 ld(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, v8 v) { memcpy(p, &v, sizeof v); }

/* out[r][j] = sum_d a[r][d] * bt[d][j] for R rows a (row stride Dp): scores and dout . v, for the
 * keys before jend (the caller fills the rest). */
static void rows_times_cols(const float *a, const float *bt, float *out, const slice *sl) {
    for (int64_t j0 = 0; j0 < sl->jend; j0 += W) {
        v8 acc[R][2] = {{{0}}};
        for (int64_t d = 0; d < sl->Dp; d++) {
            v8 b0 = ld(bt + d * sl->Lp + j0), b1 = ld(bt + d * sl->Lp + j0 + 8);
            for (int r = 0; r < R; r++) {
                float x = a[r * sl->Dp + d];
                acc[r][0] += x * b0;
                acc[r][1] += x * b1;
            }
        }
        for (int r = 0; r < R; r++) {
            st(out + r * sl->Lp + j0, acc[r][0]);
            st(out + r * sl->Lp + j0 + 8, acc[r][1]);
        }
    }
}

/* The real keys the current rows may see: w is 0 past them, and adding 0 * b changes no sum. */
static inline int64_t live_keys(const slice *sl) { return sl->jend < sl->L ? sl->jend : sl->L; }

/* out[r][d] = sum_j w[r][j] * b[j][d] for R rows w (stride Lp), over the keys they see. */
static void rows_times_keys(const float *w, const float *b, float *out, const slice *sl) {
    for (int64_t d0 = 0; d0 < sl->Dp; d0 += W) {
        v8 acc[R][2] = {{{0}}};
        for (int64_t j = 0, n = live_keys(sl); j < n; j++) {
            v8 b0 = ld(b + j * sl->Dp + d0), b1 = ld(b + j * sl->Dp + d0 + 8);
            for (int r = 0; r < R; r++) {
                float x = w[r * sl->Lp + j];
                acc[r][0] += x * b0;
                acc[r][1] += x * b1;
            }
        }
        for (int r = 0; r < R; r++) {
            st(out + r * sl->Dp + d0, acc[r][0]);
            st(out + r * sl->Dp + d0 + 8, acc[r][1]);
        }
    }
}

/* acc[j][d] += sum_r w[r][j] * a[r][d]: the key-side gradients (dk from dS and q, dv from P and dout). */
static void keys_add_rows(const float *w, const float *a, float *acc, const slice *sl) {
    for (int64_t d0 = 0; d0 < sl->Dp; d0 += W) {
        v8 ar[R][2];
        for (int r = 0; r < R; r++) ar[r][0] = ld(a + r * sl->Dp + d0), ar[r][1] = ld(a + r * sl->Dp + d0 + 8);
        for (int64_t j = 0, n = live_keys(sl); j < n; j++) {
            float *dst = acc + j * sl->Dp + d0;
            v8 t0 = ld(dst), t1 = ld(dst + 8);
            for (int r = 0; r < R; r++) {
                float x = w[r * sl->Lp + j];
                t0 += x * ar[r][0];
                t1 += x * ar[r][1];
            }
            st(dst, t0);
            st(dst + 8, t1);
        }
    }
}

static const float *mask_row(const attn_args *a, int64_t b, int64_t h, int64_t i) {
    return a->mask + b * a->msb + h * a->msh + i * a->msi;
}

/* The table of jend: for each distinct mask slice (one when the mask is broadcast over batch and
 * heads) and each block of R query rows, the end of the last block of W keys a real row of it
 * sees (any entry not -inf; NaN counts as seen, so it reaches the result).  NULL: out of memory. */
static int64_t *key_ends(const attn_args *a, int nthreads) {
    int64_t nrb = PAD(a->L, R) / R, Lp = PAD(a->L, W);
    int64_t nb = a->msb ? a->B : 1, nh = a->msh ? a->H : 1;
    int64_t *ends = malloc(sizeof(int64_t) * nb * nh * nrb);
    if (!ends) return NULL;
#pragma omp parallel for num_threads(nthreads) schedule(static) collapse(2)
    for (int64_t bh = 0; bh < nb * nh; bh++)
        for (int64_t rb = 0; rb < nrb; rb++) {
            int64_t end = a->mask ? 0 : Lp;
            for (int64_t i = rb * R; a->mask && i < rb * R + R && i < a->L; i++) {
                const float *m = mask_row(a, bh / nh, bh % nh, i);
                int64_t j = a->L;
                while (j > end && m[j - 1] == -INFINITY) j--;
                if (j > end) end = j;
            }
            ends[bh * nrb + rb] = PAD(end, W);
        }
    return ends;
}

static int64_t key_end(const attn_args *a, const int64_t *ends, int64_t bh, int64_t i) {
    int64_t nrb = PAD(a->L, R) / R, nh = a->msh ? a->H : 1;
    int64_t slice_of = (a->msb ? bh / a->H : 0) * nh + (a->msh ? bh % a->H : 0);
    return ends[slice_of * nrb + i / R];
}

/* Scores of rows i..i+R-1: s = q k^T + mask, padded and unseen keys -inf. */
static void scores(const attn_args *a, const slice *sl, int64_t bh, int64_t i) {
    rows_times_cols(sl->q + i * sl->Dp, sl->kt, sl->s, sl);
    for (int r = 0; r < R; r++) {
        float *s = sl->s + r * sl->Lp;
        if (a->mask && i + r < sl->L) {
            const float *m = mask_row(a, bh / a->H, bh % a->H, i + r);
            for (int64_t j = 0, n = live_keys(sl); j < n; j++) s[j] += m[j];
        }
        for (int64_t j = live_keys(sl); j < sl->Lp; j++) s[j] = -INFINITY;
    }
}

static void attn_fwd_slice(const attn_args *a, slice *sl, int64_t bh, view out, float *lse, const int64_t *ends) {
    for (int64_t i = 0; i < sl->Lr; i += R) {
        sl->jend = key_end(a, ends, bh, i);
        scores(a, sl, bh, i);
        for (int r = 0; r < R; r++) {
            float *s = sl->s + r * sl->Lp;
            int64_t n = sl->jend;
            float mx = max(s, sl->Lp);
#pragma omp simd
            for (int64_t j = 0; j < n; j++) s[j] = exp_nonpos(s[j] - mx);
            memset(s + n, 0, sizeof(float) * (sl->Lp - n)); /* exp(-inf) = +0, as exp_nonpos gives */
            float z = sum(s, sl->Lp), l = mx + logf(z);     /* the whole row, in the same order */
            uint32_t base = (uint32_t)((bh * sl->L + i + r) * sl->L);
#pragma omp simd
            for (int64_t j = 0; j < n; j++) /* past n: 0 times any factor */
                s[j] *= keep_factor(base + (uint32_t)j, a->s0, a->s1, a->thr, a->dscale) / z;
            if (i + r < sl->L) lse[i + r] = l;
        }
        rows_times_keys(sl->s, sl->v, sl->o, sl);
        store_rows(out, bh, a->H, i, i + R <= sl->L ? R : sl->L - i, sl->o, sl->Dp, sl->D, 1.0f);
    }
}

/* Both return 0, or 1 where a thread could not allocate its buffer (nothing is then computed). */
int attn_dropout_fwd(view q, view k, view v, view out, float *lse, attn_args a, int nthreads) {
    int64_t L = a.L, D = a.D, BH = a.B * a.H;
    int64_t *ends = key_ends(&a, nthreads);
    int failed = ends == NULL;
#pragma omp parallel num_threads(nthreads)
    {
        float *buf = malloc(sizeof(float) * slice_floats(L, D));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (failed) continue;
            slice sl = slice_init(buf, L, D);
            load_rows(sl.q, q, bh, &sl, a.H, a.scale);
            load_keys(sl.k, sl.kt, k, bh, &sl, a.H);
            load_keys(sl.v, sl.vt, v, bh, &sl, a.H);
            attn_fwd_slice(&a, &sl, bh, out, lse + bh * L, ends);
        }
        free(buf);
    }
    free(ends);
    return failed;
}

static void attn_bwd_slice(const attn_args *a, slice *sl, int64_t bh, view out, const float *lse,
                           view dq, const int64_t *ends) {
    const float *o = row0(out, bh, a->H);
    for (int64_t i = 0; i < sl->Lr; i += R) {
        sl->jend = key_end(a, ends, bh, i);
        scores(a, sl, bh, i);
        rows_times_cols(sl->dout + i * sl->Dp, sl->vt, sl->t, sl); /* dd = dout . v */
        for (int r = 0; r < R; r++) {
            float *s = sl->s + r * sl->Lp, *t = sl->t + r * sl->Lp;
            int live = i + r < sl->L;
            float di = 0.0f, l = live ? lse[i + r] : 0.0f; /* di = dout_i . out_i */
            for (int64_t d = 0; live && d < sl->D; d++) di += sl->dout[(i + r) * sl->Dp + d] * o[(i + r) * out.sl + d];
            uint32_t base = (uint32_t)((bh * sl->L + i + r) * sl->L);
#pragma omp simd
            for (int64_t j = 0; j < sl->jend; j++) { /* past jend p = 0: only skipped products read s, t */
                float p = exp_nonpos(s[j] - l);
                float m = keep_factor(base + (uint32_t)j, a->s0, a->s1, a->thr, a->dscale);
                s[j] = p * m;               /* dropped probability, for dv */
                t[j] = p * (t[j] * m - di); /* d score */
            }
        }
        rows_times_keys(sl->t, sl->k, sl->o, sl); /* dq = dS k / sqrt(D) */
        store_rows(dq, bh, a->H, i, i + R <= sl->L ? R : sl->L - i, sl->o, sl->Dp, sl->D, a->scale);
        keys_add_rows(sl->t, sl->q + i * sl->Dp, sl->dk, sl);    /* dk += dS^T q / sqrt(D) */
        keys_add_rows(sl->s, sl->dout + i * sl->Dp, sl->dv, sl); /* dv += P'^T dout */
    }
}

int attn_dropout_bwd(view q, view k, view v, view out, view dout, const float *lse, view dq, view dk,
                     view dv, attn_args a, int nthreads) {
    int64_t L = a.L, D = a.D, BH = a.B * a.H;
    int64_t *ends = key_ends(&a, nthreads);
    int failed = ends == NULL;
#pragma omp parallel num_threads(nthreads)
    {
        float *buf = malloc(sizeof(float) * slice_floats(L, D));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (failed) continue;
            slice sl = slice_init(buf, L, D);
            load_rows(sl.q, q, bh, &sl, a.H, a.scale);
            load_rows(sl.dout, dout, bh, &sl, a.H, 1.0f);
            load_keys(sl.k, sl.kt, k, bh, &sl, a.H);
            load_keys(sl.v, sl.vt, v, bh, &sl, a.H);
            attn_bwd_slice(&a, &sl, bh, out, lse + bh * L, dq, ends);
            store_rows(dk, bh, a.H, 0, L, sl.dk, sl.Dp, D, 1.0f);
            store_rows(dv, bh, a.H, 0, L, sl.dv, sl.Dp, D, 1.0f);
        }
        free(buf);
    }
    free(ends);
    return failed;
}
