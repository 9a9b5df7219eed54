/* int8 GEMM with int32 accumulation, for QLinearConv, ConvInteger, QLinearMatMul and MatMulInteger.
 *
 * Y[m][n] = sum_k (A[m][k] - za[m]) (B[k][n] - zb) (+ bias[m]); A is the weight (packed once per
 * weight array by cuvil_i8_pack_a), B the activation (an image's im2col, or a matrix's rows), both
 * int8 or uint8. The int32 sum is stored as is (ConvInteger, MatMulInteger) or requantized in the
 * store: float(acc) * multiplier[m], rounded to nearest even (lrintf under the default rounding mode,
 * what onnxruntime's vector conversion does), plus the output zero point, saturated to [lo, hi]
 * (a fused Relu narrows the range).
 *
 * The inner product is chosen at compile time, so each device gets its own ISA's:
 *   AVX-512-VNNI / AVX-VNNI   vpdpbusd on raw u8 x s8 groups of 4; the zero points are applied
 *                             afterwards from A's row sums and B's column sums.
 *   AVX2                      vpmaddwd on zero-point-centred int16 pairs. vpmaddubsw + vpmaddwd(1)
 *                             does the same number of multiply instructions per MAC on AVX2 but
 *                             saturates its int16 pair sums (255 * 127 * 2 > 32767); the 7-bit weight
 *                             workaround changes results. The int16 path is exact, and subtracting the
 *                             zero points while packing leaves no correction terms.
 *   ARMv8.2 dotprod           sdot on s8 x s8 groups of 4 (uint8 shifted by 128), corrected like VNNI.
 *   otherwise                 the int16 layout in plain C (a widening loop the compiler vectorises).
 *
 * Tiles: MR=6 rows of A by NR=16 columns of B, K in groups of KU (2 or 4). B is packed per chunk of
 * columns sized to stay in L2 and reused across every row block; a row block of A is reused across
 * the chunk. Single-threaded, reentrant; the only allocation (the B chunk) is freed before return.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#include <immintrin.h>
#define I8_PATH 2
#define I8_KU 4
#elif defined(__ARM_FEATURE_DOTPROD) && defined(__aarch64__)
#include <arm_neon.h>
#define I8_PATH 3
#define I8_KU 4
#elif defined(__AVX2__)
#include <immintrin.h>
#define I8_PATH 1
#define I8_KU 4
#else
#define I8_PATH 0
#define I8_KU 2
#endif

#ifndef I8_KC
#define I8_KC 256
#endif
#ifndef I8_BUDGET
#define I8_BUDGET 128
#endif
#ifndef MR
#define MR 6
#endif
#define NR 16
#define HEADER 64 /* bytes before the packed weights: int64 M, K, has_zero_points, planes */
/* vpmaddubsw sums two u8 x s8 products into a saturating int16: exact while |w0| + |w1| <= 128 for
 * every pair (255 * 128 < 32767). A weight with a pair over that is held as two planes, w = wa + wb
 * with |wa|, |wb| <= 64, each plane widened to int32 on its own: twice the multiplies, exact always;
 * the one-plane speed for weights that allow it (7-bit weights, most trained ones). */
#define PLANES_MAX (I8_PATH == 1 ? 2 : 1)

#if I8_KU == 4
#if I8_PATH != 3
typedef uint8_t bel; /* B: raw uint8 (an int8 B is shifted by 128) */
#else
typedef int8_t bel; /* B: raw int8 (a uint8 B is shifted by 128) */
#endif
typedef int8_t ael;
#else
typedef int16_t bel; /* B and A centred by their zero points */
typedef int16_t ael;
#endif

int64_t cuvil_i8_path(void) { return I8_PATH; }

static int64_t groups_of(int64_t k) { return (k + I8_KU - 1) / I8_KU; }
static int64_t mpad_of(int64_t m) { return (m + MR - 1) / MR * MR; }

/* Bytes of a packed weight: header, int32 row sums and zero points (Mpad each), the tiles. */
int64_t cuvil_i8_packed_bytes(int64_t m, int64_t k) {
    return HEADER + 8 * mpad_of(m) + PLANES_MAX * mpad_of(m) * groups_of(k) * I8_KU * (int64_t)sizeof(ael);
}

