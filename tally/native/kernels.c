/* Tally's CPU kernels (AVX2 + FMA + F16C; outputs fp32).
 *
 * Why they exist: at one to a few tokens per step the CPU time goes to reading weights and to the
 * number of small framework calls, not to arithmetic. PyTorch's CPU weight-only kernels are slow with
 * fp32 activations on AVX2, and a decode layer costs ~60 dispatcher calls. These kernels read int4 / int8
 * weights into byte dot products with int8-rounded activations (as llama.cpp does) and fp16 weights into fp32
 * FMAs, fuse a layer's small steps (norm, rotary + cache write, paged decode attention, SiLU-and-multiply) into
 * one call each, and run a whole decode step's layers in one call (tally_decode_layers, at the end).
 *
 * Conventions: row-major, contiguous; activations and outputs fp32; x [M, K], weights [N, K] (fp16: panels,
 * see tally_gemm_f16), y [M, N].
 * `accumulate` != 0 adds into y (a projection that feeds the residual stream writes straight into it).
 * Threads: OpenMP over output rows; the library links the libgomp torch has already loaded, so
 * torch.set_num_threads governs it too.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NR 4            /* weight rows sharing one load of the activations: independent FMA chains */
#define PAR_MIN (1 << 18) /* multiply-adds per call below which threading costs more than it saves */

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* a . b for any length n (the vector loop plus a scalar tail) */
static inline float dot_any(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void store_out(float *y, float v, const float *bias, int64_t n, int accumulate) {
    if (bias) v += bias[n];
    *y = accumulate ? *y + v : v;
}

/* Each integer format below is one `*_rows` body: `nr` (a constant after inlining) weight rows n.. against
 * one activation row x, written to out[0..nr). The driver tiles N by NR, loops the activation rows inside a
 * tile (the tile's weights stay in L1 for the second row on) and parallelises over tiles. */
#define GEMM_DRIVER(ROWS_CALL)                                                                             \
    _Pragma("omp parallel for schedule(static) if (N * K * M >= PAR_MIN)")                                \
    for (int64_t n0 = 0; n0 < N; n0 += NR) {                                                            \
        int nr = N - n0 < NR ? (int)(N - n0) : NR;                                                        \
        for (int64_t r = 0; r < M; r++) {                                                                 \
            float out[NR] = {0};                                                                          \
            if (nr == NR) {                                                                               \
                ROWS_CALL(NR);                                                                            \
            } else {                                                                                      \
                for (int j = 0; j < nr; j++) { int64_t n1 = n0 + j; ROWS_CALL_ONE; }                      \
            }                                                                                             \
            for (int j = 0; j < nr; j++) store_out(y + r * N + n0 + j, out[j], bias, n0 + j, accumulate);  \
        }                                                                                                 \
    }

/* ---- Activations to int8, per row and block of 32: x ~ xq * dx (llama.cpp's Q8_0) ---------------------
 * The integer kernels below multiply int8 activations by the integer weights with AVX2's byte dot products
 * (32 multiply-adds per instruction), which is what makes them faster than converting every weight to fp32.
 * Each row is quantized on its own, so a token's result never depends on its batch. */
typedef struct { int8_t *xq; float *dx; } QuantizedRows;

static QuantizedRows quantize_rows(const float *x, int64_t M, int64_t K) {
    QuantizedRows q = {malloc(M * K), malloc(sizeof(float) * M * (K / 32))};
    for (int64_t b = 0; b < M * K / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float dx = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        q.dx[b] = dx;
        for (int i = 0; i < 32; i++) q.xq[b * 32 + i] = (int8_t)lrintf(xb[i] * inv);
    }
    return q;
}

/* x as the integer kernels see it (xq * dx), for the many-token paths: a token's result must not depend on
 * which path its batch size picked, so those paths multiply these values, not x. */
void tally_int8_roundtrip(const float *x, float *y, int64_t M, int64_t K) {
    QuantizedRows q = quantize_rows(x, M, K);
    for (int64_t i = 0; i < M * K; i++) y[i] = q.xq[i] * q.dx[i / 32];
    free(q.xq);
    free(q.dx);
}

static inline __m256 dot_i8_block(__m256i w_unsigned, __m256i x_signed) {
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w_unsigned, x_signed), ones));
}

/* ---- int4, asymmetric per group: w = q * d + m, q in 0..15 ------------------------------------------
 * qs [N, K/2]: every 32 weights are 16 bytes, byte j holding weight j (low nibble) and j + 16 (high) —
 * GGUF's Q4_0 / Q4_1 block layout, so those blocks load without conversion. d, m [N, K/group]; group is a
 * multiple of 32. y = sum_g d_g * (q_g . x_g) + m_g * sum(x_g), with x the int8 activations (sums once per call). */
