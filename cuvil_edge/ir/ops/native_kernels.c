/* Native kernels for the ops numpy cannot run near the hardware's speed.
 *
 * Compiled on the device by its own C compiler (cuvil_edge/ir/ops/_native.py) and called through
 * ctypes from kernels that keep a complete numpy path: a target without a compiler, or a call
 * outside what these functions handle, runs the numpy code instead.
 *
 * Conventions: float32, C-contiguous buffers, int64 sizes, no allocation that outlives a call,
 * no global state (the functions are reentrant; an agent may run two models at once). Built with
 * -O3 -march=native but without -ffast-math, so NaN and infinities keep IEEE semantics. On glibc
 * x86-64 the loops over erff/expf are vectorised through libmvec (declared below, since glibc
 * declares the vector variants only under -ffast-math); elsewhere they call the scalar functions.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(CUVIL_MVEC)
float erff(float) __attribute__((__simd__("notinbranch")));
float erfcf(float) __attribute__((__simd__("notinbranch")));
float expf(float) __attribute__((__simd__("notinbranch")));
#endif

/* Bump when a signature changes: _native.py checks it before binding anything. */
int64_t cuvil_abi_version(void) { return 3; }

void cuvil_erf_f32(const float *restrict x, float *restrict y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = erff(x[i]);
}

/* Gelu (erf form) as 0.5 x erfc(-x / sqrt 2): exact where 1 + erf(x / sqrt 2) would cancel (x << 0). */
void cuvil_gelu_f32(const float *restrict x, float *restrict y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * erfcf(-0.70710678118654752f * v);
    }
}

void cuvil_sigmoid_f32(const float *restrict x, float *restrict y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
}

/* Softmax over each of `rows` contiguous rows of d: exp(x - max) / sum. A NaN in a row makes the
 * whole row NaN through the sum (as numpy's), so the max may skip NaNs and vectorise. */
void cuvil_softmax_f32(const float *restrict x, float *restrict y, int64_t rows, int64_t d) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float top = -INFINITY, total = 0.0f;
#pragma omp simd reduction(max : top)
        for (int64_t i = 0; i < d; i++) top = xr[i] > top ? xr[i] : top;
#pragma omp simd reduction(+ : total)
        for (int64_t i = 0; i < d; i++) {
            yr[i] = expf(xr[i] - top);
            total += yr[i];
        }
        const float scale = 1.0f / total;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) yr[i] *= scale;
    }
}

/* LayerNormalization over the last d elements of each of `rows` rows:
 * y = (x - mean) / sqrt(var + epsilon) * scale + bias (bias may be NULL), the sums in double. */
void cuvil_layer_norm_f32(const float *restrict x, const float *restrict scale, const float *restrict bias,
                          float *restrict y, int64_t rows, int64_t d, float epsilon) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double sum = 0.0, squares = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < d; i++) sum += xr[i];
        const float mean = (float)(sum / (double)d);
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < d; i++) {
            double c = (double)(xr[i] - mean);
            squares += c * c;
        }
        const float inv = 1.0f / sqrtf((float)(squares / (double)d) + epsilon);
        if (bias) {
#pragma omp simd
            for (int64_t i = 0; i < d; i++) yr[i] = (xr[i] - mean) * inv * scale[i] + bias[i];
        } else {
#pragma omp simd
            for (int64_t i = 0; i < d; i++) yr[i] = (xr[i] - mean) * inv * scale[i];
        }
    }
}

static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* Activation codes shared with _native.py's ACTIVATION_CODES. */
enum { ACT_CLAMP = 0, ACT_SIGMOID = 1, ACT_SWISH = 2, ACT_GELU = 3 };

/* In place over `planes` rows of `size`: y = act(y + bias) (b may be NULL), the epilogue of a
 * convolution or matrix product in one pass over its output. The bias is b[row % m] (a
 * convolution's, per output plane) or, with `inner`, b[column] (a Linear's, along each row).
 * act: clamp to [lo, hi] (none, Relu, Clip(0, 6)), sigmoid, swish (y * sigmoid(y)) or GELU (erf
 * form). Returns -1 for an unknown code. */