static int32_t load_q(const void *p, int64_t i, int64_t is_signed) {
    return is_signed ? (int32_t)((const int8_t *)p)[i] : (int32_t)((const uint8_t *)p)[i];
}

/* A[m][k] = w[m * sm + k * sk] (int8 if w_signed, else uint8), zero point wz[m] (wz_n == M) or
 * wz[0] (wz_n == 1) or none (wz_n == 0). */
void cuvil_i8_pack_a(const void *w, int64_t w_signed, const int32_t *wz, int64_t wz_n, int64_t m, int64_t k,
                     int64_t sm, int64_t sk, void *out) {
    int64_t mp = mpad_of(m), kg = groups_of(k), has = 0, planes = 1;
    memset(out, 0, (size_t)cuvil_i8_packed_bytes(m, k));
    int64_t *head = (int64_t *)out;
    int32_t *rowsum = (int32_t *)((char *)out + HEADER), *zp = rowsum + mp;
    ael *tiles = (ael *)(zp + mp);
#if I8_PATH == 1
    for (int64_t r = 0; r < m && planes == 1; r++)
        for (int64_t c = 0; c + 1 < k; c += 2) {
            int32_t v0 = load_q(w, r * sm + c * sk, w_signed) - (w_signed ? 0 : 128);
            int32_t v1 = load_q(w, r * sm + (c + 1) * sk, w_signed) - (w_signed ? 0 : 128);
            if (abs(v0) + abs(v1) > 128) {
                planes = 2;
                break;
            }
        }
#endif
    int64_t group = planes * MR * I8_KU;
    for (int64_t r = 0; r < m; r++) {
        int32_t z = wz_n == 0 ? 0 : wz[wz_n == 1 ? 0 : r], sum = 0;
        ael *block = tiles + (r / MR) * kg * group;
        for (int64_t c = 0; c < k; c++) {
            int32_t v = load_q(w, r * sm + c * sk, w_signed);
#if I8_KU == 4
            if (!w_signed) v -= 128; /* the tiles hold int8: a uint8 weight and its zero point shift */
            sum += v;
#else
            v -= z;
#endif
            ael *at = block + (c / I8_KU) * group + (r % MR) * I8_KU + c % I8_KU;
            if (planes == 2) {
                at[0] = (ael)(v / 2);
                at[MR * I8_KU] = (ael)(v - v / 2);
            } else {
                at[0] = (ael)v;
            }
        }
#if I8_KU == 4
        if (!w_signed) z -= 128;
#endif
        rowsum[r] = sum;
        zp[r] = z;
        has |= z != 0;
    }
    head[0] = m, head[1] = k, head[2] = has, head[3] = planes;
}

/* Where B comes from: an image (im2col of one N's C x H x W) or a row-major matrix (B[k][n] = a[n][k]). */
typedef struct {
    const void *x;
    int64_t is_signed, zb, k, n;
    int64_t conv, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ow, lda;
} source;

#if I8_KU == 4
#define SHIFT_OF(s) ((I8_PATH != 3) == ((s)->is_signed != 0) ? (I8_PATH != 3 ? 128 : -128) : 0)
#else
#define SHIFT_OF(s) (-(int32_t)(s)->zb)
#endif

/* dst[t] = src[t * step] + off for t < count, in the tiles' element type (vectorised at step 1). */
static void copy_row(const void *src, int64_t is_signed, int64_t step, int64_t count, int32_t off, bel *dst) {
    if (is_signed) {
        const int8_t *p = (const int8_t *)src;
        if (step == 1)
            for (int64_t t = 0; t < count; t++) dst[t] = (bel)(p[t] + off);
        else
            for (int64_t t = 0; t < count; t++) dst[t] = (bel)(p[t * step] + off);
    } else {
        const uint8_t *p = (const uint8_t *)src;
        if (step == 1)
            for (int64_t t = 0; t < count; t++) dst[t] = (bel)(p[t] + off);
        else
            for (int64_t t = 0; t < count; t++) dst[t] = (bel)(p[t * step] + off);
    }
}

static inline void fill(bel *dst, int64_t count, bel v) {
    for (int64_t t = 0; t < count; t++) dst[t] = v;
}

/* Rows [k0, k1) of B, columns [n0, n0 + cols), row-major into tmp (row stride ld): each row is one
 * kernel tap of one channel, copied a run of output pixels at a time; padding reads as the zero point. */
