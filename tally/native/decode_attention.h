/* Paged decode attention (kernels.c: tally_decode_attention and the one-call decode step). Included by kernels.c
 * after hsum, exp256 and the kernels' threads (pool.h); reads K and V in place from the cache's blocks. */

/* ---- Decode attention over the paged cache: one query token per row --------------------------------------
 * q [n, Hq, D] with rows q_stride floats apart (heads contiguous); caches [slots, Hkv, D] fp32, or int8 with
 * scales [blocks, Hkv] (the int8 KV cache, read as value * scale);
 * block_tables [n, bt_stride] int64; ctx [n] keys per row (the query's own included); window > 0 keeps the
 * last `window` keys. out [n, Hq, D].
 * Per (rows of one sequence, kv head): the scores of every query head sharing the head, 8 keys at a time (one
 * accumulator a key, summed across lanes 8 at once), a vectorised softmax, then the probability-weighted V with each
 * output head's D values held in registers; K and V are read in place from their blocks (no gather copy).
 * Consecutive rows of one sequence (a speculative verify step's positions, a prompt run as decodes) read each key
 * once for all their queries; a row's scores are the same arithmetic, key by key, with or without its neighbours,
 * so grouping never changes a result. */
static inline __m256 load8(const void *row, int64_t i, int int8) {  /* 8 values of an fp32 or int8 row */
    if (int8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
    return _mm256_loadu_ps((const float *)row + i);
}

/* Lane i of the result: the sum of a[i]'s 8 lanes, as ((0+1)+(2+3))+((4+5)+(6+7)) */
static inline __m256 lane_sums8(const __m256 *a) {
    __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

/* out[0..n) = (q . k[i]) * ks[i] for 8 keys (those past n repeat a real key: computed, not stored) */
static inline void scores8(const float *q, const void *const *k, int64_t D, int int8, const float *ks, int n,
                           float *out) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        __m256 qd = _mm256_loadu_ps(q + d);
        for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(qd, load8(k[i], d, int8), acc[i]);
    }
    __m256 s = _mm256_mul_ps(lane_sums8(acc), _mm256_loadu_ps(ks));
    if (n == 8) {
        _mm256_storeu_ps(out, s);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, s);
        memcpy(out, tmp, sizeof(float) * n);
    }
}

/* p[0..len) <- softmax(p), in place */
static void softmax(float *p, int64_t len) {
    /* the max in vectors: fmaxf is a libm call per element here (no -ffast-math), ~17% of decode attention (perf) */
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(p + t));
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    for (; t < len; t++) mx = p[t] > mx ? p[t] : mx;
    __m256 vmx = _mm256_set1_ps(mx), vs = _mm256_setzero_ps();
    t = 0;
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

/* o[0..D) = sum_t p[t] * v(slot[t]), D a multiple of 8; 64 values at a time in registers (int8 values: p
 * already holds each one's scale) */
