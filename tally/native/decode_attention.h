/* Paged decode attention (kernels.c: tally_decode_attention and the one-call decode step). Included by kernels.c
 * after hsum, exp256, the kernels' threads (pool.h) and the cache's formats (kv_rows.h); reads K and V in place from
 * the cache's blocks. */

/* ---- Decode attention over the paged cache: one query token per row --------------------------------------
 * q [n, Hq, D] with rows q_stride floats apart (heads contiguous); caches [slots, Hkv, D] of `kind` (kv_rows.h):
 * fp32, fp16, bf16, or int8 with scales [slots, Hkv] (the int8 KV cache, read as value * scale);
 * block_tables [n, bt_stride] int64; ctx [n] keys per row (the query's own included); window > 0 keeps the
 * last `window` keys; softcap > 0: scores = softcap * tanh(scores / softcap) (Gemma 2); sinks [Hq] (or NULL): a
 * logit per query head that joins each softmax's denominator with no value (GPT-OSS). out [n, Hq, D].
 * Per (rows of one sequence, chunk of ATT_CHUNK keys, kv head): the scores of every query head sharing the head, 8
 * keys at a time (one accumulator a key, summed across lanes 8 at once), the chunk's max and sum of exponentials,
 * then the exponential-weighted V with each output head's D values held in registers; K and V are read in place from
 * their blocks (no gather copy). The chunks' partial outputs are then combined per row (flash-decoding's split of
 * the keys), so one sequence uses every thread however few kv heads the model has (docs/benchmarks.md#attention).
 * Consecutive rows of one sequence (a speculative verify step's positions, a prompt run as decodes) read each key once
 * for all their queries; chunks count from the row's first key, so a row's arithmetic is the same, key by key, with or
 * without its neighbours and on any thread count: grouping and threads never change a result. A prompt's rows over
 * the int8 cache, which the prefill kernel does not read, run through it as decodes (tally/attention/auto.py), so
 * they get the same bits in one pass, in chunks, or decoded one at a time. */
/* Lane i of the result: the sum of a[i]'s 8 lanes, as ((0+1)+(2+3))+((4+5)+(6+7)) */
static inline __m256 lane_sums8(const __m256 *a) {
    __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

/* out[0..n) = (the sum of acc[i]'s lanes) * ks[i], i < 8 */
static inline __attribute__((always_inline)) void store_scores8(const __m256 *acc, const float *ks, int n,
                                                                float *out) {
    __m256 s = _mm256_mul_ps(lane_sums8(acc), _mm256_loadu_ps(ks));
    if (n == 8) {
        _mm256_storeu_ps(out, s);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, s);
        memcpy(out, tmp, sizeof(float) * n);
    }
}

/* out[0..n) = (q . k[i]) * ks[i] for 8 keys (those past n repeat a real key: computed, not stored) */
static inline __attribute__((always_inline)) void scores8(const float *q, const void *const *k, int64_t D, int kind,
                                                          const float *ks, int n, float *out) {
    __m256 acc[8];
    _Pragma("GCC unroll 8")  /* rolled, GCC zeroed the array with a rep stos, a third of the scores' time */
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        __m256 qd = _mm256_loadu_ps(q + d);
        for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(qd, load8(k[i], d, kind), acc[i]);
    }
    store_scores8(acc, ks, n, out);
}

/* p[0..len) <- exp(p - max), in place; *mx_out the max; returns the sum (a chunk's share of a softmax) */
static float exp_scores(float *p, int64_t len, float *mx_out) {
    /* the max in vectors: fmaxf is a libm call per element here (no -ffast-math), a large share of the kernel */
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(p + t));
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    for (; t < len; t++) mx = p[t] > mx ? p[t] : mx;
    __m256 vmx = _mm256_set1_ps(mx), vs = _mm256_setzero_ps();
    t = 0;