static void rows_of_b(const source *s, int64_t k0, int64_t k1, int64_t n0, int64_t cols, bel *tmp, int64_t ld) {
    int32_t off = SHIFT_OF(s);
    bel pad = (bel)(s->zb + off);
    if (!s->conv) {
        for (int64_t kk = k0; kk < k1; kk++)
            copy_row((const char *)s->x + (n0 * s->lda + kk), s->is_signed, s->lda, cols, off, tmp + (kk - k0) * ld);
        return;
    }
    /* No division in the loops (a 64-bit idiv costs ~40 cycles): the tap counters advance with kk, and
     * the valid run of output pixels depends only on the tap's column, so it is found once per column:
     * for a whole output row (ow from 0) and for the chunk's first, partial one (ow from ow0). */
    int64_t oh0 = n0 / s->ow, ow0 = n0 % s->ow;
    int64_t runs[4][16], *lo_full = runs[0], *hi_full = runs[1], *lo_first = runs[2], *hi_first = runs[3];
    int64_t taps = s->kw <= 16 ? s->kw : 0;
    for (int64_t jj = 0; jj < taps; jj++) {
        int64_t shift = jj * s->dw - s->pw;
        for (int first = 0; first < 2; first++) {
            int64_t x0 = (first ? ow0 * s->sw : 0) + shift, seg = s->ow - (first ? ow0 : 0);
            int64_t lo = x0 < 0 ? (-x0 + s->sw - 1) / s->sw : 0, hi = x0 < s->w ? (s->w - x0 + s->sw - 1) / s->sw : 0;
            lo = lo > seg ? seg : lo, hi = hi > seg ? seg : hi < lo ? lo : hi;
            (first ? lo_first : lo_full)[jj] = lo, (first ? hi_first : hi_full)[jj] = hi;
        }
    }
    int64_t jj = k0 % s->kw, ii = (k0 / s->kw) % s->kh, cc = k0 / (s->kw * s->kh);
    /* stride 1 with the output as wide as the input ("same" padding): a tap's row of B is the plane
     * itself shifted, so it is one copy, then the padding of each output row's ends and of the rows
     * outside the image */
    int same = sizeof(bel) == 1 && off == 0 && s->sw == 1 && s->sh == 1 && s->w == s->ow;
    for (int64_t kk = k0; same && kk < k1; kk++) {
        bel *out = tmp + (kk - k0) * ld;
        const char *plane = (const char *)s->x + cc * s->h * s->w;
        int64_t shift = jj * s->dw - s->pw, rise = ii * s->dh - s->ph, w = s->w;
        /* columns whose input row is inside the image: output rows [-rise, h - rise) */
        int64_t ja = (-rise) * w - n0, jb = (s->h - rise) * w - n0;
        ja = ja < 0 ? 0 : ja > cols ? cols : ja, jb = jb < ja ? ja : jb > cols ? cols : jb;
        /* a pixel reads plane[n + rise * w + shift]; the copy stays inside the plane, and the pixels it
         * leaves out there are row ends, padding (set below with the others) */
        int64_t base = n0 + rise * w + shift, ca = ja < -base ? -base : ja;
        int64_t cb = jb > s->h * w - base ? s->h * w - base : jb;
        cb = cb < ca ? ca : cb;
        fill(out, ca, pad);
        if (cb > ca) memcpy(out + ca, plane + base + ca, (size_t)(cb - ca));
        fill(out + cb, cols - cb, pad);
        if (shift != 0) {
            int64_t first = (n0 + ja) / w * w - n0; /* the output row holding column ja */
            for (int64_t r = first; r < jb; r += w)
                for (int64_t t = 0; t < (shift < 0 ? -shift : shift); t++) {
                    int64_t at = r + (shift < 0 ? t : w - 1 - t);
                    if (at >= ja && at < jb) out[at] = pad;
                }
        }
        if (++jj == s->kw) {
            jj = 0;
            if (++ii == s->kh) ii = 0, cc++;
        }
    }
    for (int64_t kk = k0; !same && kk < k1; kk++) {
        bel *out = tmp + (kk - k0) * ld;
        const char *plane = (const char *)s->x + cc * s->h * s->w;
        int64_t shift = jj * s->dw - s->pw, oh = oh0, ow = ow0;
        for (int64_t j = 0; j < cols; oh++, ow = 0) {
            int64_t seg = s->ow - ow < cols - j ? s->ow - ow : cols - j;
            int64_t y = oh * s->sh - s->ph + ii * s->dh, x0 = ow * s->sw + shift, lo, hi;
            if (y < 0 || y >= s->h) {
                fill(out + j, seg, pad);
                j += seg;
                continue;
            }
            if (taps) {
                lo = ow ? lo_first[jj] : lo_full[jj], hi = ow ? hi_first[jj] : hi_full[jj];
                lo = lo > seg ? seg : lo, hi = hi > seg ? seg : hi;
            } else {
                lo = x0 < 0 ? (-x0 + s->sw - 1) / s->sw : 0, hi = x0 < s->w ? (s->w - x0 + s->sw - 1) / s->sw : 0;
                lo = lo > seg ? seg : lo, hi = hi > seg ? seg : hi < lo ? lo : hi;
            }
            fill(out + j, lo, pad);
            const char *src = plane + y * s->w + x0 + lo * s->sw;
            if (sizeof(bel) == 1 && off == 0 && s->sw == 1) {
                memcpy(out + j + lo, src, (size_t)(hi - lo)); /* uint8 into uint8 tiles: a plain copy */
            } else if (sizeof(bel) == 1 && off == 0 && s->sw == 2) {
                const uint8_t *p = (const uint8_t *)src; /* every other byte: a strided stem's rows */
                bel *d = out + j + lo;
                for (int64_t t = 0; t < hi - lo; t++) d[t] = (bel)p[2 * t];
            } else {
                copy_row(src, s->is_signed, s->sw, hi - lo, off, out + j + lo);
            }
            fill(out + j + hi, seg - hi, pad);
            j += seg;
        }
        if (++jj == s->kw) {
            jj = 0;
            if (++ii == s->kh) ii = 0, cc++;
        }
    }
}