/* One body for both integer formats (`int4` a constant after inlining): per group g of the nr weight rows,
 * sum over its 32-blocks c of (w_c . xq_c) * scale_g * dx_c. int4 weights are 0..15 (unsigned, straight into
 * maddubs); int8 weights are signed, so maddubs gets |w| and x with w's sign (llama.cpp's trick). */
static inline __attribute__((always_inline)) void int_rows(
    const int8_t *xq, const float *dx, const uint8_t *w, int64_t row_bytes, const float *scale, int64_t K,
    int64_t group, int nr, int int4, float *out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    int64_t G = K / group, per_group = group / 32, block_bytes = int4 ? 16 : 32;
    __m256 acc[NR];
    for (int j = 0; j < nr; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m256 sg[NR];
        for (int j = 0; j < nr; j++) sg[j] = _mm256_set1_ps(scale[j * G + g]);
        for (int64_t c = 0; c < per_group; c++, w += block_bytes, xq += 32, dx++) {
            __m256i xc = _mm256_loadu_si256((const __m256i *)xq);
            __m256 dxc = _mm256_set1_ps(*dx);
            for (int j = 0; j < nr; j++) {
                const uint8_t *p = w + j * row_bytes;
                _mm_prefetch((const char *)(p + NR * row_bytes), _MM_HINT_T0);  /* the next tile, same place */
                __m256 dot;
                if (int4) {
                    __m128i b = _mm_loadu_si128((const __m128i *)p);
                    dot = dot_i8_block(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), low4), xc);
                } else {
                    __m256i wj = _mm256_loadu_si256((const __m256i *)p);
                    dot = dot_i8_block(_mm256_sign_epi8(wj, wj), _mm256_sign_epi8(xc, wj));
                }
                acc[j] = _mm256_fmadd_ps(dot, _mm256_mul_ps(sg[j], dxc), acc[j]);
            }
        }
    }
    for (int j = 0; j < nr; j++) out[j] = hsum(acc[j]);
}

/* int4 adds the group minima: m_g * sum(x_g) */
static inline __attribute__((always_inline)) void q4_rows(
    const int8_t *xq, const float *dx, const float *xsum, const uint8_t *qs, const float *d, const float *m,
    int64_t K, int64_t group, int nr, float *out) {
    int64_t G = K / group;
    int_rows(xq, dx, qs, K / 2, d, K, group, nr, 1, out);
    for (int j = 0; j < nr; j++) out[j] += dot_any(m + j * G, xsum, G);
}

void tally_gemm_q4(const float *x, const uint8_t *qs, const float *d, const float *m, const float *bias,
                   float *y, int64_t M, int64_t N, int64_t K, int64_t group, int accumulate) {
    int64_t G = K / group;
    QuantizedRows xq = quantize_rows(x, M, K);
    float *xsum = malloc(sizeof(float) * M * G);  /* per group: the sum of the quantized activations */
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < G; g++) {
            float s = 0;
            for (int64_t b = (r * K + g * group) / 32; b < (r * K + (g + 1) * group) / 32; b++) {
                int32_t isum = 0;
                for (int i = 0; i < 32; i++) isum += xq.xq[b * 32 + i];
                s += xq.dx[b] * (float)isum;
            }
            xsum[r * G + g] = s;
        }
#define Q4_ARGS xq.xq + r * K, xq.dx + r * (K / 32), xsum + r * G
#define Q4_CALL(nr) q4_rows(Q4_ARGS, qs + n0 * (K / 2), d + n0 * G, m + n0 * G, K, group, nr, out)
#define ROWS_CALL_ONE q4_rows(Q4_ARGS, qs + n1 * (K / 2), d + n1 * G, m + n1 * G, K, group, 1, out + j)
    GEMM_DRIVER(Q4_CALL)
#undef ROWS_CALL_ONE
    free(xsum);
    free(xq.xq);
    free(xq.dx);
}

/* ---- int8, symmetric per group: w = q * s, s [N, K/group] (group = K: per output channel) ------------- */
void tally_gemm_q8(const float *x, const int8_t *q, const float *s, const float *bias, float *y,
                   int64_t M, int64_t N, int64_t K, int64_t group, int accumulate) {
    int64_t G = K / group;
    QuantizedRows xq = quantize_rows(x, M, K);
#define Q8_ARGS xq.xq + r * K, xq.dx + r * (K / 32)
#define Q8_CALL(nr) int_rows(Q8_ARGS, (const uint8_t *)(q + n0 * K), K, s + n0 * G, K, group, nr, 0, out)
#define ROWS_CALL_ONE int_rows(Q8_ARGS, (const uint8_t *)(q + n1 * K), K, s + n1 * G, K, group, 1, 0, out + j)
    GEMM_DRIVER(Q8_CALL)
#undef ROWS_CALL_ONE
    free(xq.xq);
    free(xq.dx);
}