static void weighted_v(const float *p, const int64_t *slots, int64_t len, const void *v, int int8, int64_t D,
                       float *o) {
    int64_t esize = int8 ? 1 : sizeof(float);
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {
        __m256 acc[8];
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++) {
            const char *vp = (const char *)v + slots[t] * D * esize;
            __m256 pw = _mm256_set1_ps(p[t]);
            for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(pw, load8(vp, d0 + 8 * i, int8), acc[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
    }
    for (; d0 < D; d0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8((const char *)v + slots[t] * D * esize, d0, int8), acc);
        _mm256_storeu_ps(o + d0, acc);
    }
}

#define ATT_ROWS 8  /* rows of one sequence that share their keys' reads */

typedef struct {
    const float *q, *k_scales, *v_scales;
    const void *k_cache, *v_cache;
    const int64_t *block_tables, *ctx;
    const int64_t *first;  /* group g is rows first[g] .. first[g + 1] - 1 */
    int64_t q_stride, bt_stride, Hq, Hkv, D, block_size, window;
    float scale;
    float *out;
} AttentionJob;

static void attention_heads(const void *job, int64_t i0, int64_t i1) {  /* items: (group of rows, kv head) */
    const AttentionJob *a = job;
    int64_t Hkv = a->Hkv, D = a->D, group = a->Hq / Hkv, block_size = a->block_size;
    int int8 = a->k_scales != NULL;
    int64_t esize = int8 ? 1 : sizeof(float);
    for (int64_t i = i0; i < i1; i++) {
        int64_t g = i / Hkv, h = i % Hkv, b = a->first[g], rows = a->first[g + 1] - b;
        /* a group's rows all start at 0 (or it has one row): row r sees keys start..ctx[b + r] */
        int64_t L = a->ctx[b + rows - 1], start = (a->window > 0 && L > a->window) ? L - a->window : 0;
        int64_t len = L - start;
        const int64_t *bt = a->block_tables + b * a->bt_stride;
        int64_t *slots = malloc(sizeof(int64_t) * len);
        float *p = malloc(sizeof(float) * len * group * rows), *ks = malloc(sizeof(float) * (len + 8));
        float *vs = int8 ? malloc(sizeof(float) * len) : NULL;
        for (int64_t t = 0; t < len; t++) {
            int64_t pos = start + t, block = bt[pos / block_size];
            slots[t] = (block * block_size + pos % block_size) * Hkv + h;  /* row of [slots*Hkv, D] */
            ks[t] = int8 ? a->k_scales[block * Hkv + h] * a->scale : a->scale;
            if (int8) vs[t] = a->v_scales[block * Hkv + h];
        }
        memset(ks + len, 0, sizeof(float) * 8);  /* read by a last block's lanes past its keys, never stored */
        for (int64_t t0 = 0; t0 < len; t0 += 8) {
            int n = len - t0 < 8 ? (int)(len - t0) : 8;
            const void *k[8];
            for (int j = 0; j < 8; j++)
                k[j] = (const char *)a->k_cache + slots[t0 + (j < n ? j : n - 1)] * D * esize;
            for (int64_t r = 0; r < rows; r++) {
                int64_t len_r = a->ctx[b + r] - start;
                if (t0 >= len_r) continue;
                int nr = len_r - t0 < n ? (int)(len_r - t0) : n;
                const float *q = a->q + (b + r) * a->q_stride + h * group * D;
                for (int64_t j = 0; j < group; j++)
                    scores8(q + j * D, k, D, int8, ks + t0, nr, p + (r * group + j) * len + t0);
            }
        }
        for (int64_t r = 0; r < rows; r++) {
            int64_t len_r = a->ctx[b + r] - start;
            for (int64_t j = 0; j < group; j++) {
                float *pj = p + (r * group + j) * len;
                softmax(pj, len_r);
                if (int8)
                    for (int64_t t = 0; t < len_r; t++) pj[t] *= vs[t];
                float *out = a->out + ((b + r) * a->Hq + h * group + j) * D;
                weighted_v(pj, slots, len_r, a->v_cache, int8, D, out);
            }
        }
        free(slots);
        free(p);
        free(ks);
        free(vs);
    }
}

/* Rows b.. that are the next positions of row b's sequence (the same blocks, one more key each), at most ATT_ROWS,
 * all starting at key 0 (under a window only while no row has passed it) */
static int64_t rows_sharing_keys(const int64_t *block_tables, int64_t bt_stride, const int64_t *ctx, int64_t n,
                                 int64_t b, int64_t block_size, int64_t window) {
    int64_t r = 1;
    if (window > 0 && ctx[b] > window) return 1;
    while (b + r < n && r < ATT_ROWS && ctx[b + r] == ctx[b] + r && (window <= 0 || ctx[b + r] <= window) &&
           memcmp(block_tables + b * bt_stride, block_tables + (b + r) * bt_stride,
                  sizeof(int64_t) * ((ctx[b + r] + block_size - 1) / block_size)) == 0)
        r++;
    return r;
}

static void decode_attention(const float *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                             const float *k_scales, const float *v_scales, const int64_t *block_tables,
                             int64_t bt_stride, const int64_t *ctx, int64_t n, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t block_size, int64_t window, float scale, float *out) {
    int64_t *first = malloc(sizeof(int64_t) * (n + 1)), groups = 0;
    for (int64_t b = 0; b < n; b += rows_sharing_keys(block_tables, bt_stride, ctx, n, b, block_size, window))
        first[groups++] = b;
    first[groups] = n;
    AttentionJob job = {q, k_scales, v_scales, k_cache, v_cache, block_tables, ctx, first, q_stride, bt_stride, Hq,
                        Hkv, D, block_size, window, scale, out};
    parallel_for(groups * Hkv, n * ctx[0] * Hq * D, attention_heads, &job);
    free(first);
}