#ifdef TALLY_AVX512
    /* 16 at a time, summed 8 lanes at a time as below: the same bits */
    for (const __m512 wmx = _mm512_set1_ps(mx); t + 16 <= len; t += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(p + t), wmx));
        _mm512_storeu_ps(p + t, e);
        vs = _mm256_add_ps(_mm256_add_ps(vs, _mm512_castps512_ps256(e)),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
#endif
    for (; t + 8 <= len; t += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + t), vmx));
        _mm256_storeu_ps(p + t, e);
        vs = _mm256_add_ps(vs, e);
    }
    float sum = hsum(vs);
    for (; t < len; t++) sum += (p[t] = expf(p[t] - mx));
    *mx_out = mx;
    return sum;
}

/* o[0..D) = sum_t p[t] * v(slot[t]), D a multiple of 8; 64 values at a time in registers (int8 values: p
 * already holds each one's scale) */
static inline __attribute__((always_inline)) void weighted_v(const float *p, const int64_t *slots, int64_t len,
                                                             const void *v, int kind, int64_t D, float *o) {
    int64_t esize = kv_bytes(kind);
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {
        __m256 acc[8];
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++) {
            const char *vp = (const char *)v + slots[t] * D * esize;
            __m256 pw = _mm256_set1_ps(p[t]);
            for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(pw, load8(vp, d0 + 8 * i, kind), acc[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + d0 + 8 * i, acc[i]);
    }
    for (; d0 < D; d0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8((const char *)v + slots[t] * D * esize, d0, kind), acc);
        _mm256_storeu_ps(o + d0, acc);
    }
}

#ifdef TALLY_AVX512
/* The AVX-512 build: the multiply-adds above, per lane in the same order, two query vectors at a time so that 8
 * chains are in flight as the 32-byte code's 8 accumulators are; so both builds give the same bits. A score vector
 * holds two keys' 8 lanes (the 8 keys' rows widened and paired once, for every row and query head that reads them),
 * and a weighted sum's vector 16 of a row's dims. */

/* 16 values of a row from element i as fp32, lanes off in `m` zero (load8's widening, 16 lanes wide) */
static inline __attribute__((always_inline)) __m512 load16(const void *row, int64_t i, int kind, __mmask16 m) {
    switch (kind) {
        case KV_I8:
            return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, (const int8_t *)row + i)));
        case KV_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
        case KV_BF16:
            return _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i)), 16));
        default: return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    }
}

/* 8 keys' rows as fp32, in pairs: kp[(c * 4 + i) * 16 ..] holds dims 8c .. 8c + 7 of key 2i, then of key 2i + 1 */
static inline __attribute__((always_inline)) void pack_keys8(const void *const *k, int64_t D, int kind, float *kp) {
    for (int64_t c = 0; c < D / 8; c++)
        for (int i = 0; i < 4; i++) {
            __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(load8(k[2 * i], 8 * c, kind)));
            __m256d hi = _mm256_castps_pd(load8(k[2 * i + 1], 8 * c, kind));
            _mm512_store_ps(kp + (c * 4 + i) * 16, _mm512_castpd_ps(_mm512_insertf64x4(lo, hi, 1)));
        }
}

/* every query vector reads the paired rows, however few share them: returns kp */
static const float *pack_keys8_of(const void *const *k, int64_t D, int kind, float *kp, int64_t queries) {
    (void)queries;
    switch (kind) {
        case KV_I8: pack_keys8(k, D, KV_I8, kp); break;
        case KV_F16: pack_keys8(k, D, KV_F16, kp); break;
        case KV_BF16: pack_keys8(k, D, KV_BF16, kp); break;
        default: pack_keys8(k, D, KV_F32, kp);
    }
    return kp;
}

/* store_scores8 of 4 paired accumulators (two keys' 8 lanes each) */
static inline __attribute__((always_inline)) void store_paired_scores(const __m512 *acc, const float *ks, int n,
                                                                      float *out) {
    __m256 a[8];
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm512_castps512_ps256(acc[i]);
        a[2 * i + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1));
    }
    store_scores8(a, ks, n, out);
}

