/* Register-tiled SGEMM for convolutions and constant-weight products: Y = A B (+ bias, + residual,
 * clamped), A the weights (M x K) packed once into MR-row panels, B the im2col'd input (K x N)
 * written straight into NR-column panels block by block, never materialised whole.
 *
 * One source for every ISA: GCC/Clang vector extensions, the vector width chosen from what
 * -march=native enables (AVX-512: 16 floats, AVX/AVX2: 8, else 4 as NEON and SSE have). A tile of
 * MR x NR accumulators (NR = two vectors) stays in registers over a K block of KC: 12 accumulators,
 * 2 B vectors and one broadcast A value fit AVX2's 16 registers (and NEON's or AVX-512's 32).
 * Blocking follows the usual five loops: N in blocks of NC (the packed B block, KC x NC, in L2/L3),
 * K in blocks of KC (one B micro-panel, KC x NR, in L1), M in blocks of MC (an A block in L2).
 *
 * Bias, the residual and the clamp (Relu: lo 0; Relu6: lo 0, hi 6; none: +-inf) are applied in
 * the store of the last K block, so the output is written once more at most per K block and never
 * re-read by a separate pass. Without -ffast-math the products and sums keep IEEE semantics; the
 * summation order differs from a BLAS's, within float32 rounding of a dot product of length K.
 *
 * Conventions as native_kernels.c: float32, C-contiguous, int64 sizes, no state between calls;
 * the B block is allocated per call (returns -1 where that fails).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
#define MR 6
#define NR (2 * VL)
#define KC 256
#define MC 144
#define NC 2048

typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* The blocking, for the memory plan and the Python side: MR, NR, KC, NC. */
void cuvil_gemm_blocking(int64_t *out) {
    out[0] = MR;
    out[1] = NR;
    out[2] = KC;
    out[3] = NC;
}

/* Pack A (m x k, row-major) into `ap` (ceil(m / MR) * MR * k floats): K blocks of KC one after
 * another, each holding its MR-row panels, each panel kc columns of MR values (rows past m are 0). */
void cuvil_gemm_pack_a_f32(const float *restrict a, float *restrict ap, int64_t m, int64_t k) {
    const int64_t mp = (m + MR - 1) / MR * MR;
    for (int64_t pc = 0; pc < k; pc += KC) {
        const int64_t kc = k - pc < KC ? k - pc : KC;
        float *block = ap + pc * mp;
        for (int64_t ir = 0; ir < mp; ir += MR) {
            float *panel = block + ir * kc;
            for (int64_t p = 0; p < kc; p++)
                for (int64_t i = 0; i < MR; i++)
                    panel[p * MR + i] = ir + i < m ? a[(ir + i) * k + pc + p] : 0.0f;
        }
    }
}

typedef struct {
    int64_t c, h, w, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow;
} geometry;

/* Where a packed B row is being written: the panel row `d`, the lane in it, a panel's size. */
typedef struct {
    float *d;
    int64_t lane, step;
} cursor;

static inline void put_zeros(cursor *q, int64_t count) {
    while (count > 0) {
        int64_t run = NR - q->lane < count ? NR - q->lane : count;
        memset(q->d + q->lane, 0, (size_t)run * sizeof(float));
        count -= run, q->lane += run;
        if (q->lane == NR) q->lane = 0, q->d += q->step;
    }
}

static inline void put_inputs(cursor *q, const float *src, int64_t stride, int64_t count) {
    if (stride == 1) {
        while (count > 0) {
            int64_t run = NR - q->lane < count ? NR - q->lane : count;
            memcpy(q->d + q->lane, src, (size_t)run * sizeof(float));
            src += run, count -= run, q->lane += run;
            if (q->lane == NR) q->lane = 0, q->d += q->step;
        }
        return;
    }
    for (int64_t s = 0; s < count; s++) {
        q->d[q->lane] = src[s * stride];
        if (++q->lane == NR) q->lane = 0, q->d += q->step;
    }
}

/* Rows k0..k0+kc and columns j0..j0+nc of the im2col matrix of one image (row = (channel, tap),
 * column = output pixel) into NR-column panels of `dst`, each kc x NR (columns past nc are 0).
 * Each output row's span splits into the left padding, the inputs (a contiguous run at stride 1)
 * and the right padding, so no element tests its own bounds. */
static void pack_b(const float *restrict x, const geometry *g, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                   float *restrict dst) {
    const int64_t taps = g->kh * g->kw, end = j0 + nc;
    for (int64_t kk = 0; kk < kc; kk++) {
        const int64_t row = k0 + kk, tap = row % taps;
        const float *plane = x + (row / taps) * g->h * g->w;
        const int64_t dy = (tap / g->kw) * g->dh - g->ph, dx = (tap % g->kw) * g->dw - g->pw;
        /* the output columns whose input column ox * sw + dx lies inside [0, w) */
        const int64_t lo = dx >= 0 ? 0 : (-dx + g->sw - 1) / g->sw;
        const int64_t hi = g->w - 1 - dx < 0 ? 0 : (g->w - 1 - dx) / g->sw + 1;
        cursor q = {dst + kk * NR, 0, kc * NR};
        int64_t j = j0, oy = j0 / g->ow, ox = j0 % g->ow;
        while (j < end) {
            const int64_t stop = g->ow < ox + end - j ? g->ow : ox + end - j, iy = oy * g->sh + dy;
            if (iy < 0 || iy >= g->h) {
                put_zeros(&q, stop - ox);
            } else {
                const int64_t a = lo < ox ? ox : lo > stop ? stop : lo, b = hi < a ? a : hi > stop ? stop : hi;
                put_zeros(&q, a - ox);
                put_inputs(&q, plane + iy * g->w + a * g->sw + dx, g->sw, b - a);
                put_zeros(&q, stop - b);
            }
            j += stop - ox;
            ox = 0;
            oy++;
        }
        if (q.lane) put_zeros(&q, NR - q.lane);
    }
}