/* Rows [k0, k1) of B's columns [n0, n0 + nc) (nc a multiple of NR) into panels [nc / NR][groups][NR][KU];
 * colsum (when not NULL) gains each column's sum over these rows. */
static void pack_b(const source *s, int64_t k0, int64_t k1, int64_t n0, int64_t nc, bel *tmp, bel *dst,
                   int32_t *colsum) {
    int64_t cols = s->n - n0 < nc ? s->n - n0 : nc, groups = (k1 - k0 + I8_KU - 1) / I8_KU;
    int64_t rows = groups * I8_KU, panel = groups * NR * I8_KU;
    rows_of_b(s, k0, k1, n0, cols, tmp, nc);
    for (int64_t r = k1 - k0; r < rows; r++) memset(tmp + r * nc, 0, (size_t)nc * sizeof(bel));
    if (cols < nc)
        for (int64_t r = 0; r < rows; r++) memset(tmp + r * nc + cols, 0, (size_t)(nc - cols) * sizeof(bel));
    for (int64_t p = 0; p < nc / NR; p++)
        for (int64_t g = 0; g < groups; g++) {
            bel *d = dst + p * panel + g * NR * I8_KU;
            const bel *t = tmp + g * I8_KU * nc + p * NR;
#if I8_KU == 4 && defined(__SSE2__)
            /* four rows of 16 bytes into 16 columns of 4: two rounds of interleaving */
            __m128i r0 = _mm_loadu_si128((const __m128i *)t), r1 = _mm_loadu_si128((const __m128i *)(t + nc));
            __m128i r2 = _mm_loadu_si128((const __m128i *)(t + 2 * nc));
            __m128i r3 = _mm_loadu_si128((const __m128i *)(t + 3 * nc));
            __m128i lo01 = _mm_unpacklo_epi8(r0, r1), hi01 = _mm_unpackhi_epi8(r0, r1);
            __m128i lo23 = _mm_unpacklo_epi8(r2, r3), hi23 = _mm_unpackhi_epi8(r2, r3);
            _mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi16(lo01, lo23));
            _mm_storeu_si128((__m128i *)d + 1, _mm_unpackhi_epi16(lo01, lo23));
            _mm_storeu_si128((__m128i *)d + 2, _mm_unpacklo_epi16(hi01, hi23));
            _mm_storeu_si128((__m128i *)d + 3, _mm_unpackhi_epi16(hi01, hi23));
#else
            for (int j = 0; j < NR; j++)
                for (int u = 0; u < I8_KU; u++) d[j * I8_KU + u] = t[u * nc + j];
#endif
        }
    if (colsum)
        for (int64_t r = 0; r < k1 - k0; r++)
            for (int64_t j = 0; j < cols; j++) colsum[j] += tmp[r * nc + j];
}