/* scores8 for q0 and (q1 not NULL) q1, of the keys pack_keys8_of put in kp */
static void scores8_two(const float *q0, const float *q1, const void *const *k, const float *kp, int64_t D, int kind,
                        const float *ks, int n0, int n1, float *out0, float *out1) {
    (void)k, (void)kind;
    __m512 a0[4], a1[4];
    for (int i = 0; i < 4; i++) a0[i] = a1[i] = _mm512_setzero_ps();
    if (q1) {
        for (int64_t c = 0; c < D / 8; c++) {
            __m512 x0 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q0 + 8 * c))));
            __m512 x1 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q1 + 8 * c))));
            for (int i = 0; i < 4; i++) {
                __m512 kv = _mm512_load_ps(kp + (c * 4 + i) * 16);
                a0[i] = _mm512_fmadd_ps(x0, kv, a0[i]);
                a1[i] = _mm512_fmadd_ps(x1, kv, a1[i]);
            }
        }
        store_paired_scores(a1, ks, n1, out1);
    } else {
        for (int64_t c = 0; c < D / 8; c++) {
            __m512 x0 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q0 + 8 * c))));
            for (int i = 0; i < 4; i++) a0[i] = _mm512_fmadd_ps(x0, _mm512_load_ps(kp + (c * 4 + i) * 16), a0[i]);
        }
    }
    store_paired_scores(a0, ks, n0, out0);
}

/* weighted_v for o0 (keys t < len0) and (p1 not NULL) o1 (t < len1) over the same keys, 64 dims at a time */
static inline __attribute__((always_inline)) void weighted_v2(const float *p0, int64_t len0, float *o0,
                                                              const float *p1, int64_t len1, float *o1,
                                                              const int64_t *slots, const void *v, int kind,
                                                              int64_t D) {
    int64_t esize = kv_bytes(kind), len = p1 && len1 > len0 ? len1 : len0;
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        __mmask16 lanes[4];
        for (int c = 0; c < 4; c++) {
            int64_t left = D - d0 - 16 * c;
            lanes[c] = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        __m512 a0[4], a1[4];
        for (int c = 0; c < 4; c++) a0[c] = a1[c] = _mm512_setzero_ps();
        for (int64_t t = 0; t < len; t++) {
            const char *vp = (const char *)v + slots[t] * D * esize;
            __m512 vv[4];
            for (int c = 0; c < 4; c++) vv[c] = load16(vp, d0 + 16 * c, kind, lanes[c]);
            if (t < len0) {
                __m512 pw = _mm512_set1_ps(p0[t]);
                for (int c = 0; c < 4; c++) a0[c] = _mm512_fmadd_ps(pw, vv[c], a0[c]);
            }
            if (p1 && t < len1) {
                __m512 pw = _mm512_set1_ps(p1[t]);
                for (int c = 0; c < 4; c++) a1[c] = _mm512_fmadd_ps(pw, vv[c], a1[c]);
            }
        }
        for (int c = 0; c < 4; c++) {
            _mm512_mask_storeu_ps(o0 + d0 + 16 * c, lanes[c], a0[c]);
            if (p1) _mm512_mask_storeu_ps(o1 + d0 + 16 * c, lanes[c], a1[c]);
        }
    }
}

static void weighted_v_two(const float *p0, int64_t len0, float *o0, const float *p1, int64_t len1, float *o1,
                           const int64_t *slots, const void *v, int kind, int64_t D) {
    switch (kind) {
        case KV_I8: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_I8, D); break;
        case KV_F16: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_F16, D); break;
        case KV_BF16: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_BF16, D); break;
        default: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_F32, D);
    }
}
#else
/* The 32-byte build: one query vector's scores at a time (its 8 accumulators and AVX2's 16 registers leave no room
 * for a second's), over 8 keys' rows widened to fp32 once for every query vector that reads them where there are
 * ATT_PACK_QUERIES or more (a verify step's rows: widening a 16-bit or int8 row costs what its multiply-adds do; for
 * fewer, storing the widened rows costs more than it saves); values weighted for two query vectors a pass, each
 * value widened once for both (docs/benchmarks.md#attention). Compiled once per cache format, the format's branch
 * taken once a call. */
static void scores8_of(const float *q, const void *const *k, int64_t D, int kind, const float *ks, int n, float *out) {
    switch (kind) {
        case KV_I8: scores8(q, k, D, KV_I8, ks, n, out); break;
        case KV_F16: scores8(q, k, D, KV_F16, ks, n, out); break;
        case KV_BF16: scores8(q, k, D, KV_BF16, ks, n, out); break;
        default: scores8(q, k, D, KV_F32, ks, n, out);
    }
}

