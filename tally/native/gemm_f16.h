/* fp16, bf16 or fp32 weights in panels, fp32 arithmetic: tally_gemm_f16, _bf16, _f32. Included by kernels.c after
 * pool.h and the projections' small helpers (store_out, prefetch_stream). */

/* ---- fp16, bf16 or fp32 weights, fp32 arithmetic, in panels ---------------------------------------------
 * w is [ceil(N/16)][K][16] fp16 (bf16, fp32: tally_gemm_bf16, _f32): for each k, 16 consecutive outputs side by side
 * (rows past N are zero). One weight load (and F16C conversion) serves every activation row of a block (outer-product
 * form, like a BLAS micro-kernel), so the same kernel serves one token and a prefill chunk: up to 6 rows x 16 outputs
 * live in registers; for fewer rows, several panels side by side keep the FMA pipes busy. Every output is one FMA chain
 * over k in order, whatever the rows and panels of its tile, so a row's outputs are bitwise the same alone or in any
 * batch (docs/server.md#reproducibility), which a BLAS's shape-dependent blocking does not promise: the fp32 form is
 * the batch-invariant path of fp32 checkpoints, and the bf16 form (a 16-bit shift widens it exactly) that of `--dtype
 * bfloat16`. Activation rows are taken in blocks of F16_MB so the block stays in cache while every panel passes over
 * it. */
#define PANEL 16
#define F16_MR 6   /* rows per micro-tile: 6 x 16 outputs = 12 accumulators, 2 weight vectors, 1 broadcast */
#define F16_NP 4   /* panels side by side at one row (2 at two rows): 8 accumulators */
#define F16_MB 66  /* rows per pass over the panels (a multiple of F16_MR) */

enum { PANEL_F16 = 0, PANEL_F32 = 1, PANEL_BF16 = 2 };  /* the panels' element formats */

/* the 16 weights of panel element i (w's elements in format `fmt`, a PANEL_* constant) as two fp32 vectors */
static inline __attribute__((always_inline)) void panel_load(const void *w, int64_t i, int fmt, __m256 *w0,
                                                             __m256 *w1) {
    if (fmt == PANEL_F32) {
        *w0 = _mm256_loadu_ps((const float *)w + i);
        *w1 = _mm256_loadu_ps((const float *)w + i + 8);
    } else if (fmt == PANEL_BF16) {
        *w0 = load8(w, i, KV_BF16);
        *w1 = load8(w, i + 8, KV_BF16);
    } else {
        *w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
        *w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i + 8)));
    }
}

/* mr rows x np panels (mr * np <= F16_MR) into out[r][p * PANEL + c] */
static inline __attribute__((always_inline)) void f16_tile(
    const float *x, int64_t K, const void *w, int mr, int np, int fmt, float out[F16_MR][F16_NP * PANEL]) {
    /* the loops over rows and panels unrolled early (the pragmas): otherwise GCC stores the accumulators to the stack
     * at every k besides holding them in registers, 0.65x the time at 6 rows */
    __m256 acc[F16_NP][F16_MR][2];
    _Pragma("GCC unroll 8")
    for (int p = 0; p < np; p++)
        _Pragma("GCC unroll 8")
        for (int r = 0; r < mr; r++) acc[p][r][0] = acc[p][r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        /* the integer loops' prefetches (PREFETCH_L2 above), a 64-byte line at a time (two k of 16 bits, one of fp32),
         * at 2-4 rows; at one row the hardware prefetcher keeps up and they only cost (docs/benchmarks.md#kernels) */
        if (mr > 1 && mr <= 4 && (fmt == PANEL_F32 || !(k & 1)))
            _Pragma("GCC unroll 8")
            for (int p = 0; p < np; p++)
                prefetch_stream((const uint8_t *)w + ((p * K + k) * PANEL << (1 + (fmt == PANEL_F32))), PREFETCH,
                                PREFETCH_L2);
        _Pragma("GCC unroll 8")
        for (int p = 0; p < np; p++) {
            __m256 w0, w1;
            panel_load(w, (p * K + k) * PANEL, fmt, &w0, &w1);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < mr; r++) {
                __m256 xb = _mm256_broadcast_ss(x + r * K + k);
                acc[p][r][0] = _mm256_fmadd_ps(xb, w0, acc[p][r][0]);
                acc[p][r][1] = _mm256_fmadd_ps(xb, w1, acc[p][r][1]);
            }
        }
    }
    _Pragma("GCC unroll 8")
    for (int r = 0; r < mr; r++)
        _Pragma("GCC unroll 8")
        for (int p = 0; p < np; p++) {
            _mm256_storeu_ps(out[r] + p * PANEL, acc[p][r][0]);
            _mm256_storeu_ps(out[r] + p * PANEL + 8, acc[p][r][1]);
        }
}