#if I8_PATH == 1
/* acc[MR][NR] (+)= A block (kg groups, ``planes`` per group) . B panel: vpmaddubsw pair sums widened
 * by vpmaddwd(1). One function per plane count, so the accumulators stay in registers. */
#define PLANE_LOOP(PLANES)                                                                                    \
    const __m256i ones = _mm256_set1_epi16(1);                                                                \
    __m256i c[MR][2];                                                                                         \
    for (int r = 0; r < MR; r++) {                                                                            \
        c[r][0] = first ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)acc[r]);              \
        c[r][1] = first ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)acc[r] + 1);          \
    }                                                                                                         \
    for (int64_t g = 0; g < kg; g++, a += PLANES * MR * I8_KU, b += NR * I8_KU) {                             \
        __m256i b0 = _mm256_loadu_si256((const __m256i *)b), b1 = _mm256_loadu_si256((const __m256i *)b + 1); \
        for (int r = 0; r < MR; r++)                                                                          \
            for (int q = 0; q < PLANES; q++) {                                                                \
                int32_t quad;                                                                                 \
                memcpy(&quad, a + q * MR * I8_KU + r * I8_KU, 4);                                             \
                __m256i av = _mm256_set1_epi32(quad);                                                         \
                c[r][0] = _mm256_add_epi32(c[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(b0, av), ones));  \
                c[r][1] = _mm256_add_epi32(c[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(b1, av), ones));  \
            }                                                                                                 \
    }                                                                                                         \
    for (int r = 0; r < MR; r++) {                                                                            \
        _mm256_storeu_si256((__m256i *)acc[r], c[r][0]);                                                      \
        _mm256_storeu_si256((__m256i *)acc[r] + 1, c[r][1]);                                                  \
    }

/* the first 8 columns only: a last panel of at most 8 (7x7 maps have 49 pixels) costs half */
#define HALF_LOOP(PLANES)                                                                                     \
    const __m256i ones = _mm256_set1_epi16(1);                                                                \
    __m256i c[MR];                                                                                            \
    for (int r = 0; r < MR; r++) c[r] = first ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)acc[r]); \
    for (int64_t g = 0; g < kg; g++, a += PLANES * MR * I8_KU, b += NR * I8_KU) {                             \
        __m256i b0 = _mm256_loadu_si256((const __m256i *)b);                                                  \
        for (int r = 0; r < MR; r++)                                                                          \
            for (int q = 0; q < PLANES; q++) {                                                                \
                int32_t quad;                                                                                 \
                memcpy(&quad, a + q * MR * I8_KU + r * I8_KU, 4);                                             \
                c[r] = _mm256_add_epi32(c[r], _mm256_madd_epi16(_mm256_maddubs_epi16(b0, _mm256_set1_epi32(quad)), ones)); \
            }                                                                                                 \
    }                                                                                                         \
    for (int r = 0; r < MR; r++) _mm256_storeu_si256((__m256i *)acc[r], c[r]);

static void tile_one(const ael *a, const bel *b, int64_t kg, int32_t acc[MR][NR], int first) { PLANE_LOOP(1) }
/* each plane's pair sums fit int16 and widen on their own (their total may not fit) */
static void tile_two(const ael *a, const bel *b, int64_t kg, int32_t acc[MR][NR], int first) { PLANE_LOOP(2) }
static void half_one(const ael *a, const bel *b, int64_t kg, int32_t acc[MR][NR], int first) { HALF_LOOP(1) }
static void half_two(const ael *a, const bel *b, int64_t kg, int32_t acc[MR][NR], int first) { HALF_LOOP(2) }