#ifndef ATT_PACK_QUERIES
#define ATT_PACK_QUERIES 8
#endif

/* 8 keys' rows as fp32, key after key in kp, returning kp (a 16-bit or int8 cache read by `queries` query vectors,
 * at least ATT_PACK_QUERIES); else NULL: the rows are read in place */
static const float *pack_keys8_of(const void *const *k, int64_t D, int kind, float *kp, int64_t queries) {
    if (kind == KV_F32 || queries < ATT_PACK_QUERIES) return NULL;
    for (int i = 0; i < 8; i++) widen_row(k[i], kp + i * D, D, kind);
    return kp;
}

static void scores8_two(const float *q0, const float *q1, const void *const *k, const float *kp, int64_t D, int kind,
                        const float *ks, int n0, int n1, float *out0, float *out1) {
    const void *packed[8];
    if (kp) {
        for (int i = 0; i < 8; i++) packed[i] = kp + i * D;
        k = packed, kind = KV_F32;
    }
    scores8_of(q0, k, D, kind, ks, n0, out0);
    if (q1) scores8_of(q1, k, D, kind, ks, n1, out1);
}

/* weighted_v for o0 (keys t < len0) and (p1 not NULL) o1 (t < len1), 32 dims at a time: each value widened once for
 * both; per lane the multiply-adds of weighted_v in its order, so the same bits */
static inline __attribute__((always_inline)) void weighted_v2(const float *p0, int64_t len0, float *o0,
                                                              const float *p1, int64_t len1, float *o1,
                                                              const int64_t *slots, const void *v, int kind,
                                                              int64_t D) {
    int64_t esize = kv_bytes(kind), len = len1 > len0 ? len1 : len0, d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) {
        __m256 a0[4], a1[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++) a0[c] = a1[c] = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++) {
            const char *vp = (const char *)v + slots[t] * D * esize;
            __m256 vv[4];
            _Pragma("GCC unroll 4")
            for (int c = 0; c < 4; c++) vv[c] = load8(vp, d0 + 8 * c, kind);
            if (t < len0) {
                __m256 pw = _mm256_set1_ps(p0[t]);
                _Pragma("GCC unroll 4")
                for (int c = 0; c < 4; c++) a0[c] = _mm256_fmadd_ps(pw, vv[c], a0[c]);
            }
            if (t < len1) {
                __m256 pw = _mm256_set1_ps(p1[t]);
                _Pragma("GCC unroll 4")
                for (int c = 0; c < 4; c++) a1[c] = _mm256_fmadd_ps(pw, vv[c], a1[c]);
            }
        }
        for (int c = 0; c < 4; c++) {
            _mm256_storeu_ps(o0 + d0 + 8 * c, a0[c]);
            _mm256_storeu_ps(o1 + d0 + 8 * c, a1[c]);
        }
    }
    for (; d0 < D; d0 += 8) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t++) {
            __m256 vv = load8((const char *)v + slots[t] * D * esize, d0, kind);
            if (t < len0) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p0[t]), vv, a0);
            if (t < len1) a1 = _mm256_fmadd_ps(_mm256_set1_ps(p1[t]), vv, a1);
        }
        _mm256_storeu_ps(o0 + d0, a0);
        _mm256_storeu_ps(o1 + d0, a1);
    }
}

static void weighted_v_two(const float *p0, int64_t len0, float *o0, const float *p1, int64_t len1, float *o1,
                           const int64_t *slots, const void *v, int kind, int64_t D) {
    if (!p1) {  /* a query vector alone: weighted_v's 64 dims a pass */
        switch (kind) {
            case KV_I8: weighted_v(p0, slots, len0, v, KV_I8, D, o0); break;
            case KV_F16: weighted_v(p0, slots, len0, v, KV_F16, D, o0); break;
            case KV_BF16: weighted_v(p0, slots, len0, v, KV_BF16, D, o0); break;
            default: weighted_v(p0, slots, len0, v, KV_F32, D, o0);
        }
        return;
    }
    switch (kind) {
        case KV_I8: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_I8, D); break;
        case KV_F16: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_F16, D); break;
        case KV_BF16: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_BF16, D); break;
        default: weighted_v2(p0, len0, o0, p1, len1, o1, slots, v, KV_F32, D);
    }
}
#endif

