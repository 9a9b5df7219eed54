/* Fused blocks: a depthwise convolution whose output feeds a pointwise (1x1) one, in one call.
 *
 * The inverted-residual block's expanded tensor (C channels of the full map) is the largest in the
 * network; written by the depthwise kernel and read back by the GEMM it costs two trips through
 * memory. Here the depthwise output is computed a few output rows at a time into a scratch tile
 * (C x tile pixels, sized to stay in L2) and consumed at once by a register-tiled GEMM whose store
 * applies the pointwise bias, its clamp and the residual. Conventions as native_kernels.c: float32,
 * C-contiguous NCHW, int64 sizes, no state kept between calls.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define FU_LANES 16
#elif defined(__AVX__)
#define FU_LANES 8
#else /* NEON and the rest: 128-bit vectors */
#define FU_LANES 4
#endif
/* The micro-kernel: FU_MR output channels x FU_NV vectors of pixels, in FU_MR * FU_NV registers. */
#define FU_MR 4
#define FU_NV 3
#define FU_NR (FU_LANES * FU_NV)
/* Scratch tile target: C x pixels floats near this many bytes: L2-resident, and large enough that
 * small maps fill whole pixel blocks (96 KiB left 7x7 maps at 40% of their GEMM speed). */
#define FU_TILE_BYTES (256 * 1024)
typedef float fuv __attribute__((vector_size(FU_LANES * 4)));

static inline float fu_clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* Output channels per weight panel: the packed layout's row count (Python sizes the buffer by it). */
int64_t cuvil_dwpw_mr(void) { return FU_MR; }

/* The pointwise weights (m x c) as panels of FU_MR rows, channel-major inside a panel:
 * dst[(p * c + k) * FU_MR + r] = w[(p * FU_MR + r) * c + k], zero past row m. */
void cuvil_dwpw_pack_f32(const float *restrict w, float *restrict dst, int64_t m, int64_t c) {
    for (int64_t p = 0; p < (m + FU_MR - 1) / FU_MR; p++)
        for (int64_t k = 0; k < c; k++)
            for (int64_t r = 0; r < FU_MR; r++) {
                int64_t row = p * FU_MR + r;
                dst[(p * c + k) * FU_MR + r] = row < m ? w[row * c + k] : 0.0f;
            }
}

/* The tile's layout. Its pixels are the depthwise output rows r0.. at the padded width
 * pw = ow + (kw - 1) dw: flat index f = (oy - r0) * pw + ox, so every kernel tap reads one
 * contiguous run of the zero-padded input rows and no pixel needs moving; the pw - ow columns per
 * row past ow are computed and never stored. Channel-blocked: pixels in blocks of FU_NR, each
 * block c x FU_NR contiguous (the GEMM streams it), pixel f of channel ch at
 * tile[(f / FU_NR) * c * FU_NR + ch * FU_NR + f % FU_NR]. */

/* Channel `ch`'s depthwise outputs for `blocks` pixel blocks of the tile, clamped to [lo, hi]:
 * the input rows the windows read copied zero-padded into `pad` (one channel at a time, so it
 * stays in L1), then per block FU_NV vectors summed over every tap in registers. */
static void fu_depthwise(const float *restrict xp, const float *restrict taps, float bias, float *restrict tile,
                         float *restrict pad, int64_t ch, int64_t c, int64_t h, int64_t wd, int64_t kh, int64_t kw,
                         int64_t dh, int64_t dw, int64_t top, int64_t left, int64_t r0, int64_t rows, int64_t pw,
                         int64_t blocks, float lo, float hi) {
    for (int64_t i = 0; i < rows + (kh - 1) * dh; i++) {
        float *line = pad + i * pw;
        int64_t iy = r0 - top + i, end = left + wd < pw ? left + wd : pw;
        if (iy < 0 || iy >= h) {
            memset(line, 0, (size_t)pw * sizeof(float));
            continue;
        }
        memset(line, 0, (size_t)left * sizeof(float));
        memcpy(line + left, xp + iy * wd, (size_t)(end - left) * sizeof(float));
        if (end < pw) memset(line + end, 0, (size_t)(pw - end) * sizeof(float));
    }
    for (int64_t b = 0; b < blocks; b++) {
        fuv s[FU_NV];
        for (int v = 0; v < FU_NV; v++) s[v] = bias - (fuv){0};
        for (int64_t ky = 0; ky < kh; ky++)
            for (int64_t kx = 0; kx < kw; kx++) {
                const fuv t = taps[ky * kw + kx] - (fuv){0};
                const float *src = pad + ky * dh * pw + kx * dw + b * FU_NR;
                for (int v = 0; v < FU_NV; v++) {
                    fuv x;
                    memcpy(&x, src + v * FU_LANES, sizeof x);
                    s[v] += t * x;
                }
            }
        float out[FU_NR];
        memcpy(out, s, sizeof out);
        for (int q = 0; q < FU_NR; q++) out[q] = fu_clamp(out[q], lo, hi);
        memcpy(tile + (b * c + ch) * FU_NR, out, sizeof out);
    }
}