static void tile(const ael *a, const bel *b, int64_t kg, int32_t acc[MR][NR], int first, int64_t planes,
                 int64_t cols) {
    if (cols <= NR / 2) {
        if (planes == 2) half_two(a, b, kg, acc, first);
        else half_one(a, b, kg, acc, first);
    } else if (planes == 2) {
        tile_two(a, b, kg, acc, first);
    } else {
        tile_one(a, b, kg, acc, first);
    }
}
#else
/* acc[MR][NR] (+)= A block (kg groups) . B panel. */
static void tile(const ael *a, const bel *b, int64_t kg, int32_t acc[MR][NR], int first, int64_t planes,
                 int64_t cols) {
    (void)planes, (void)cols;
#if I8_PATH == 2
    __m256i c[MR][2];
    for (int r = 0; r < MR; r++) {
        c[r][0] = first ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)acc[r]);
        c[r][1] = first ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)acc[r] + 1);
    }
    for (int64_t g = 0; g < kg; g++, a += MR * I8_KU, b += NR * I8_KU) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)b), b1 = _mm256_loadu_si256((const __m256i *)b + 1);
        for (int r = 0; r < MR; r++) {
            int32_t quad;
            memcpy(&quad, a + r * I8_KU, 4);
            __m256i av = _mm256_set1_epi32(quad);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            c[r][0] = _mm256_dpbusd_epi32(c[r][0], b0, av);
            c[r][1] = _mm256_dpbusd_epi32(c[r][1], b1, av);
#else
            c[r][0] = _mm256_dpbusd_avx_epi32(c[r][0], b0, av);
            c[r][1] = _mm256_dpbusd_avx_epi32(c[r][1], b1, av);
#endif
        }
    }
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_si256((__m256i *)acc[r], c[r][0]);
        _mm256_storeu_si256((__m256i *)acc[r] + 1, c[r][1]);
    }
#elif I8_PATH == 3
    int32x4_t c[MR][4];
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < 4; q++) c[r][q] = first ? vdupq_n_s32(0) : vld1q_s32(acc[r] + 4 * q);
    for (int64_t g = 0; g < kg; g++, a += MR * I8_KU, b += NR * I8_KU) {
        int8x16_t bq[4];
        for (int q = 0; q < 4; q++) bq[q] = vld1q_s8(b + 16 * q);
        for (int r = 0; r < MR; r++) {
            int32_t quad;
            memcpy(&quad, a + r * I8_KU, 4);
            int8x16_t av = vreinterpretq_s8_s32(vdupq_n_s32(quad));
            for (int q = 0; q < 4; q++) c[r][q] = vdotq_s32(c[r][q], bq[q], av);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < 4; q++) vst1q_s32(acc[r] + 4 * q, c[r][q]);
#else
    if (first)
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) acc[r][j] = 0;
    for (int64_t g = 0; g < kg; g++, a += MR * I8_KU, b += NR * I8_KU)
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++)
                acc[r][j] += (int32_t)a[r * 2] * b[j * 2] + (int32_t)a[r * 2 + 1] * b[j * 2 + 1];
#endif
}
#endif

typedef struct {
    const int32_t *bias;
    const float *mult; /* NULL: store int32 */
    int64_t mult_n, yz, lo, hi, out_type, sm, sn; /* out_type 0 int32, 1 uint8, 2 int8 */
    void *y;
} sink;

static void store(const sink *o, const int32_t *rowsum, const int32_t *zp, int64_t has_zp, int64_t zb, int64_t k,
                  int64_t m0, int64_t rows, int64_t n0, int64_t cols, int32_t acc[MR][NR], const int32_t *colsum) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t m = m0 + r;
        int32_t fix = o->bias ? o->bias[m] : 0;
#if I8_KU == 4
        fix += -(int32_t)zb * rowsum[m] + (int32_t)(k * zb) * zp[m];
#endif
        float mult = o->mult ? o->mult[o->mult_n == 1 ? 0 : m] : 0.0f;