int64_t cuvil_epilogue_f32(float *restrict y, const float *restrict b, int64_t planes, int64_t m, int64_t size,
                           int64_t inner, int64_t act, float lo, float hi) {
    if (act < ACT_CLAMP || act > ACT_GELU) return -1;
    for (int64_t p = 0; p < planes; p++) {
        float bias = b && !inner ? b[p % m] : 0.0f;
        float *row = y + p * size;
        if (b && inner) {  /* the row is in cache for the pass below */
#pragma omp simd
            for (int64_t i = 0; i < size; i++) row[i] += b[i];
        }
        if (act == ACT_CLAMP) {
#pragma omp simd
            for (int64_t i = 0; i < size; i++) row[i] = clampf(row[i] + bias, lo, hi);
        } else if (act == ACT_SIGMOID) {
#pragma omp simd
            for (int64_t i = 0; i < size; i++) row[i] = 1.0f / (1.0f + expf(-(row[i] + bias)));
        } else if (act == ACT_SWISH) {
#pragma omp simd
            for (int64_t i = 0; i < size; i++) {
                float v = row[i] + bias;
                row[i] = v / (1.0f + expf(-v));
            }
        } else {
#pragma omp simd
            for (int64_t i = 0; i < size; i++) {
                float v = row[i] + bias;
                row[i] = 0.5f * v * erfcf(-0.70710678118654752f * v);
            }
        }
    }
    return 0;
}

/* Swish (opset 24): y = x * sigmoid(alpha x), as x / (1 + exp(-alpha x)). */
void cuvil_swish_f32(const float *restrict x, float *restrict y, int64_t n, float alpha) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = v / (1.0f + expf(-alpha * v));
    }
}

/* The depthwise kernel's register block: DW_BLOCK outputs in vectors of DW_LANES floats. */
#define DW_LANES 8
#define DW_BLOCK 32
typedef float dwv __attribute__((vector_size(DW_LANES * 4)));

/* The padded plane a window op reads: (ph x pw), x's plane at (top, left), `fill` elsewhere. */
static void pad_plane(const float *restrict src, float *restrict dst, int64_t h, int64_t w, int64_t ph, int64_t pw,
                      int64_t top, int64_t left, float fill) {
    for (int64_t i = 0; i < ph * pw; i++) dst[i] = fill;
    for (int64_t r = 0; r < h && r + top < ph; r++) {
        int64_t cols = w < pw - left ? w : pw - left;
        if (cols > 0) memcpy(dst + (r + top) * pw + left, src + r * w, (size_t)cols * sizeof(float));
    }
}

/* Depthwise 2-D convolution (group == channels, one filter per channel), NCHW:
 * y[n, c] = b[c] + sum over taps of w[c, ky, kx] * padded x[n, c] at (oy*sh + ky*dh, ox*sw + kx*dw),
 * then clamped to [lo, hi] (a fused Relu or Clip; -inf, inf for none). b may be NULL.
 * The padded plane (ph x pw) covers every window. Returns 0, or -1 when scratch cannot be allocated. */