/* The strided depthwise (sh x sw > 1): the tile's pixels are compact (f = (oy - r0) * ow + ox;
 * a padded width would waste most of the GEMM's columns). Each padded input row the windows read
 * is split into its sw column phases (phase p holds padded columns p, p + sw, ...), so the tap at
 * column offset kx * dw reads one contiguous run of phase (kx * dw) % sw for a whole output row. */
static void fu_depthwise_strided(const float *restrict xp, const float *restrict taps, float bias,
                                 float *restrict tile, float *restrict pad, float *restrict acc, int64_t ch, int64_t c,
                                 int64_t h, int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                                 int64_t dw, int64_t top, int64_t left, int64_t r0, int64_t rows, int64_t ow,
                                 int64_t len, float lo, float hi) {
    const int64_t prow = (rows - 1) * sh + (kh - 1) * dh + 1;
    for (int64_t i = 0; i < prow; i++) {
        int64_t iy = r0 * sh + i - top;
        for (int64_t p = 0; p < sw; p++) {
            float *line = pad + (i * sw + p) * len;
            /* t in [t0, t1): padded column p + sw t lies inside the row (branch-free copy); zeros elsewhere */
            int64_t t0 = left > p ? (left - p + sw - 1) / sw : 0, t1 = (wd + left - p + sw - 1) / sw;
            t1 = t1 < len ? t1 : len;
            if (iy < 0 || iy >= h || t1 <= t0) {
                memset(line, 0, (size_t)len * sizeof(float));
                continue;
            }
            for (int64_t t = 0; t < t0; t++) line[t] = 0.0f;
            const float *src = xp + iy * wd + p - left;
            for (int64_t t = t0; t < t1; t++) line[t] = src[sw * t];
            for (int64_t t = t1; t < len; t++) line[t] = 0.0f;
        }
    }
    float *block = tile + ch * FU_NR;
    int64_t lane = 0;
    for (int64_t oy = 0; oy < rows; oy++) {
        for (int64_t ox = 0; ox < ow; ox++) acc[ox] = bias;
        for (int64_t ky = 0; ky < kh; ky++)
            for (int64_t kx = 0; kx < kw; kx++) {
                const float t = taps[ky * kw + kx];
                const float *src = pad + ((oy * sh + ky * dh) * sw + (kx * dw) % sw) * len + (kx * dw) / sw;
                for (int64_t ox = 0; ox < ow; ox++) acc[ox] += t * src[ox];
            }
        /* clamped in a loop of its own (vector min/max: a clamp per scattered element branched on
         * the data, and mispredicted on half of a Relu's inputs), then copied in runs */
        for (int64_t ox = 0; ox < ow; ox++) acc[ox] = fu_clamp(acc[ox], lo, hi);
        for (int64_t ox = 0; ox < ow;) {
            int64_t run = FU_NR - lane < ow - ox ? FU_NR - lane : ow - ox;
            memcpy(block + lane, acc + ox, (size_t)run * sizeof(float));
            ox += run;
            lane += run;
            if (lane == FU_NR) {
                lane = 0;
                block += c * FU_NR;
            }
        }
    }
}

/* y rows r0.. of every output channel = clamp(W (m x c, packed) . tile + b, lo, hi) + res, for
 * the tile's `blocks` pixel blocks; only pixels with ox < ow of the `rows` rows are stored. */
static void fu_pointwise(const float *restrict packed, const float *restrict tile, const float *restrict b,
                         const float *restrict res, float *restrict y, int64_t m, int64_t c, int64_t blocks,
                         int64_t rows, int64_t pw, int64_t ow, int64_t plane, float lo, float hi) {
    for (int64_t p = 0; p < (m + FU_MR - 1) / FU_MR; p++) {
        const float *a = packed + p * c * FU_MR;
        for (int64_t j = 0; j < blocks; j++) {
            const float *bt = tile + j * c * FU_NR;
            fuv s[FU_MR][FU_NV];
            for (int r = 0; r < FU_MR; r++)
                for (int v = 0; v < FU_NV; v++) s[r][v] = (fuv){0};
            for (int64_t k = 0; k < c; k++) {
                fuv x[FU_NV];
                for (int v = 0; v < FU_NV; v++) x[v] = *(const fuv *)(bt + k * FU_NR + v * FU_LANES);
                for (int r = 0; r < FU_MR; r++) {
                    const fuv ar = a[k * FU_MR + r] - (fuv){0};
                    for (int v = 0; v < FU_NV; v++) s[r][v] += ar * x[v];
                }
            }
            for (int r = 0; r < FU_MR && p * FU_MR + r < m; r++) {
                int64_t row = p * FU_MR + r;
                float out[FU_NR], bias = b ? b[row] : 0.0f;
                memcpy(out, s[r], sizeof out);
                /* the block's runs of stored pixels: flat f -> (oy, ox), ox < ow */
                for (int64_t f = j * FU_NR, stop = f + FU_NR; f < stop;) {
                    int64_t oy = f / pw, ox = f % pw;
                    if (oy >= rows) break;
                    int64_t run = ow - ox < stop - f ? ow - ox : stop - f;
                    if (run <= 0) {
                        f += pw - ox;
                        continue;
                    }
                    const float *src = out + (f - j * FU_NR);
                    float *dst = y + row * plane + oy * ow + ox;
                    if (res) {
                        const float *add = res + row * plane + oy * ow + ox;
                        for (int64_t q = 0; q < run; q++) dst[q] = fu_clamp(src[q] + bias, lo, hi) + add[q];
                    } else {
                        for (int64_t q = 0; q < run; q++) dst[q] = fu_clamp(src[q] + bias, lo, hi);
                    }
                    f += run;
                }
            }
        }
    }
}