#if defined(__SSE4_1__)
        if (o->out_type != 0 && cols == NR && o->sn == 1) {
            /* 16 outputs at once: the float multiply, cvtps (round half to even, as lrintf), zero point,
             * then saturating packs (monotone, so the same as clamping) and the [lo, hi] clamp */
            __m128i f[4];
            for (int q = 0; q < 4; q++) {
                __m128i v = _mm_add_epi32(_mm_loadu_si128((const __m128i *)(acc[r] + 4 * q)), _mm_set1_epi32(fix));
#if I8_KU == 4
                if (has_zp)
                    v = _mm_sub_epi32(v, _mm_mullo_epi32(_mm_set1_epi32(zp[m]),
                                                         _mm_loadu_si128((const __m128i *)(colsum + 4 * q))));
#endif
                __m128 x = _mm_mul_ps(_mm_cvtepi32_ps(v), _mm_set1_ps(mult));
                x = _mm_max_ps(_mm_min_ps(x, _mm_set1_ps(1e9f)), _mm_set1_ps(-1e9f));
                f[q] = _mm_add_epi32(_mm_cvtps_epi32(x), _mm_set1_epi32((int32_t)o->yz));
            }
            __m128i w01 = _mm_packs_epi32(f[0], f[1]), w23 = _mm_packs_epi32(f[2], f[3]), out;
            if (o->out_type == 1)
                out = _mm_min_epu8(_mm_max_epu8(_mm_packus_epi16(w01, w23), _mm_set1_epi8((char)o->lo)),
                                   _mm_set1_epi8((char)o->hi));
            else
                out = _mm_min_epi8(_mm_max_epi8(_mm_packs_epi16(w01, w23), _mm_set1_epi8((char)o->lo)),
                                   _mm_set1_epi8((char)o->hi));
            _mm_storeu_si128((__m128i *)((char *)o->y + m * o->sm + n0), out);
            continue;
        }
#endif
        for (int64_t j = 0; j < cols; j++) {
            int32_t v = acc[r][j] + fix;
#if I8_KU == 4
            if (has_zp) v -= zp[m] * colsum[j];
#endif
            int64_t at = m * o->sm + (n0 + j) * o->sn;
            if (o->out_type == 0) {
                ((int32_t *)o->y)[at] = v;
                continue;
            }
            long q = lrintf((float)v * mult) + o->yz;
            q = q < o->lo ? o->lo : q > o->hi ? o->hi : q;
            if (o->out_type == 1) ((uint8_t *)o->y)[at] = (uint8_t)q;
            else ((int8_t *)o->y)[at] = (int8_t)q;
        }
    }
    (void)has_zp, (void)colsum, (void)zb, (void)k, (void)rowsum, (void)zp;
}

/* Blocked like GotoBLAS: B in chunks of columns by blocks of K rows (the packed block stays in L2 and
 * serves every row block of A), A's row block for one K block in L1; int32 partial sums between K
 * blocks in acc, the store after the last one. */
static int64_t run(const void *packed, const source *s, const sink *o) {
    const int64_t *head = (const int64_t *)packed;
    int64_t m = head[0], k = head[1], has_zp = head[2], planes = head[3], mp = mpad_of(m), kg = groups_of(k);
    const int32_t *rowsum = (const int32_t *)((const char *)packed + HEADER), *zp = rowsum + mp;
    const ael *tiles = (const ael *)(zp + mp);
    if (k != s->k) return -2;
    int64_t kc = kg < I8_KC ? kg : I8_KC; /* K groups per block */
    int64_t per_panel = kc * NR * I8_KU * (int64_t)sizeof(bel), panels = (I8_BUDGET << 10) / per_panel;
    int64_t total = (s->n + NR - 1) / NR;
    panels = panels < 1 ? 1 : panels > total ? total : panels;
    int64_t nc = panels * NR, blocks = (kg + kc - 1) / kc;
    bel *b = (bel *)malloc((size_t)(panels * per_panel) * 2 + 64);
    int32_t *colsum = (int32_t *)malloc((size_t)nc * sizeof(int32_t) + 64);
    int32_t(*acc)[MR][NR] = blocks > 1 ? malloc((size_t)(mp / MR * panels) * sizeof(int32_t[MR][NR])) : NULL;
    if (!b || !colsum || (blocks > 1 && !acc)) {
        free(b), free(colsum), free(acc);
        return -1;
    }
    bel *tmp = b + panels * per_panel / (int64_t)sizeof(bel);
    int64_t zb = s->zb;
#if I8_KU == 4
    zb += SHIFT_OF(s); /* the tiles hold B shifted into their signedness; its zero point moves with it */
#endif
    int32_t one[MR][NR];
    for (int64_t n0 = 0; n0 < s->n; n0 += nc) {
        int64_t width = s->n - n0 < nc ? (s->n - n0 + NR - 1) / NR * NR : nc;
        if (I8_KU == 4 && has_zp) memset(colsum, 0, (size_t)nc * sizeof(int32_t));
        for (int64_t g0 = 0; g0 < kg; g0 += kc) {
            int64_t g1 = g0 + kc < kg ? g0 + kc : kg, k1 = g1 * I8_KU < k ? g1 * I8_KU : k, last = g1 == kg;
            pack_b(s, g0 * I8_KU, k1, n0, width, tmp, b, I8_KU == 4 && has_zp ? colsum : NULL);
            for (int64_t m0 = 0; m0 < m; m0 += MR) {
                const ael *a = tiles + ((m0 / MR) * kg + g0) * planes * MR * I8_KU;
                for (int64_t j0 = 0; j0 < width; j0 += NR) {
                    int64_t cols = s->n - (n0 + j0) < NR ? s->n - (n0 + j0) : NR;
                    int32_t(*t)[NR] = blocks > 1 ? acc[(m0 / MR) * panels + j0 / NR] : one;
                    tile(a, b + (j0 / NR) * (g1 - g0) * NR * I8_KU, g1 - g0, t, g0 == 0, planes, cols);
                    if (last)
                        store(o, rowsum, zp, has_zp, zb, k, m0, m - m0 < MR ? m - m0 : MR, n0 + j0, cols, t,
                              colsum + j0);
                }
            }
        }
    }
    free(b), free(colsum), free(acc);
    return 0;
}