/* Rows slots[t0..t1) of a cache (`bytes` a row) prefetched a 64-byte line at a time, into L1 or (to_l1 0) L2 */
static inline __attribute__((always_inline)) void prefetch_rows(const void *cache, const int64_t *slots, int64_t t0,
                                                                int64_t t1, int64_t bytes, int to_l1) {
    for (int64_t t = t0; t < t1; t++)
        for (int64_t x = 0; x < bytes; x += 64) {
            const char *line = (const char *)cache + slots[t] * bytes + x;
            if (to_l1) _mm_prefetch(line, _MM_HINT_T0);
            else _mm_prefetch(line, _MM_HINT_T1);
        }
}

#define KAHEAD 16      /* keys ahead whose K is fetched */
#define ATT_ROWS 8     /* rows of one sequence that share their keys' reads */
#define ATT_CHUNK 128  /* keys an item takes, counted from the row's first key: a fixed count, so a row's sums
                        * depend neither on the threads nor on its neighbours */

typedef struct {
    const float *q, *k_scales, *v_scales;
    const void *k_cache, *v_cache;
    const int64_t *block_tables, *ctx;
    const int64_t *first;       /* group g is rows first[g] .. first[g + 1] - 1 */
    const int64_t *chunk_group;  /* chunk c is chunk c - chunk_first[g] of group g = chunk_group[c] */
    const int64_t *chunk_first, *part_first;  /* chunk c's partial results start at record part_first[c] */
    int64_t q_stride, bt_stride, Hq, Hkv, D, block_size, window;
    int64_t splits;             /* an item's share of a kv head's query heads: 1 / splits of them */
    int kind;
    float scale, softcap;
    float *parts;  /* per (chunk, row of its group, query head): D unnormalised outputs, the chunk's max, its sum */
} AttentionJob;

/* A row's first key: under a window only its last `window` keys (a group has a window's rows only alone) */
static inline int64_t first_key(int64_t L, int64_t window) { return (window > 0 && L > window) ? L - window : 0; }

/* Items: (group of rows, chunk of ATT_CHUNK keys, kv head, share of its query heads): a long context spreads over the
 * threads however few heads the model has (2 on Qwen2.5-0.5B), and a verify step's rows still share each key's read.
 * A short one with fewer chunks and kv heads than threads splits a kv head's query heads (Gemma 3 270M: 1 kv head of
 * 4), each share reading the chunk's keys for its own heads; a head's arithmetic is the same either way. */
