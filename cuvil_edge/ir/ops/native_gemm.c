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

/* The image with its zero borders (pads top/left, and bottom/right as far as the windows reach):
 * `xp` (c x hp x wp), so that packing reads every window element without a bounds test. */
static void pad_image(const float *restrict x, const geometry *g, int64_t hp, int64_t wp, float *restrict xp) {
    for (int64_t ci = 0; ci < g->c; ci++)
        for (int64_t r = 0; r < hp; r++) {
            float *d = xp + (ci * hp + r) * wp;
            const int64_t iy = r - g->ph;
            if (iy < 0 || iy >= g->h) {
                memset(d, 0, (size_t)wp * sizeof(float));
                continue;
            }
            const int64_t right = wp - g->pw - g->w;
            memset(d, 0, (size_t)g->pw * sizeof(float));
            memcpy(d + g->pw, x + (ci * g->h + iy) * g->w, (size_t)g->w * sizeof(float));
            if (right > 0) memset(d + g->pw + g->w, 0, (size_t)right * sizeof(float));
        }
}

/* Rows k0..k0+kc, columns j0..j0+nc of the im2col matrix of the padded image `xp` into NR-column
 * panels of `dst` (each kc x NR, columns past nc 0): element (row, j) is xp[row's offset + col[j]],
 * col[j] the offset of output pixel j's window corner. A panel whose NR corners are consecutive
 * (stride 1, one output row) is two vector copies per row. Panel by panel, so the writes run front
 * to back (row by row, each row wrote one line in every panel, 16 KiB apart: measured 2 % slower). */
static void pack_b(const float *restrict xp, int64_t hp, int64_t wp, const geometry *g, const int32_t *restrict col,
                   int64_t k0, int64_t kc, int64_t j0, int64_t nc, float *restrict dst) {
    const int64_t taps = g->kh * g->kw;
    int32_t rowoff[KC];  /* each row's offset in xp: (channel, tap row, tap column) */
    int64_t ci = k0 / taps, ki = k0 % taps / g->kw, kj = k0 % g->kw;
    for (int64_t kk = 0; kk < kc; kk++) {
        rowoff[kk] = (int32_t)((ci * hp + ki * g->dh) * wp + kj * g->dw);
        if (++kj == g->kw) {
            kj = 0;
            if (++ki == g->kh) ki = 0, ci++;
        }
    }
    const int32_t *cj = col + j0;
    for (int64_t q = 0; q < nc; q += NR) {  /* panel by panel: each written front to back */
        float *d = dst + (q / NR) * kc * NR;
        const int32_t *cq = cj + q;
        if (q + NR <= nc && cq[NR - 1] - cq[0] == NR - 1) {
            const float *s0 = xp + cq[0];
            for (int64_t kk = 0; kk < kc; kk++, d += NR) {
                store(d, load(s0 + rowoff[kk]));
                store(d + VL, load(s0 + rowoff[kk] + VL));
            }
        } else {
            const int64_t width = nc - q < NR ? nc - q : NR;
            for (int64_t kk = 0; kk < kc; kk++, d += NR) {
                const float *src = xp + rowoff[kk];
                for (int l = 0; l < NR; l++) d[l] = l < width ? src[cq[l]] : 0.0f;
            }
        }
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
    if (nr <= VL) {  /* a narrow last panel (49 = 3 x 16 + 1 pixels): half the multiplies */
        for (int64_t p = 0; p < kc; p++) {
            const vf b0 = *(const vf *)(b + p * NR);
#pragma GCC unroll 6
            for (int i = 0; i < MR; i++) c0[i] += (a[p * MR + i] - (vf){0}) * b0;
        }
    } else {
    for (int64_t p = 0; p < kc; p++) {
        const vf b0 = *(const vf *)(b + p * NR), b1 = *(const vf *)(b + p * NR + VL);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const vf ai = a[p * MR + i] - (vf){0};  /* a broadcast (x - 0 is x, so it folds) */
            c0[i] += ai * b0;
            c1[i] += ai * b1;
        }
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
 * A packed by cuvil_gemm_pack_a_f32 from the (m, c * kh * kw) weights; `shape` holds n, c, h, w, m,
 * kh, kw, sh, sw, dh, dw, ph, pw, oh, ow (one pointer: each ctypes argument costs ~0.4 us). A K x N matrix B is the
 * 1 x 1 case with c = K, h = 1, w = N. Returns 0, or -1 where the B block cannot be allocated. */
int64_t cuvil_conv_gemm_f32(const float *ap, const float *x, const float *bias, const float *res, float *y,
                            const int64_t *shape, float lo, float hi) {
    const int64_t n = shape[0], c = shape[1], h = shape[2], w = shape[3], m = shape[4], kh = shape[5];
    const int64_t kw = shape[6], sh = shape[7], sw = shape[8], dh = shape[9], dw = shape[10], ph = shape[11];
    const int64_t pw = shape[12], oh = shape[13], ow = shape[14];
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
    /* the padded image (none when nothing is padded), the column offsets and the packed B block
     * (_conv_path.gemm_scratch_bytes: the memory plan counts the same) */
    const int64_t need_h = (oh - 1) * sh + dh * (kh - 1) + 1, need_w = (ow - 1) * sw + dw * (kw - 1) + 1;
    const int64_t hp = ph + h > need_h ? ph + h : need_h, wp = pw + w > need_w ? pw + w : need_w;
    const int padded = hp != h || wp != w;
    float *bp = aligned_alloc(64, (size_t)((rows * widest * (int64_t)sizeof(float) + 63) / 64 * 64));
    float *xp = padded ? malloc((size_t)(c * hp * wp) * sizeof(float)) : NULL;
    int32_t *col = malloc((size_t)cols * sizeof(int32_t));
    if (!bp || !col || (padded && !xp)) {
        free(bp), free(xp), free(col);
        return -1;
    }
    for (int64_t j = 0; j < cols; j++) col[j] = (int32_t)((j / ow) * sh * wp + (j % ow) * sw);
    const epilogue e = {bias, res, lo, hi};
    for (int64_t img = 0; img < n; img++) {
        const float *xi = x + img * c * h * w;
        if (padded) pad_image(xi, &g, hp, wp, xp);
        const float *src = padded ? xp : xi;
        float *yi = y + img * m * cols;
        const float *ri = res ? res + img * m * cols : NULL;
        for (int64_t jc = 0; jc < cols; jc += NC) {
            const int64_t nc = cols - jc < NC ? cols - jc : NC;
            for (int64_t pc = 0; pc < k; pc += KC) {
                const int64_t kc = k - pc < KC ? k - pc : KC;
                pack_b(src, hp, wp, &g, col, pc, kc, jc, nc, bp);
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
    free(bp), free(xp), free(col);
    return 0;
}