int64_t cuvil_depthwise_conv2d_f32(const float *restrict x, const float *restrict w, const float *restrict b,
                                   float *restrict y, int64_t n, int64_t c, int64_t h, int64_t wd, int64_t kh,
                                   int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t top,
                                   int64_t left, int64_t oh, int64_t ow, int64_t ph, int64_t pw, float lo, float hi) {
    /* Stride 1 runs over the padded width: output (oy, ox) sits at oy * pw + ox of a flat
     * accumulator, so each tap is one long contiguous multiply-add (no short rows on small maps);
     * the pw - ow extra columns per row are computed and dropped. The plane gets (kw - 1) * dw
     * extra zeros so the last tap's reads stay inside it. */
    int64_t tail = (kw - 1) * dw, flat = sh == 1 && sw == 1;
    float *plane = malloc((size_t)(ph * pw + tail) * sizeof(float));
    float *acc = malloc((size_t)(flat ? oh * pw : ow) * sizeof(float));
    if (!plane || !acc) {
        free(plane);
        free(acc);
        return -1;
    }
    for (int64_t i = 0; i < tail; i++) plane[ph * pw + i] = 0.0f;
    for (int64_t p = 0; p < n * c; p++) {
        int64_t ch = p % c;
        const float *taps = w + ch * kh * kw;
        float bias = b ? b[ch] : 0.0f;
        float *out = y + p * oh * ow;
        pad_plane(x + p * h * wd, plane, h, wd, ph, pw, top, left, 0.0f);
        if (flat) {
            int64_t span = oh * pw, j = 0;
            /* DW_BLOCK outputs at a time summed over every tap in registers, stored once (a pass
             * over the accumulator per tap loaded and stored it kh * kw times) */
            for (; j + DW_BLOCK <= span; j += DW_BLOCK) {
                dwv s[DW_BLOCK / DW_LANES];
                for (int v = 0; v < DW_BLOCK / DW_LANES; v++) s[v] = bias - (dwv){0};
                for (int64_t ky = 0; ky < kh; ky++)
                    for (int64_t kx = 0; kx < kw; kx++) {
                        const dwv t = taps[ky * kw + kx] - (dwv){0};
                        const float *src = plane + ky * dh * pw + kx * dw + j;
#pragma GCC unroll 4
                        for (int v = 0; v < DW_BLOCK / DW_LANES; v++) {
                            dwv x;
                            memcpy(&x, src + v * DW_LANES, sizeof x);
                            s[v] += t * x;
                        }
                    }
                memcpy(acc + j, s, sizeof s);
            }
            for (int64_t r = j; r < span; r++) acc[r] = bias;
            for (int64_t ky = 0; ky < kh; ky++)
                for (int64_t kx = 0; kx < kw; kx++) {
                    const float t = taps[ky * kw + kx];
                    const float *src = plane + ky * dh * pw + kx * dw;
                    for (int64_t r = j; r < span; r++) acc[r] += t * src[r];
                }
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) out[oy * ow + ox] = clampf(acc[oy * pw + ox], lo, hi);
            continue;
        }
        for (int64_t oy = 0; oy < oh; oy++) {
            for (int64_t ox = 0; ox < ow; ox++) acc[ox] = bias;
            for (int64_t ky = 0; ky < kh; ky++) {
                const float *row = plane + (oy * sh + ky * dh) * pw;
                for (int64_t kx = 0; kx < kw; kx++) {
                    const float t = taps[ky * kw + kx];
                    const float *src = row + kx * dw;
                    for (int64_t ox = 0; ox < ow; ox++) acc[ox] += t * src[ox * sw];
                }
            }
            for (int64_t ox = 0; ox < ow; ox++) out[oy * ow + ox] = clampf(acc[ox], lo, hi);
        }
    }
    free(plane);
    free(acc);
    return 0;
}

/* 2-D max pooling, NCHW, pads read as -inf (never chosen over a real element); NaN propagates as
 * numpy's maximum does. The padded plane (ph x pw) covers every window, ceil_mode's included. */
int64_t cuvil_max_pool2d_f32(const float *restrict x, float *restrict y, int64_t planes, int64_t h, int64_t wd,
                             int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t top,
                             int64_t left, int64_t oh, int64_t ow, int64_t ph, int64_t pw) {
    float *plane = malloc((size_t)(ph * pw) * sizeof(float));
    if (!plane) return -1;
    for (int64_t p = 0; p < planes; p++) {
        pad_plane(x + p * h * wd, plane, h, wd, ph, pw, top, left, -INFINITY);
        for (int64_t oy = 0; oy < oh; oy++) {
            float *out = y + p * oh * ow + oy * ow;
            for (int64_t ox = 0; ox < ow; ox++) out[ox] = -INFINITY;
            for (int64_t ky = 0; ky < kh; ky++) {
                const float *row = plane + (oy * sh + ky * dh) * pw;
                for (int64_t kx = 0; kx < kw; kx++) {
                    const float *src = row + kx * dw;
                    for (int64_t ox = 0; ox < ow; ox++) {
                        float v = src[ox * sw], m = out[ox];
                        out[ox] = (v > m || v != v) ? v : m;
                    }
                }
            }
        }
    }
    free(plane);
    return 0;
}