static void attention_chunks(const void *job, int64_t i0, int64_t i1) {
    const AttentionJob *a = job;
    int64_t Hq = a->Hq, Hkv = a->Hkv, D = a->D, G = Hq / Hkv, bs = a->block_size;
    int kind = a->kind, int8 = kind == KV_I8;
    int64_t bytes = D * kv_bytes(kind);
    int64_t slots[ATT_CHUNK];
    float ks[ATT_CHUNK + 8], vs[ATT_CHUNK];
    float *p = malloc(sizeof(float) * ATT_ROWS * G * ATT_CHUNK);  /* scores [row][query head of h][key] */
    float *kp = aligned_alloc(64, sizeof(float) * 8 * ((D + 15) / 16 * 16));  /* 8 keys' rows, paired (AVX-512) */
    for (int64_t i = i0; i < i1; i++) {
        int64_t chunk = i / (Hkv * a->splits), h = i / a->splits % Hkv, share = i % a->splits;
        int64_t j0 = share * G / a->splits, j1 = (share + 1) * G / a->splits;
        int64_t g = a->chunk_group[chunk], b = a->first[g], rows = a->first[g + 1] - b;
        int64_t L = a->ctx[b + rows - 1], start = first_key(L, a->window);
        int64_t c0 = start + (chunk - a->chunk_first[g]) * ATT_CHUNK, c1 = c0 + ATT_CHUNK < L ? c0 + ATT_CHUNK : L;
        int64_t len = c1 - c0;
        const int64_t *bt = a->block_tables + b * a->bt_stride;
        for (int64_t t = 0; t < len;) {  /* the chunk's keys, a block's run at a time */
            int64_t pos = c0 + t, off = pos % bs, run = bs - off < len - t ? bs - off : len - t;
            int64_t blk = bt[pos / bs];
            for (int64_t j = 0; j < run; j++, t++) {
                slots[t] = (blk * bs + off + j) * Hkv + h;  /* row of [slots * Hkv, D], and its int8 scale's place */
                ks[t] = int8 ? a->k_scales[slots[t]] * a->scale : a->scale;
                vs[t] = int8 ? a->v_scales[slots[t]] : 1.0f;
            }
        }
        memset(ks + len, 0, sizeof(float) * 8);  /* read by a last block's lanes past its keys, never stored */
        /* The chunk's K and V rows into L2 before its first score: keys from memory are one KV head's rows at a
         * stride within randomly placed blocks, which the per-8-key prefetches below alone fetch too late
         * (docs/benchmarks.md#attention). */
        prefetch_rows(a->k_cache, slots, 0, len, bytes, 0);
        prefetch_rows(a->v_cache, slots, 0, len, bytes, 0);
        for (int64_t t0 = 0; t0 < len; t0 += 8) {
            int n = len - t0 < 8 ? (int)(len - t0) : 8;
            /* the V rows of these keys, for the pass below; the K rows of keys KAHEAD on */
            prefetch_rows(a->v_cache, slots, t0, t0 + n, bytes, 0);
            prefetch_rows(a->k_cache, slots, t0 + KAHEAD, t0 + KAHEAD + 8 < len ? t0 + KAHEAD + 8 : len, bytes, 1);
            const void *k[8];
            for (int j = 0; j < 8; j++) k[j] = (const char *)a->k_cache + slots[t0 + (j < n ? j : n - 1)] * bytes;
            const float *packed = pack_keys8_of(k, D, kind, kp, rows * (j1 - j0));
            const float *held = NULL;  /* a query vector waiting for a second to share the pass */
            float *held_out = NULL;
            int held_n = 0;
            for (int64_t r = 0; r < rows; r++) {
                int64_t seen = a->ctx[b + r] - c0;  /* row r sees keys c0 .. ctx - 1 */
                if (t0 >= seen) continue;
                int nr = seen - t0 < n ? (int)(seen - t0) : n;
                const float *q = a->q + (b + r) * a->q_stride + h * G * D;
                for (int64_t j = j0; j < j1; j++) {
                    float *out = p + (r * G + j) * ATT_CHUNK + t0;
                    if (!held) {
                        held = q + j * D, held_out = out, held_n = nr;
                        continue;
                    }
                    scores8_two(held, q + j * D, k, packed, D, kind, ks + t0, held_n, nr, held_out, out);
                    held = NULL;
                }
            }
            if (held) scores8_two(held, NULL, k, packed, D, kind, ks + t0, held_n, 0, held_out, NULL);
        }
        const float *held_p = NULL;  /* a row's probabilities waiting for a second to share the values' pass */
        float *held_part = NULL;
        int64_t held_len = 0;
        for (int64_t r = 0; r < rows; r++) {
            int64_t seen = a->ctx[b + r] - c0;
            seen = seen < len ? seen : len;
            for (int64_t j = j0; j < j1; j++) {
                float *part = a->parts + (a->part_first[chunk] + r * Hq + h * G + j) * (D + 2);
                if (seen <= 0) {  /* the chunk starts past this row's last key */
                    part[D] = -INFINITY, part[D + 1] = 0;
                    continue;
                }
                float *pj = p + (r * G + j) * ATT_CHUNK;
                if (a->softcap > 0) softcap_values(pj, pj, seen, a->softcap);
                part[D + 1] = exp_scores(pj, seen, part + D);
                if (int8)
                    for (int64_t t = 0; t < seen; t++) pj[t] *= vs[t];
                if (!held_p) {
                    held_p = pj, held_len = seen, held_part = part;
                    continue;
                }
                weighted_v_two(held_p, held_len, held_part, pj, seen, part, slots, a->v_cache, kind, D);
                held_p = NULL;
            }
        }
        if (held_p) weighted_v_two(held_p, held_len, held_part, NULL, 0, NULL, slots, a->v_cache, kind, D);
    }
    free(p);
    free(kp);
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
                             int kind, const float *k_scales, const float *v_scales, const int64_t *block_tables,
                             int64_t bt_stride, const int64_t *ctx, int64_t n, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t block_size, int64_t window, float scale, float softcap, const float *sinks,
                             float *out) {
    int64_t *first = malloc(sizeof(int64_t) * (n + 1)), groups = 0;
    for (int64_t b = 0; b < n; b += rows_sharing_keys(block_tables, bt_stride, ctx, n, b, block_size, window))
        first[groups++] = b;
    first[groups] = n;
    int64_t *chunk_first = malloc(sizeof(int64_t) * (groups + 1)), chunks = 0, parts = 0, work = 0;
    for (int64_t g = 0; g < groups; g++) {
        int64_t L = ctx[first[g + 1] - 1];
        chunk_first[g] = chunks;
        chunks += (L - first_key(L, window) + ATT_CHUNK - 1) / ATT_CHUNK;
    }
    chunk_first[groups] = chunks;
    int64_t *chunk_group = malloc(sizeof(int64_t) * chunks), *part_first = malloc(sizeof(int64_t) * chunks);
    for (int64_t g = 0; g < groups; g++)
        for (int64_t i = chunk_first[g]; i < chunk_first[g + 1]; i++) {
            chunk_group[i] = g, part_first[i] = parts;
            parts += (first[g + 1] - first[g]) * Hq;
        }
    /* multiply-adds of q.k and p.v, in fp32: 4 times an int8 byte product's cost (lanes a vector), as PAR_MIN counts */
    for (int64_t r = 0; r < n; r++) work += (ctx[r] - first_key(ctx[r], window)) * Hq * D * 2 * 4;
    int threads = omp_get_max_threads();
    int64_t splits = chunks * Hkv >= threads ? 1 : Hq / Hkv < threads ? Hq / Hkv : threads;
    float *partial = malloc(sizeof(float) * parts * (D + 2));
    AttentionJob job = {q, k_scales, v_scales, k_cache, v_cache, block_tables, ctx, first, chunk_group, chunk_first,
                        part_first, q_stride, bt_stride, Hq, Hkv, D, block_size, window, splits, kind, scale, softcap,
                        partial};
    parallel_for(chunks * Hkv * splits, work, attention_chunks, &job);
    /* out = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c over the row's chunks, in their order (a sink's e^(s - M)
     * first in the denominator, M counting it) */
    for (int64_t g = 0; g < groups; g++) {
        int64_t rows = first[g + 1] - first[g];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < Hq; j++) {
                float M = sinks ? sinks[j] : -INFINITY, sum = 0;
                for (int64_t i = chunk_first[g]; i < chunk_first[g + 1]; i++) {
                    float m = partial[(part_first[i] + r * Hq + j) * (D + 2) + D];
                    M = m > M ? m : M;
                }
                if (sinks) sum = expf(sinks[j] - M);
                float *o = out + ((first[g] + r) * Hq + j) * D;
                memset(o, 0, sizeof(float) * D);
                for (int64_t i = chunk_first[g]; i < chunk_first[g + 1]; i++) {
                    const float *part = partial + (part_first[i] + r * Hq + j) * (D + 2);
                    if (part[D + 1] == 0) continue;  /* a chunk past the row's keys */
                    float w = expf(part[D] - M);
                    sum += w * part[D + 1];
                    for (int64_t d = 0; d < D; d++) o[d] += w * part[d];
                }
                float inv = 1.0f / sum;
                for (int64_t d = 0; d < D; d++) o[d] *= inv;
            }
    }
    free(partial);
    free(chunk_group);
    free(part_first);
    free(chunk_first);
    free(first);
}
