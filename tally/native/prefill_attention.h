/* Causal attention for a prompt's (or a prompt chunk's) rows of one sequence over the paged fp32, fp16 or bf16
 * cache (kernels.c: tally_prefill_attention). Included by kernels.c after exp256, the kernels' threads (pool.h) and
 * the cache's formats (kv_rows.h).
 *
 * FlashAttention's online softmax, shaped for a CPU's registers: an item is (kv head, tile of up to PA_ROWS query
 * rows); its rows' query heads that share the kv head (rows x group query vectors) pass over the keys PA_KEYS at a
 * time. Heads are taken one at a time while a head's tiles keep every thread busy; a short chunk after a long
 * context (a few tiles, many keys: chunked prefill beside decodes) takes smaller tiles and several heads a pass
 * instead, or one thread would do a call's work alone.
 * Per key tile: the tile's keys transposed into [D, PA_KEYS] once a call, before the items (prefill_key_tiles: every
 * row tile reads the same transposed keys), so scores are broadcast-multiply-adds of 4 query
 * vectors against 16 keys in registers (AVX-512: 8 vectors; no sums across lanes); the running max and sum per
 * query vector; then the probabilities times the tile's values into each query vector's output, 3 query vectors x
 * 32 dims in registers (AVX-512: 5 x 64).
 * Keys above a row's position or below its window are masked to an exact 0 probability (tiles every row sees
 * whole skip the masks), and tiles wholly above the item's last row or below its first row's window are never
 * read. Tiles start at multiples of PA_KEYS, windowed or not, and a row's arithmetic is its own (a masked key adds an
 * exact 0, a tile it sees none of rescales by exactly 1): a row gets the same bits whatever rows share its item, so
 * a prompt split into chunks anywhere keeps its bits. Soft-capped scores (Gemma 2: cap * tanh(score / cap)) are
 * capped before the masks; attention sinks (GPT-OSS: a logit per query head in the denominator, with no value)
 * join each row's sum at the end.
 * Values are read in place from their blocks (no gather copy); a 16-bit cache's keys and values are widened to
 * fp32 in that same pass, once a call.
 * Why not torch's CPU flash attention: at prompt lengths it is a large share of the whole prefill, several times this
 * kernel's time (docs/benchmarks.md#attention; `python benchmarks/prefill_attention.py`). */

#define PA_ROWS 16  /* query rows an item at most: with the kv head's group of query heads, the vectors sharing a
                     * key tile */
#define PA_MIN_ROWS 4      /* a short chunk's tiles are no smaller: 4 rows x the group's query heads a score pass */
#define PA_PASS_BYTES (64 << 20)  /* a pass's transposed keys (and widened values) for its heads at most */
#define PA_KEYS 16  /* keys a tile: two 8-float vectors of scores a query vector */