/* ---- fp16 weights, fp32 arithmetic, in panels ------------------------------------------------------------
 * w is [ceil(N/16)][K][16] fp16: for each k, 16 consecutive outputs side by side (rows past N are zero). One
 * weight load and F16C conversion serves every activation row of a block (outer-product form, like a BLAS
 * micro-kernel), so the same kernel serves one token and a prefill chunk: up to 4 rows x 16 outputs live in
 * registers; for fewer rows, independent accumulators over k keep the FMA pipes busy. Activation rows are taken
 * in blocks of F16_MB so the block stays in cache while every panel passes over it. */
#define PANEL 16
#define F16_MB 64

static inline __attribute__((always_inline)) void f16_panel(
    const float *x, int64_t K, const uint16_t *w, int mr, float out[4][PANEL]) {
    /* ku accumulator sets over k (k % ku) when rows are few: mr * 2 * ku = 8 accumulators */
    const int ku = mr == 1 ? 4 : mr == 2 ? 2 : 1;
    __m256 acc[4][4][2];
    for (int u = 0; u < ku; u++)
        for (int r = 0; r < mr; r++) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + ku <= K; k += ku) {
        for (int u = 0; u < ku; u++) {
            const uint16_t *wk = w + (k + u) * PANEL;
            __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wk));
            __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wk + 8)));
            for (int r = 0; r < mr; r++) {
                __m256 xb = _mm256_broadcast_ss(x + r * K + k + u);
                acc[u][r][0] = _mm256_fmadd_ps(xb, w0, acc[u][r][0]);
                acc[u][r][1] = _mm256_fmadd_ps(xb, w1, acc[u][r][1]);
            }
        }
    }
    for (; k < K; k++) {
        const uint16_t *wk = w + k * PANEL;
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wk));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wk + 8)));
        for (int r = 0; r < mr; r++) {
            __m256 xb = _mm256_broadcast_ss(x + r * K + k);
            acc[0][r][0] = _mm256_fmadd_ps(xb, w0, acc[0][r][0]);
            acc[0][r][1] = _mm256_fmadd_ps(xb, w1, acc[0][r][1]);
        }
    }
    for (int r = 0; r < mr; r++) {
        __m256 a0 = acc[0][r][0], a1 = acc[0][r][1];
        for (int u = 1; u < ku; u++) a0 = _mm256_add_ps(a0, acc[u][r][0]), a1 = _mm256_add_ps(a1, acc[u][r][1]);
        _mm256_storeu_ps(out[r], a0);
        _mm256_storeu_ps(out[r] + 8, a1);
    }
}

void tally_gemm_f16(const float *x, const uint16_t *w, const float *bias, float *y,
                    int64_t M, int64_t N, int64_t K, int accumulate) {
    int64_t panels = (N + PANEL - 1) / PANEL;
    for (int64_t m0 = 0; m0 < M; m0 += F16_MB) {
        int64_t m1 = M - m0 < F16_MB ? M : m0 + F16_MB;
        #pragma omp parallel for schedule(static) if (N * K * (m1 - m0) >= PAR_MIN)
        for (int64_t p = 0; p < panels; p++) {
            const uint16_t *wp = w + p * K * PANEL;
            int64_t n0 = p * PANEL, nr = N - n0 < PANEL ? N - n0 : PANEL;
            for (int64_t r0 = m0; r0 < m1; r0 += 4) {
                float out[4][PANEL];
                int mr = m1 - r0 < 4 ? (int)(m1 - r0) : 4;
                const float *xr = x + r0 * K;
                switch (mr) {
                    case 4: f16_panel(xr, K, wp, 4, out); break;
                    case 3: f16_panel(xr, K, wp, 3, out); break;
                    case 2: f16_panel(xr, K, wp, 2, out); break;
                    default: f16_panel(xr, K, wp, 1, out); break;
                }
                for (int r = 0; r < mr; r++)
                    for (int64_t j = 0; j < nr; j++) store_out(y + (r0 + r) * N + n0 + j, out[r][j], bias, n0 + j, accumulate);
            }
        }
    }
}