/* one tile of a shape the callers use, each its own constant shape so its loops unroll into registers */
static inline __attribute__((always_inline)) void f16_shape(const float *x, int64_t K, const void *w, int mr, int np,
                                                            int fmt, float out[F16_MR][F16_NP * PANEL]) {
    switch (mr * 8 + np) {
        case 6 * 8 + 1: f16_tile(x, K, w, 6, 1, fmt, out); break;
        case 5 * 8 + 1: f16_tile(x, K, w, 5, 1, fmt, out); break;
        case 4 * 8 + 1: f16_tile(x, K, w, 4, 1, fmt, out); break;
        case 3 * 8 + 1: f16_tile(x, K, w, 3, 1, fmt, out); break;
        case 2 * 8 + 2: f16_tile(x, K, w, 2, 2, fmt, out); break;
        case 2 * 8 + 1: f16_tile(x, K, w, 2, 1, fmt, out); break;
        case 1 * 8 + 4: f16_tile(x, K, w, 1, 4, fmt, out); break;
        case 1 * 8 + 3: f16_tile(x, K, w, 1, 3, fmt, out); break;
        case 1 * 8 + 2: f16_tile(x, K, w, 1, 2, fmt, out); break;
        default: f16_tile(x, K, w, 1, 1, fmt, out); break;
    }
}

typedef struct {
    const float *x, *bias;
    const void *w;
    float *y;
    int64_t N, K, m0, m1;
    int accumulate, fmt;
} F16Job;

/* rows r0.. (mr of them) by panels p.. (np of them) through f16_tile, then out to y */
static void f16_block(const F16Job *j, int64_t r0, int mr, int64_t p, int np) {
    float out[F16_MR][F16_NP * PANEL];
    const float *xr = j->x + r0 * j->K;
    const void *wp = (const uint8_t *)j->w + (p * j->K * PANEL << (1 + (j->fmt == PANEL_F32)));
    if (j->fmt == PANEL_F32)
        f16_shape(xr, j->K, wp, mr, np, PANEL_F32, out);
    else if (j->fmt == PANEL_BF16)
        f16_shape(xr, j->K, wp, mr, np, PANEL_BF16, out);
    else
        f16_shape(xr, j->K, wp, mr, np, PANEL_F16, out);
    for (int q = 0; q < np; q++) {
        int64_t n0 = (p + q) * PANEL, nr = j->N - n0 < PANEL ? j->N - n0 : PANEL;
        for (int r = 0; r < mr; r++)
            for (int64_t c = 0; c < nr; c++)
                store_out(j->y + (r0 + r) * j->N + n0 + c, out[r][q * PANEL + c], j->bias, n0 + c, j->accumulate);
    }
}

static void f16_panels(const void *job, int64_t p0, int64_t p1) {
    const F16Job *j = job;
    /* whole micro-tiles of 3-6 rows panel by panel, each panel staying in cache across the row blocks; then the
     * last 1-2 rows with panels side by side */
    int64_t tail = (j->m1 - j->m0) % F16_MR, rows = j->m1 - j->m0 - (tail && tail <= 2 ? tail : 0);
    for (int64_t p = p0; p < p1; p++)
        for (int64_t r0 = j->m0; r0 < j->m0 + rows; r0 += F16_MR)
            f16_block(j, r0, j->m0 + rows - r0 < F16_MR ? (int)(j->m0 + rows - r0) : F16_MR, p, 1);
    if (rows == j->m1 - j->m0) return;
    int mr = (int)(j->m1 - j->m0 - rows), np = mr == 1 ? F16_NP : F16_NP / 2;
    for (int64_t p = p0; p < p1; p += np)
        f16_block(j, j->m0 + rows, mr, p, p1 - p < np ? (int)(p1 - p) : np);
}

static void gemm_panels(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                        int accumulate, int fmt) {
    F16Job job = {x, bias, w, y, N, K, 0, 0, accumulate, fmt};
    for (job.m0 = 0; job.m0 < M; job.m0 += F16_MB) {
        job.m1 = M - job.m0 < F16_MB ? M : job.m0 + F16_MB;
        parallel_for((N + PANEL - 1) / PANEL, N * K * (job.m1 - job.m0), f16_panels, &job);
    }
}

void tally_gemm_f16(const float *x, const uint16_t *w, const float *bias, float *y,
                    int64_t M, int64_t N, int64_t K, int accumulate) {
    gemm_panels(x, w, bias, y, M, N, K, accumulate, PANEL_F16);
}

void tally_gemm_f32(const float *x, const float *w, const float *bias, float *y,
                    int64_t M, int64_t N, int64_t K, int accumulate) {
    gemm_panels(x, w, bias, y, M, N, K, accumulate, PANEL_F32);
}

void tally_gemm_bf16(const float *x, const uint16_t *w, const float *bias, float *y,
                     int64_t M, int64_t N, int64_t K, int accumulate) {
    gemm_panels(x, w, bias, y, M, N, K, accumulate, PANEL_BF16);
}