/* Depthwise kh x kw (strides sh x sw, dilation dh x dw, pads top/left; the output oh x ow) with
 * bias bdw and clamp [lo1, hi1], then pointwise m x c with bias bpw and clamp [lo2, hi2], then
 * + res (NULL: none); biases may be NULL. shape: n, c, h, w, m, kh, kw, dh, dw, top, left, oh, ow,
 * sh, sw. `packed`: cuvil_dwpw_pack_f32's panels. Returns 0, or -1 when scratch cannot be allocated. */
int64_t cuvil_dwpw_f32(const float *restrict x, const float *restrict wdw, const float *restrict bdw,
                       const float *restrict packed, const float *restrict bpw, const float *restrict res,
                       float *restrict y, const int64_t *shape, float lo1, float hi1, float lo2, float hi2) {
    const int64_t n = shape[0], c = shape[1], h = shape[2], wd = shape[3], m = shape[4], kh = shape[5],
                  kw = shape[6], dh = shape[7], dw = shape[8], top = shape[9], left = shape[10], oh = shape[11],
                  ow = shape[12], sh = shape[13], sw = shape[14];
    const int64_t flat = sh == 1 && sw == 1, plane = oh * ow;
    const int64_t pw = flat ? ow + (kw - 1) * dw : ow; /* the tile's row width (see fu_depthwise) */
    int64_t rows = FU_TILE_BYTES / 4 / (c * pw);
    rows = rows < 1 ? 1 : (rows > oh ? oh : rows);
    const int64_t blocks = (rows * pw + FU_NR - 1) / FU_NR;
    /* stride 1: the last block's reads run past the rows by up to FU_NR + (kw - 1) dw: zeros, or
     * earlier rows' values, which reach only the unstored pixels. Strided: sw phases per input row */
    const int64_t len = ow + (kw - 1) * dw / sw + 1;
    const int64_t padded = flat ? (rows + (kh - 1) * dh) * pw + (kw - 1) * dw + FU_NR
                                : ((rows - 1) * sh + (kh - 1) * dh + 1) * sw * len;
    const size_t tile_bytes = (size_t)((blocks * c * FU_NR * 4 + 63) / 64 * 64);
    float *tile = aligned_alloc(64, tile_bytes);
    float *pad = calloc((size_t)padded, sizeof(float)), *acc = malloc((size_t)ow * sizeof(float));
    if (!tile || !pad || !acc) {
        free(tile);
        free(pad);
        free(acc);
        return -1;
    }
    memset(tile, 0, tile_bytes); /* the last block's unwritten lanes: finite, never stored */
    for (int64_t img = 0; img < n; img++) {
        const float *xi = x + img * c * h * wd;
        for (int64_t r0 = 0; r0 < oh; r0 += rows) {
            int64_t used = oh - r0 < rows ? oh - r0 : rows, nb = (used * pw + FU_NR - 1) / FU_NR;
            for (int64_t ch = 0; ch < c; ch++) {
                const float *xc = xi + ch * h * wd, *taps = wdw + ch * kh * kw;
                float bias = bdw ? bdw[ch] : 0.0f;
                if (flat)
                    fu_depthwise(xc, taps, bias, tile, pad, ch, c, h, wd, kh, kw, dh, dw, top, left, r0, used, pw, nb,
                                 lo1, hi1);
                else
                    fu_depthwise_strided(xc, taps, bias, tile, pad, acc, ch, c, h, wd, kh, kw, sh, sw, dh, dw, top,
                                         left, r0, used, ow, len, lo1, hi1);
            }
            fu_pointwise(packed, tile, bpw, res ? res + img * m * plane + r0 * ow : 0, y + img * m * plane + r0 * ow,
                         m, c, nb, used, pw, ow, plane, lo2, hi2);
        }
    }
    free(pad);
    free(acc);
    free(tile);
    return 0;
}