/* ---- RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w, per row of D (D a multiple of 8) ------------------ */
void tally_rms_norm(const float *x, const float *w, float *y, int64_t M, int64_t D, float eps) {
    for (int64_t r = 0; r < M; r++) {
        const float *xr = x + r * D;
        __m256 ss = _mm256_setzero_ps();
        for (int64_t i = 0; i < D; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(ss) / (float)D + eps));
        for (int64_t i = 0; i < D; i += 8)
            _mm256_storeu_ps(y + r * D + i,
                             _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), inv), _mm256_loadu_ps(w + i)));
    }
}

/* ---- SiLU(gate) * up: gate_up [M, 2I] (gate then up) -> y [M, I] ------------------------------------- */
void tally_silu_mul(const float *gate_up, float *y, int64_t M, int64_t I) {
    for (int64_t r = 0; r < M; r++) {
        const float *g = gate_up + r * 2 * I, *u = g + I;
        for (int64_t i = 0; i < I; i++) y[r * I + i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* ---- Rotary (rotate-half) on q and k in place, then k and v into the paged cache ----------------------
 * qkv [T, row] holds q [Hq, D], k [Hkv, D], v [Hkv, D] side by side; cos, sin [T, D]; the caches are
 * [slots, Hkv, D] fp32; slots [T] the cache slot of each token. */
void tally_rope_store(float *qkv, int64_t T, int64_t row, const float *cos, const float *sin, int64_t Hq,
                      int64_t Hkv, int64_t D, float *k_cache, float *v_cache, const int64_t *slots) {
    int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * D, *s = sin + t * D;
        float *base = qkv + t * row;
        for (int64_t h = 0; h < Hq + Hkv; h++) {
            float *v = base + h * D;
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
        memcpy(k_cache + slots[t] * Hkv * D, base + Hq * D, sizeof(float) * Hkv * D);
        memcpy(v_cache + slots[t] * Hkv * D, base + (Hq + Hkv) * D, sizeof(float) * Hkv * D);
    }
}

/* ---- Decode attention over the paged cache: one query token per sequence -----------------------------
 * q [n, Hq, D] with rows q_stride floats apart (heads contiguous); caches [slots, Hkv, D] fp32;
 * block_tables [n, bt_stride] int64; ctx [n] keys per sequence (the query's own included); window > 0 keeps the
 * last `window` keys. out [n, Hq, D].
 * Per (sequence, kv head): the scores of every query head sharing the head, a vectorised softmax, then the
 * probability-weighted V with each output head's D values held in registers; K and V are read in place from
 * their blocks (no gather copy). */
static inline float dot(const float *a, const float *b, int64_t D) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i < D; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    return hsum(_mm256_add_ps(acc0, acc1));
}

/* e^x, |relative error| < 2e-7 (Cephes' polynomial, as in the usual SIMD math libraries); x is clamped to
 * [-87.3, 88.4], so very negative scores give ~0, never NaN. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3762626647949f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* p[0..len) <- softmax(p), in place */
static void softmax(float *p, int64_t len) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < len; t++) mx = fmaxf(mx, p[t]);
    __m256 vmx = _mm256_set1_ps(mx), vs = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + t), vmx));
        _mm256_storeu_ps(p + t, e);
        vs = _mm256_add_ps(vs, e);
    }
    float sum = hsum(vs);
    for (; t < len; t++) sum += (p[t] = expf(p[t] - mx));
    float inv = 1.0f / sum;
    for (t = 0; t < len; t++) p[t] *= inv;
}

/* o[0..D) = sum_t p[t] * v(slot[t]), D a multiple of 8; 64 values at a time in registers */
static void weighted_v(const float *p, const int64_t *slots, int64_t len, const float *v, int64_t row_stride,
                       int64_t D, float *o) {
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {
        __m256 acc[8];
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++) {
            const float *vp = v + slots[t] * row_stride + d0;
            __m256 pw = _mm256_set1_ps(p[t]);
            for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(pw, _mm256_loadu_ps(vp + 8 * i), acc[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
    }
    for (; d0 < D; d0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + slots[t] * row_stride + d0), acc);
        _mm256_storeu_ps(o + d0, acc);
    }
}