static inline vf clamp(vf v, vf lo, vf hi) {
    vi below = v < lo, above = v > hi;  /* false for NaN: a NaN passes through, as numpy's */
    v = (vf)(((vi)v & ~below) | ((vi)lo & below));
    return (vf)(((vi)v & ~above) | ((vi)hi & above));
}

typedef struct {
    const float *bias, *res;  /* bias per row (or NULL); residual laid out as y (or NULL) */
    float lo, hi;
} epilogue;

/* One MR x NR tile: C (+)= A panel x B panel over kc; on the last K block the epilogue. `mr`/`nr`
 * are the rows and columns of the tile that exist (edge tiles go through a local tile). */
static void tile(int64_t kc, const float *restrict a, const float *restrict b, float *c, int64_t ldc, int64_t mr,
                 int64_t nr, int first, int last, const epilogue *e, int64_t row0, const float *res) {
    vf c0[MR], c1[MR];
    for (int i = 0; i < MR; i++) c0[i] = c1[i] = (vf){0};
    for (int64_t p = 0; p < kc; p++) {
        const vf b0 = *(const vf *)(b + p * NR), b1 = *(const vf *)(b + p * NR + VL);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const vf ai = a[p * MR + i] - (vf){0};  /* a broadcast (x - 0 is x, so it folds) */
            c0[i] += ai * b0;
            c1[i] += ai * b1;
        }
    }
    const vf lo = (vf){0} + e->lo, hi = (vf){0} + e->hi;
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++) {
            float *ci = c + i * ldc;
            vf v0 = c0[i], v1 = c1[i];
            if (!first) v0 += load(ci), v1 += load(ci + VL);
            if (last) {
                if (e->bias) v0 += e->bias[row0 + i], v1 += e->bias[row0 + i];
                if (res) v0 += load(res + i * ldc), v1 += load(res + i * ldc + VL);
                v0 = clamp(v0, lo, hi), v1 = clamp(v1, lo, hi);
            }
            store(ci, v0);
            store(ci + VL, v1);
        }
        return;
    }
    float t[MR][NR];
    for (int i = 0; i < MR; i++) store(t[i], c0[i]), store(t[i] + VL, c1[i]);
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            float v = t[i][j] + (first ? 0.0f : c[i * ldc + j]);
            if (last) {
                if (e->bias) v += e->bias[row0 + i];
                if (res) v += res[i * ldc + j];
                v = v < e->lo ? e->lo : v > e->hi ? e->hi : v;
            }
            c[i * ldc + j] = v;
        }
}

/* Y[i] = A x im2col(X[i]) for each of n images: X (n, c, h, w), Y and the residual (n, m, oh, ow),
 * A packed by cuvil_gemm_pack_a_f32 from the (m, c * kh * kw) weights. A K x N matrix B is the
 * 1 x 1 case with c = K, h = 1, w = N. Returns 0, or -1 where the B block cannot be allocated. */
int64_t cuvil_conv_gemm_f32(const float *ap, const float *x, const float *bias, const float *res, float *y,
                            int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t kh, int64_t kw,
                            int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ph, int64_t pw, int64_t oh,
                            int64_t ow, float lo, float hi) {
    const geometry g = {c, h, w, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow};
    const int64_t k = c * kh * kw, cols = oh * ow, mp = (m + MR - 1) / MR * MR;
    const int64_t widest = ((cols < NC ? cols : NC) + NR - 1) / NR * NR, rows = k < KC ? k : KC;
    if (k == 0 || cols == 0 || m == 0) {  /* an empty product: Y is the epilogue of zeros */
        for (int64_t i = 0; i < n * m * cols; i++) {
            float v = (bias ? bias[(i / cols) % m] : 0.0f) + (res ? res[i] : 0.0f);
            y[i] = v < lo ? lo : v > hi ? hi : v;
        }
        return 0;
    }
    /* the packed B block (_conv_path.gemm_scratch_bytes: the memory plan counts the same) */
    float *bp = aligned_alloc(64, (size_t)((rows * widest * (int64_t)sizeof(float) + 63) / 64 * 64));
    if (!bp) return -1;
    const epilogue e = {bias, res, lo, hi};
    for (int64_t img = 0; img < n; img++) {
        const float *xi = x + img * c * h * w;
        float *yi = y + img * m * cols;
        const float *ri = res ? res + img * m * cols : NULL;
        for (int64_t jc = 0; jc < cols; jc += NC) {
            const int64_t nc = cols - jc < NC ? cols - jc : NC;
            for (int64_t pc = 0; pc < k; pc += KC) {
                const int64_t kc = k - pc < KC ? k - pc : KC;
                pack_b(xi, &g, pc, kc, jc, nc, bp);
                const float *block = ap + pc * mp;
                for (int64_t ic = 0; ic < m; ic += MC) {
                    const int64_t mc = m - ic < MC ? m - ic : MC;
                    for (int64_t jr = 0; jr < nc; jr += NR) {
                        const float *bpanel = bp + (jr / NR) * kc * NR;
                        for (int64_t ir = ic; ir < ic + mc; ir += MR) {
                            const int64_t off = ir * cols + jc + jr;
                            tile(kc, block + ir * kc, bpanel, yi + off, cols, m - ir < MR ? m - ir : MR,
                                 nc - jr < NR ? nc - jr : NR, pc == 0, pc + kc == k, &e, ir, ri ? ri + off : NULL);
                        }
                    }
                }
            }
        }
    }
    free(bp);
    return 0;
}