typedef struct {
    const float *q;
    const void *k_cache, *v_cache;
    const int64_t *block_table;
    int64_t q_stride, n, first_pos, Hq, Hkv, D, block_size, window, tiles, tile_rows;
    int kind;  /* KV_F32, KV_F16 or KV_BF16 (kv_rows.h) */
    float scale, softcap;  /* softcap 0: none */
    const float *sinks;    /* [Hq] or NULL */
    float *out;
    int64_t k_start, key_tiles, k_lo, k_last;  /* the call's key tiles from k_start; real keys k_lo .. k_last */
    int64_t head, heads;  /* the kv heads the passes below are on, head .. head + heads - 1 */
    float *kt_all;  /* [heads][key_tiles][D][PA_KEYS]: each tile's keys transposed (and widened) once a call */
    float *v_wide;  /* [heads][key_tiles][PA_KEYS][D]: a 16-bit cache's values widened once a call; NULL: fp32 */
} PrefillJob;

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* dst[i * stride + t] = rows[t][d + i] for t, i < 8: an 8 x 8 block of 8 keys' dims, transposed */
static inline void transpose8(const float *const *rows, int64_t d, float *dst, int64_t stride) {
    __m256 r[8], u[8];
    for (int t = 0; t < 8; t++) r[t] = _mm256_loadu_ps(rows[t] + d);
    for (int t = 0; t < 8; t += 2) {
        u[t] = _mm256_unpacklo_ps(r[t], r[t + 1]);
        u[t + 1] = _mm256_unpackhi_ps(r[t], r[t + 1]);
    }
    for (int t = 0; t < 8; t += 4) {
        r[t] = _mm256_shuffle_ps(u[t], u[t + 2], 0x44);
        r[t + 1] = _mm256_shuffle_ps(u[t], u[t + 2], 0xEE);
        r[t + 2] = _mm256_shuffle_ps(u[t + 1], u[t + 3], 0x44);
        r[t + 3] = _mm256_shuffle_ps(u[t + 1], u[t + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

#ifdef TALLY_AVX512
#define PA_SCORE_ROWS 8  /* query vectors a score pass: 8 accumulators of 16 keys */
/* The AVX-512 build: the same multiply-adds in the same order per lane as the 32-byte code below (a tile's 16
 * keys are one vector of scores; 64 output dims are 4 vectors), so both builds give the same bits. */
static inline __attribute__((always_inline)) void pa_scores(const float *qs, const float *kt, int64_t D, int mr,
                                                            float *s) {
    __m512 acc[8];
    for (int i = 0; i < mr; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m512 k = _mm512_loadu_ps(kt + d * PA_KEYS);
        for (int i = 0; i < mr; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(qs[i * D + d]), k, acc[i]);
    }
    for (int i = 0; i < mr; i++) _mm512_storeu_ps(s + i * PA_KEYS, acc[i]);
}

/* o[m][d0 .. d0 + 64) (lanes past D masked) = o[m] * alpha[m] + sum_t p[m][t] * v[t] there, mr <= 5 */
static inline __attribute__((always_inline)) void pa_weighted_v512(const float *p, const float *alpha,
                                                                   const float *const *v, int nk, int64_t d0,
                                                                   const __mmask16 *lanes, int mr, float *o,
                                                                   int64_t D) {
    __m512 acc[5][4];
    for (int i = 0; i < mr; i++) {
        __m512 a = _mm512_set1_ps(alpha[i]);
        for (int c = 0; c < 4; c++)
            acc[i][c] = _mm512_mul_ps(a, _mm512_maskz_loadu_ps(lanes[c], o + i * D + d0 + 16 * c));
    }
    for (int t = 0; t < nk; t++) {
        __m512 vv[4];
        for (int c = 0; c < 4; c++) vv[c] = _mm512_maskz_loadu_ps(lanes[c], v[t] + d0 + 16 * c);
        for (int i = 0; i < mr; i++) {
            __m512 pw = _mm512_set1_ps(p[i * PA_KEYS + t]);
            for (int c = 0; c < 4; c++) acc[i][c] = _mm512_fmadd_ps(pw, vv[c], acc[i][c]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(o + i * D + d0 + 16 * c, lanes[c], acc[i][c]);
}

static void pa_weighted_v_all(const float *p, const float *alpha, const float *const *v, int nk, int64_t D,
                              int64_t M, float *o) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        __mmask16 lanes[4];
        for (int c = 0; c < 4; c++) {
            int64_t left = D - d0 - 16 * c;
            lanes[c] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        }
        int64_t m = 0;
        for (; m + 5 <= M; m += 5) pa_weighted_v512(p + m * PA_KEYS, alpha + m, v, nk, d0, lanes, 5, o + m * D, D);
        switch (M - m) {
            case 4: pa_weighted_v512(p + m * PA_KEYS, alpha + m, v, nk, d0, lanes, 4, o + m * D, D); break;
            case 3: pa_weighted_v512(p + m * PA_KEYS, alpha + m, v, nk, d0, lanes, 3, o + m * D, D); break;
            case 2: pa_weighted_v512(p + m * PA_KEYS, alpha + m, v, nk, d0, lanes, 2, o + m * D, D); break;
            case 1: pa_weighted_v512(p + m * PA_KEYS, alpha + m, v, nk, d0, lanes, 1, o + m * D, D); break;
        }
    }
}
#else
#define PA_SCORE_ROWS 4  /* query vectors a score pass: 8 accumulators (two of 8 keys each) */
/* s[m][0..16) = qs[m] . kt[:, 0..16) for the query vectors m0 .. m0 + MR - 1 (qs pre-scaled, kt [D][16]) */
static inline __attribute__((always_inline)) void pa_scores(const float *qs, const float *kt, int64_t D, int mr,
                                                            float *s) {
    __m256 acc[4][2];
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m256 k0 = _mm256_loadu_ps(kt + d * PA_KEYS), k1 = _mm256_loadu_ps(kt + d * PA_KEYS + 8);
        for (int i = 0; i < mr; i++) {
            __m256 qv = _mm256_broadcast_ss(qs + i * D + d);
            acc[i][0] = _mm256_fmadd_ps(qv, k0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(qv, k1, acc[i][1]);
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_ps(s + i * PA_KEYS, acc[i][0]);
        _mm256_storeu_ps(s + i * PA_KEYS + 8, acc[i][1]);
    }
}

/* o[m][d0 .. d0 + 8 nc) = o[m] * alpha[m] + sum_t p[m][t] * v[t] there, for the query vectors of this pass
 * (mr <= 3, nc <= 4: 12 accumulators) */
static inline __attribute__((always_inline)) void pa_weighted_v(const float *p, const float *alpha,
                                                                const float *const *v, int nk, int64_t d0, int nc,
                                                                int mr, float *o, int64_t D) {
    __m256 acc[3][4];
    for (int i = 0; i < mr; i++) {
        __m256 a = _mm256_broadcast_ss(alpha + i);
        for (int c = 0; c < nc; c++) acc[i][c] = _mm256_mul_ps(a, _mm256_loadu_ps(o + i * D + d0 + 8 * c));
    }
    for (int t = 0; t < nk; t++) {
        __m256 vv[4];
        for (int c = 0; c < nc; c++) vv[c] = _mm256_loadu_ps(v[t] + d0 + 8 * c);
        for (int i = 0; i < mr; i++) {
            __m256 pw = _mm256_broadcast_ss(p + i * PA_KEYS + t);
            for (int c = 0; c < nc; c++) acc[i][c] = _mm256_fmadd_ps(pw, vv[c], acc[i][c]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int c = 0; c < nc; c++) _mm256_storeu_ps(o + i * D + d0 + 8 * c, acc[i][c]);
}

static void pa_weighted_v_all(const float *p, const float *alpha, const float *const *v, int nk, int64_t D,
                              int64_t M, float *o) {
    for (int64_t d0 = 0; d0 < D; d0 += 32) {
        int nc = D - d0 < 32 ? (int)(D - d0) / 8 : 4;
        int64_t m = 0;
        for (; m + 3 <= M; m += 3)
            if (nc == 4) pa_weighted_v(p + m * PA_KEYS, alpha + m, v, nk, d0, 4, 3, o + m * D, D);
            else pa_weighted_v(p + m * PA_KEYS, alpha + m, v, nk, d0, nc, 3, o + m * D, D);
        if (m < M) pa_weighted_v(p + m * PA_KEYS, alpha + m, v, nk, d0, nc, (int)(M - m), o + m * D, D);
    }
}
#endif

/* Every query vector's scores: passes of PA_SCORE_ROWS, then the rest with a constant count, so that the
 * accumulators stay in registers */
static void pa_scores_all(const float *qs, const float *kt, int64_t D, int64_t M, float *s) {
    int64_t m = 0;
    for (; m + PA_SCORE_ROWS <= M; m += PA_SCORE_ROWS) pa_scores(qs + m * D, kt, D, PA_SCORE_ROWS, s + m * PA_KEYS);
    switch (M - m) {
#ifdef TALLY_AVX512
        case 7: pa_scores(qs + m * D, kt, D, 7, s + m * PA_KEYS); break;
        case 6: pa_scores(qs + m * D, kt, D, 6, s + m * PA_KEYS); break;
        case 5: pa_scores(qs + m * D, kt, D, 5, s + m * PA_KEYS); break;
        case 4: pa_scores(qs + m * D, kt, D, 4, s + m * PA_KEYS); break;
#endif
        case 3: pa_scores(qs + m * D, kt, D, 3, s + m * PA_KEYS); break;
        case 2: pa_scores(qs + m * D, kt, D, 2, s + m * PA_KEYS); break;
        case 1: pa_scores(qs + m * D, kt, D, 1, s + m * PA_KEYS); break;
    }
}

/* Items in the order tile 0, tile T-1, tile 1, tile T-2, ... per kv head: a causal tile's cost grows with its
 * position, so any run of consecutive items (a thread's share or a piece of it, pool.h) holds cheap and dear ones
 * alike. */
static inline int64_t pa_tile_of(int64_t u, int64_t tiles) { return u % 2 == 0 ? u / 2 : tiles - 1 - u / 2; }

/* Key `pos`'s row of kv head h in `cache`, pos clamped to the call's real keys: a tile's keys past the last or before
 * the first row's window (whose blocks may be released) read a real key's row, which the masks give an exact 0 */
static inline const char *pa_row(const PrefillJob *a, const void *cache, int64_t h, int64_t pos) {
    pos = pos < a->k_lo ? a->k_lo : pos > a->k_last ? a->k_last : pos;
    int64_t slot = a->block_table[pos / a->block_size] * a->block_size + pos % a->block_size;
    return (const char *)cache + (slot * a->Hkv + h) * a->D * kv_bytes(a->kind);
}

/* Items: the pass's heads' key tiles (head-major), each tile's 16 keys transposed into kt_all, widened first from a
 * 16-bit cache (its values too, into v_wide), once for every row tile that reads them */
static void prefill_key_tiles(const void *job, int64_t i0, int64_t i1) {
    const PrefillJob *a = job;
    int64_t D = a->D;
    float *wide = a->v_wide ? malloc(sizeof(float) * PA_KEYS * D) : NULL;
    for (int64_t i = i0; i < i1; i++) {
        int64_t h = a->head + i / a->key_tiles, k0 = a->k_start + i % a->key_tiles * PA_KEYS;
        const float *k[PA_KEYS];
        for (int t = 0; t < PA_KEYS; t++) {
            const char *kr = pa_row(a, a->k_cache, h, k0 + t);
            if (wide) {
                widen_row(kr, wide + t * D, D, a->kind);
                widen_row(pa_row(a, a->v_cache, h, k0 + t), a->v_wide + (i * PA_KEYS + t) * D, D, a->kind);
                k[t] = wide + t * D;
            } else {
                k[t] = (const float *)kr;
            }
        }
        float *kt = a->kt_all + i * D * PA_KEYS;
        for (int64_t d = 0; d < D; d += 8) {
            transpose8(k, d, kt + d * PA_KEYS, PA_KEYS);
            transpose8(k + 8, d, kt + d * PA_KEYS + 8, PA_KEYS);
        }
    }
    free(wide);
}

static void prefill_heads(const void *job, int64_t i0, int64_t i1) {
    const PrefillJob *a = job;
    int64_t D = a->D, G = a->Hq / a->Hkv;
    int64_t M_max = a->tile_rows * G + 8;  /* + 8: the per-vector statistics are updated 8 at a time */
    float *qs = malloc(sizeof(float) * M_max * D), *o = malloc(sizeof(float) * M_max * D);
    float *s = malloc(sizeof(float) * M_max * PA_KEYS);
    float *mx = malloc(sizeof(float) * M_max), *sum = malloc(sizeof(float) * M_max);
    float *alpha = malloc(sizeof(float) * M_max), *shift = malloc(sizeof(float) * M_max);
    float *tmax = malloc(sizeof(float) * M_max);
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    const __m256 iota0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), iota1 = _mm256_add_ps(iota0, _mm256_set1_ps(8));
    for (int64_t i = i0; i < i1; i++) {  /* item i: row tile pa_tile_of(i / heads) of the pass's head i % heads */
        int64_t hp = i % a->heads, h = a->head + hp, tile = pa_tile_of(i / a->heads, a->tiles), R = a->tile_rows;
        int64_t r0 = tile * R, rows = a->n - r0 < R ? a->n - r0 : R, M = rows * G;
        const float *kt_head = a->kt_all + hp * a->key_tiles * D * PA_KEYS;
        const float *v_head = a->v_wide ? a->v_wide + hp * a->key_tiles * PA_KEYS * D : NULL;
        int64_t first = a->first_pos + r0, last = first + rows - 1;  /* the item's rows' positions */
        /* query vector m = r * G + j: row r0 + r, query head h * G + j */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < G; j++) {
                const float *src = a->q + (r0 + r) * a->q_stride + (h * G + j) * D;
                float *dst = qs + (r * G + j) * D;
                for (int64_t d = 0; d < D; d++) dst[d] = src[d] * a->scale;
            }
        memset(o, 0, sizeof(float) * M * D);
        for (int64_t m = 0; m < M_max; m++) mx[m] = tmax[m] = -INFINITY, sum[m] = 0.0f;
        int64_t lo = a->window > 0 && first - a->window + 1 > 0 ? first - a->window + 1 : 0;
        for (int64_t k0 = lo / PA_KEYS * PA_KEYS; k0 <= last; k0 += PA_KEYS) {
            int nk = last + 1 - k0 < PA_KEYS ? (int)(last + 1 - k0) : PA_KEYS;
            int64_t tile_at = (k0 - a->k_start) / PA_KEYS;
            const float *kt = kt_head + tile_at * D * PA_KEYS;
            const float *v[PA_KEYS];
            for (int t = 0; t < PA_KEYS; t++)
                v[t] = v_head ? v_head + (tile_at * PA_KEYS + t) * D : (const float *)pa_row(a, a->v_cache, h, k0 + t);
            pa_scores_all(qs, kt, D, M, s);
            if (a->softcap > 0) softcap_values(s, s, M * PA_KEYS, a->softcap);
            int64_t m;
            /* every row sees every key of the tile (the usual case, below the diagonal and inside the window):
             * no masks to apply */
            int full = nk == PA_KEYS && k0 + PA_KEYS - 1 <= first && !(a->window > 0 && k0 <= last - a->window);
            /* the tile's max per query vector, keys a row may not see set to -inf */
            for (m = 0; m < M; m++) {
                float *sm = s + m * PA_KEYS;
                __m256 s0 = _mm256_loadu_ps(sm), s1 = _mm256_loadu_ps(sm + 8);
                if (!full) {
                    /* row position pos sees keys (pos - window, pos]: tile lanes [begin, end) */
                    int64_t pos = first + m / G;
                    int64_t end = pos + 1 - k0 < nk ? pos + 1 - k0 : nk;
                    int64_t begin = a->window > 0 && pos - a->window + 1 > k0 ? pos - a->window + 1 - k0 : 0;
                    __m256 b = _mm256_set1_ps((float)begin), e = _mm256_set1_ps((float)end);
                    s0 = _mm256_blendv_ps(ninf, s0, _mm256_and_ps(_mm256_cmp_ps(iota0, b, _CMP_GE_OQ),
                                                                  _mm256_cmp_ps(iota0, e, _CMP_LT_OQ)));
                    s1 = _mm256_blendv_ps(ninf, s1, _mm256_and_ps(_mm256_cmp_ps(iota1, b, _CMP_GE_OQ),
                                                                  _mm256_cmp_ps(iota1, e, _CMP_LT_OQ)));
                    _mm256_storeu_ps(sm, s0);
                    _mm256_storeu_ps(sm + 8, s1);
                }
                tmax[m] = hmax(_mm256_max_ps(s0, s1));
            }
            /* 8 query vectors at once: the new max, the shift (0 while a row has seen no key: its probabilities
             * are masked to 0 below), and alpha, the old sum's and output's rescale (0 before any key) */
            for (m = 0; m < M; m += 8) {
                __m256 old = _mm256_loadu_ps(mx + m), nm = _mm256_max_ps(old, _mm256_loadu_ps(tmax + m));
                __m256 sh = _mm256_blendv_ps(nm, zero, _mm256_cmp_ps(nm, ninf, _CMP_EQ_OQ));
                __m256 al = _mm256_blendv_ps(exp256(_mm256_sub_ps(old, sh)), zero,
                                             _mm256_cmp_ps(old, ninf, _CMP_EQ_OQ));
                _mm256_storeu_ps(mx + m, nm);
                _mm256_storeu_ps(shift + m, sh);
                _mm256_storeu_ps(alpha + m, al);
            }
            for (m = 0; m < M; m++) {
                float *sm = s + m * PA_KEYS;
                __m256 s0 = _mm256_loadu_ps(sm), s1 = _mm256_loadu_ps(sm + 8), vs = _mm256_set1_ps(shift[m]);
                __m256 p0 = exp256(_mm256_sub_ps(s0, vs)), p1 = exp256(_mm256_sub_ps(s1, vs));
                if (!full) {  /* exp256 clamps: a masked key's exp(-inf) would be ~1e-38, not 0 */
                    p0 = _mm256_and_ps(p0, _mm256_cmp_ps(s0, ninf, _CMP_NEQ_OQ));
                    p1 = _mm256_and_ps(p1, _mm256_cmp_ps(s1, ninf, _CMP_NEQ_OQ));
                }
                _mm256_storeu_ps(sm, p0);
                _mm256_storeu_ps(sm + 8, p1);
                sum[m] = sum[m] * alpha[m] + hsum(_mm256_add_ps(p0, p1));
            }
            pa_weighted_v_all(s, alpha, v, nk, D, M, o);
        }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < G; j++) {
                int64_t m = r * G + j;
                float inv = 1.0f / sum[m];
                if (a->sinks) {  /* e^(sink - mx) joins the sum, both taken relative to the larger of the two */
                    float sink = a->sinks[h * G + j], top = mx[m] > sink ? mx[m] : sink, w = expf(mx[m] - top);
                    inv = w / (sum[m] * w + expf(sink - top));
                }
                float *dst = a->out + ((r0 + r) * a->Hq + h * G + j) * D;
                for (int64_t d = 0; d < D; d++) dst[d] = o[m * D + d] * inv;
            }
    }
    free(qs);
    free(o);
    free(s);
    free(mx);
    free(sum);
    free(alpha);
    free(shift);
    free(tmax);
}

/* q [n, Hq, D] (rows q_stride floats apart) at positions first_pos .. first_pos + n - 1 of one sequence whose keys
 * (theirs included) are in the caches [blocks, block_size, Hkv, D] of `kind` through block_table; window > 0 keeps
 * the last `window` keys of each row; softcap > 0: scores = softcap * tanh(scores / softcap); sinks [Hq] (or NULL):
 * a logit per query head in each softmax's denominator. out [n, Hq, D]. D a multiple of 8. */
static void prefill_attention(const float *q, int64_t q_stride, const void *k_cache, const void *v_cache, int kind,
                              const int64_t *block_table, int64_t n, int64_t first_pos, int64_t Hq, int64_t Hkv,
                              int64_t D, int64_t block_size, int64_t window, float scale, float softcap,
                              const float *sinks, float *out) {
    int64_t k_lo = window > 0 && first_pos - window + 1 > 0 ? first_pos - window + 1 : 0, k_last = first_pos + n - 1;
    int64_t k_start = k_lo / PA_KEYS * PA_KEYS, key_tiles = (k_last - k_start) / PA_KEYS + 1;
    /* Items enough for twice the threads: smaller row tiles, then heads side by side (a row's arithmetic is its own,
     * so neither changes a bit) */
    int64_t want = 2 * (int64_t)omp_get_max_threads(), tile_rows = PA_ROWS;
    while (tile_rows > PA_MIN_ROWS && (n + tile_rows - 1) / tile_rows < want) tile_rows /= 2;
    int64_t tiles = (n + tile_rows - 1) / tile_rows, head_bytes = key_tiles * PA_KEYS * D * (int64_t)sizeof(float);
    int64_t heads = tiles >= want ? 1 : (want + tiles - 1) / tiles;
    heads = heads > Hkv ? Hkv : heads;
    while (heads > 1 && heads * head_bytes * (kind == KV_F32 ? 1 : 2) > PA_PASS_BYTES) heads--;
    float *kt_all = malloc(heads * head_bytes);
    float *v_wide = kind == KV_F32 ? NULL : malloc(heads * head_bytes);
    PrefillJob job = {q, k_cache, v_cache, block_table, q_stride, n, first_pos, Hq, Hkv, D, block_size, window,
                      tiles, tile_rows, kind, scale, softcap, sinks, out, k_start, key_tiles, k_lo, k_last, 0, 0,
                      kt_all, v_wide};
    int64_t keys = first_pos + n / 2 + 1;  /* work: a row sees the cached keys and about half the new ones */
    for (job.head = 0; job.head < Hkv; job.head += job.heads) {
        job.heads = Hkv - job.head < heads ? Hkv - job.head : heads;
        parallel_for(job.heads * key_tiles, job.heads * key_tiles * PA_KEYS * D * 8, prefill_key_tiles, &job);
        /* no spinning after the last: torch's matmuls come next, on the same cores */
        parallel_for_then(job.heads * tiles, job.heads * n * keys * (Hq / Hkv) * D, prefill_heads, &job,
                          job.head + job.heads < Hkv ? SPIN_NS : 0);
    }
    free(kt_all);
    free(v_wide);
}