/* One image's 2-D convolution (group 1): y[m][oh * OW + ow] at y + m * sm + n * sn. Returns 0, -1 when
 * out of memory, -2 when the packed weight does not have C * KH * KW columns. */
int64_t cuvil_i8_conv2d(const void *packed, const void *x, int64_t x_signed, int64_t xz, int64_t c, int64_t h,
                        int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                        int64_t dw, int64_t oh, int64_t ow, const int32_t *bias, const float *mult, int64_t mult_n,
                        int64_t yz, int64_t lo, int64_t hi, int64_t out_type, void *y, int64_t sm, int64_t sn) {
    source s = {x, x_signed, xz, c * kh * kw, oh * ow, 1, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ow, 0};
    sink o = {bias, mult, mult_n, yz, lo, hi, out_type, sm, sn, y};
    return run(packed, &s, &o);
}

/* Y = A . a^T for a (rows x K, row stride lda): y[m * sm + r * sn]. Returns as cuvil_i8_conv2d. */
int64_t cuvil_i8_gemm(const void *packed, const void *a, int64_t a_signed, int64_t az, int64_t rows, int64_t k,
                      int64_t lda, const int32_t *bias, const float *mult, int64_t mult_n, int64_t yz, int64_t lo,
                      int64_t hi, int64_t out_type, void *y, int64_t sm, int64_t sn) {
    source s = {a, a_signed, az, k, rows, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, lda};
    sink o = {bias, mult, mult_n, yz, lo, hi, out_type, sm, sn, y};
    return run(packed, &s, &o);
}

/* y = saturate(rint(((a - za) * sa + (b - zb) * sb) / sy) + zy) over n elements: DequantizeLinear of
 * both, Add, QuantizeLinear in one pass, with the float32 operations of the numpy kernels in their
 * order (no fused multiply-add, so the result is theirs bit for bit). */
__attribute__((optimize("fp-contract=off"))) void cuvil_i8_add(const void *a, int64_t a_signed, const void *b,
                                                                int64_t b_signed, int64_t n, float sa, float za,
                                                                float sb, float zb, float sy, float zy,
                                                                int64_t y_signed, void *y) {
    float lo = y_signed ? -128.0f : 0.0f, hi = y_signed ? 127.0f : 255.0f;
    for (int64_t i = 0; i < n; i++) {
        float da = ((float)load_q(a, i, a_signed) - za) * sa, db = ((float)load_q(b, i, b_signed) - zb) * sb;
        float q = nearbyintf((da + db) / sy) + zy;
        q = q < lo ? lo : q > hi ? hi : q;
        if (y_signed) ((int8_t *)y)[i] = (int8_t)q;
        else ((uint8_t *)y)[i] = (uint8_t)q;
    }
}