void tally_decode_attention(const float *q, int64_t q_stride, const float *k_cache, const float *v_cache,
                            const int64_t *block_tables, int64_t bt_stride, const int64_t *ctx, int64_t n,
                            int64_t Hq, int64_t Hkv, int64_t D, int64_t block_size, int64_t window, float scale,
                            float *out) {
    int64_t group = Hq / Hkv;
    #pragma omp parallel for schedule(dynamic) collapse(2) if (n * Hkv > 1 && n * ctx[0] * Hq * D >= PAR_MIN)
    for (int64_t b = 0; b < n; b++) {
        for (int64_t h = 0; h < Hkv; h++) {
            int64_t L = ctx[b], start = (window > 0 && L > window) ? L - window : 0, len = L - start;
            const int64_t *bt = block_tables + b * bt_stride;
            int64_t *slots = malloc(sizeof(int64_t) * len);
            float *p = malloc(sizeof(float) * len * group);
            for (int64_t t = 0; t < len; t++) {
                int64_t pos = start + t;
                slots[t] = (bt[pos / block_size] * block_size + pos % block_size) * Hkv + h;  /* row of [slots*Hkv, D] */
            }
            for (int64_t t = 0; t < len; t++) {
                const float *kp = k_cache + slots[t] * D;
                for (int64_t j = 0; j < group; j++) p[j * len + t] = dot(q + b * q_stride + (h * group + j) * D, kp, D) * scale;
            }
            for (int64_t j = 0; j < group; j++) {
                softmax(p + j * len, len);
                weighted_v(p + j * len, slots, len, v_cache, D, D, out + (b * Hq + h * group + j) * D);
            }
            free(slots);
            free(p);
        }
    }
}

/* ---- A whole decode step through every layer, in one call ---------------------------------------------
 * For decode-only steps of models whose projections all have native formats: per layer the same sequence as
 * DecoderLayer._forward_native (norm, qkv, rotary + cache write, paged attention, o into the residual, norm,
 * gate/up, SiLU-and-multiply, down into the residual), with no interpreter between the steps. The Python side
 * (tally/native/decode_step.py) fills these structs once, from the loaded model's tensors. */
enum { PROJ_Q4 = 1, PROJ_Q8 = 2, PROJ_F16 = 3 };

typedef struct {
    int64_t kind, n, k, group;
    const void *w;
    const float *scale, *min, *bias; /* q4: d, m; q8: s, unused; f16: unused */
} Proj;

typedef struct {
    const float *input_norm, *post_norm;
    Proj qkv, o, gate_up, down;
    float *k_cache, *v_cache;
} Layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size, window;
    float scale, eps;
    const Layer *layers;
} Model;

static void project(const Proj *p, const float *x, float *y, int64_t M, int accumulate) {
    if (p->kind == PROJ_Q4)
        tally_gemm_q4(x, p->w, p->scale, p->min, p->bias, y, M, p->n, p->k, p->group, accumulate);
    else if (p->kind == PROJ_Q8)
        tally_gemm_q8(x, p->w, p->scale, p->bias, y, M, p->n, p->k, p->group, accumulate);
    else
        tally_gemm_f16(x, p->w, p->bias, y, M, p->n, p->k, accumulate);
}

/* h [n, hidden] (the embeddings in, the last layer's output out, in place); cos, sin [n, D]; slots [n];
 * block_tables [>= n, bt_stride]; ctx [n]. */
void tally_decode_layers(const Model *md, float *h, int64_t n, const float *cos, const float *sin,
                         const int64_t *slots, const int64_t *block_tables, int64_t bt_stride, const int64_t *ctx) {
    int64_t H = md->hidden, D = md->head_dim, q_size = md->heads * D;
    int64_t row = (md->heads + 2 * md->kv_heads) * D, I = md->intermediate;
    float *x = malloc(sizeof(float) * n * H), *qkv = malloc(sizeof(float) * n * row);
    float *att = malloc(sizeof(float) * n * q_size), *gu = malloc(sizeof(float) * n * 2 * I);
    float *act = malloc(sizeof(float) * n * I);
    for (int64_t l = 0; l < md->num_layers; l++) {
        const Layer *L = md->layers + l;
        tally_rms_norm(h, L->input_norm, x, n, H, md->eps);
        project(&L->qkv, x, qkv, n, 0);
        tally_rope_store(qkv, n, row, cos, sin, md->heads, md->kv_heads, D, L->k_cache, L->v_cache, slots);
        tally_decode_attention(qkv, row, L->k_cache, L->v_cache, block_tables, bt_stride, ctx, n, md->heads,
                               md->kv_heads, D, md->block_size, md->window, md->scale, att);
        project(&L->o, att, h, n, 1);
        tally_rms_norm(h, L->post_norm, x, n, H, md->eps);
        project(&L->gate_up, x, gu, n, 0);
        tally_silu_mul(gu, act, n, I);
        project(&L->down, act, h, n, 1);
    }
    free(x); free(qkv); free(att); free(gu); free(act);
}
