/* The sampler's kernels (tally/sample/): the greedy argmax, a random row's token at one uniform, the top-k of rows
 * and their logsumexp. Included by kernels.c after exp256 and the pool. */

/* ---- Greedy tokens: the first index of each row's maximum, x [M, V] -> out [M]; -1 for a row holding a NaN
 * (torch.argmax takes the first NaN there: the caller asks it); returns how many such rows there are.
 * torch.argmax runs a scalar loop on CPU, ~2.4 ns a value: 0.36 ms of a Qwen 0.5B decode step over its 151,936
 * logits (AVX2 EPYC), ~2%. Here two sets of 8 lanes each keep their first maximum (a strictly greater value replaces
 * it), then the lanes' maxima meet: the largest value, and of lanes holding it the smallest index. */
int64_t tally_argmax_rows(const float *x, int64_t M, int64_t V, int64_t *out) {
    int64_t nan_rows = 0;
    for (int64_t r = 0; r < M; r++) {
        const float *row = x + r * V;
        __m256 best[2] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY)}, nan = _mm256_setzero_ps();
        __m256i at[2] = {_mm256_set1_epi32(-1), _mm256_set1_epi32(-1)};
        __m256i index[2] = {_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)};
        const __m256i step = _mm256_set1_epi32(16);
        int64_t i = 0;
        for (; i + 16 <= V && V < INT32_MAX; i += 16)
            for (int u = 0; u < 2; u++) {
                __m256 v = _mm256_loadu_ps(row + i + 8 * u);
                __m256 greater = _mm256_cmp_ps(v, best[u], _CMP_GT_OQ);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                best[u] = _mm256_blendv_ps(best[u], v, greater);
                at[u] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at[u]), _mm256_castsi256_ps(index[u]),
                                                             greater));
                index[u] = _mm256_add_epi32(index[u], step);
            }
        float values[16];
        int32_t where[16];
        for (int u = 0; u < 2; u++) {
            _mm256_storeu_ps(values + 8 * u, best[u]);
            _mm256_storeu_si256((__m256i *)(where + 8 * u), at[u]);
        }
        float top = -INFINITY;
        int64_t arg = -1;
        for (int l = 0; l < 16; l++)
            if (where[l] >= 0 && (values[l] > top || (values[l] == top && where[l] < arg))) top = values[l], arg = where[l];
        int has_nan = _mm256_movemask_ps(nan) != 0;
        for (; i < V; i++) {
            if (isnan(row[i])) has_nan = 1;
            else if (row[i] > top) top = row[i], arg = i;
        }
        out[r] = has_nan ? -1 : arg < 0 ? 0 : arg;  /* nothing above -inf: the first */
        nan_rows += has_nan;
    }
    return nan_rows;
}

/* The rows the sampler's kernels read: row r of x [., V] at rows[r] (or r without `rows`), at temperature[r] (or 1):
 * a batch's logits where they lie, each kernel scaling what it reads, so that rows with a temperature need no
 * divided copy (the sampler's plain rows, and its unseeded top-k / top-p rows: tally/sample/sampler.py). */
typedef struct { const float *x; const int64_t *rows; int64_t V; const float *temperature; } SampledRows;

static inline const float *row_at(const SampledRows *s, int64_t r) { return s->x + (s->rows ? s->rows[r] : r) * s->V; }

static inline float temperature_at(const SampledRows *s, int64_t r) {
    return s->temperature ? s->temperature[r] : 1.0f;
}

/* ---- Sampling: one token a row of x [M, V] (logits after the filters; -inf: dropped; row r at rows[r], or r without
 * `rows`), the first in token order whose running mass of softmax(x / temperature[r]) (1 without `temperature`)
 * passes u [M] (in [0, 1)) times the row's: the inverse of the distribution function at u, one uniform a row. The
 * exponential race it replaces (argmax of probs / Exp(1)) drew one a token: over Qwen's 151,936 logits torch's
 * uniform, log, exp and divide took 1.3-1.5 ms a row on the Zen 4 VM, here a max, a pass of exps into per-8 sums and
 * a walk over them. A seeded row still takes its own generator's next number, whatever the batch. The sums are
 * doubles, and the walk adds the same per-8 sums in the same order as the total, so its last running sum is the
 * total and the walk ends on a kept token. The temperature scales the exponents, e^((x - max) / t), so a row that
 * only has one (the sampler's plain rows) is read where its logits lie: no copy of the row, no pass dividing it (the
 * sampler at temperature 0.7 over Qwen's logits: 3.0 -> 1.0-1.1 ms a step at 16 rows, 0.33 -> 0.16 at 1). */
typedef struct { SampledRows src; const double *u; int64_t *out; } SampleJob;

static inline __m256 kept_exp(const float *v8, __m256 top, __m256 inv_t) {  /* e^((v - top) inv_t); 0 at v = -inf */
    __m256 v = _mm256_loadu_ps(v8);
    return _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ),
                         exp256(_mm256_mul_ps(_mm256_sub_ps(v, top), inv_t)));
}

static inline float sum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* A row in blocks of 8, a ragged last block read from `tail` (its values, then -inf) */
typedef struct { const float *row; int64_t V, blocks; float tail[8]; } RowBlocks;

static inline RowBlocks row_blocks(const float *row, int64_t V) {
    RowBlocks r = {row, V, (V + 7) / 8, {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                                         -INFINITY}};
    memcpy(r.tail, row + V / 8 * 8, sizeof(float) * (V % 8));
    return r;
}

static inline const float *block_at(const RowBlocks *r, int64_t b) { return b < r->V / 8 ? r->row + 8 * b : r->tail; }

static float row_top(const RowBlocks *r, int *has_nan) {  /* the row's max; *has_nan: whether it holds a NaN */
    __m256 top8 = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int64_t b = 0; b < r->blocks; b++) {
        __m256 v = _mm256_loadu_ps(block_at(r, b));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top8 = _mm256_max_ps(top8, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, top8);
    float top = lanes[0];
    for (int l = 1; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
    *has_nan = _mm256_movemask_ps(nan) != 0;
    return top;
}

/* sum of e^((v - top) inv_t) over the row in double, block by block; sums (or NULL): the running sum after each
 * block */
static double mass(const RowBlocks *r, float top, float inv_t, double *sums) {
    __m256 top_v = _mm256_set1_ps(top), inv_v = _mm256_set1_ps(inv_t);
    double total = 0;
    for (int64_t b = 0; b < r->blocks; b++) {
        total += sum8(kept_exp(block_at(r, b), top_v, inv_v));
        if (sums) sums[b] = total;
    }
    return total;
}

/* row's token at u and 1 / temperature inv_t; -1 where it holds a NaN or +inf or keeps nothing. sums: room for its
 * blocks of 8 */
static int64_t sample_row(const float *row, int64_t V, float inv_t, double u, double *sums) {
    RowBlocks r = row_blocks(row, V);
    int has_nan;
    float top = row_top(&r, &has_nan);
    if (has_nan || !isfinite(top)) return -1;  /* +inf: e^(inf - inf) would be NaN */
    double target = u * mass(&r, top, inv_t, sums);
    int64_t lo = 0, hi = r.blocks - 1;  /* the first block whose running sum passes target */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (sums[mid] > target) hi = mid;
        else lo = mid + 1;
    }
    float e[8];
    _mm256_storeu_ps(e, kept_exp(block_at(&r, lo), _mm256_set1_ps(top), _mm256_set1_ps(inv_t)));
    double run = lo ? sums[lo - 1] : 0;
    int64_t last = -1;
    for (int j = 0; j < 8; j++) {
        if (e[j] <= 0) continue;
        last = 8 * lo + j, run += e[j];
        if (run > target) break;
    }
    return last;  /* the block's float sum and its elements' double sum may round apart: its last kept token */
}

static void sample_range(const void *ctx, int64_t r0, int64_t r1) {
    const SampleJob *j = ctx;
    double *sums = malloc(sizeof(double) * ((j->src.V + 7) / 8));
    for (int64_t r = r0; r < r1; r++)
        j->out[r] = sample_row(row_at(&j->src, r), j->src.V, 1.0f / temperature_at(&j->src, r), j->u[r], sums);
    free(sums);
}

void tally_sample_rows(const float *x, const int64_t *rows, int64_t M, int64_t V, const float *temperature,
                       const double *u, int64_t *out) {
    SampleJob job = {{x, rows, V, temperature}, u, out};
    parallel_for(M, M * V * 4, sample_range, &job);
}

/* ---- log(sum(e^(x / t))) of each row (SampledRows), as torch.logsumexp(x / t, dim=-1) (NaN with a NaN, the max
 * where it is infinite):
 * the top-p filter's mass over a whole row and the logprobs' normaliser, a max and one pass of exps (torch's took
 * ~0.2-0.5 ms over Qwen's 151,936 logits on the Zen 4 VM: max, subtract, exp, sum and log as separate passes). */
typedef struct { SampledRows src; float *out; } LseJob;

static void lse_range(const void *ctx, int64_t r0, int64_t r1) {
    const LseJob *j = ctx;
    for (int64_t i = r0; i < r1; i++) {
        RowBlocks r = row_blocks(row_at(&j->src, i), j->src.V);
        int has_nan;
        float top = row_top(&r, &has_nan), t = temperature_at(&j->src, i);
        j->out[i] = has_nan ? NAN : !isfinite(top) ? top / t : top / t + (float)log(mass(&r, top, 1.0f / t, NULL));
    }
}

void tally_logsumexp_rows(const float *x, const int64_t *rows, int64_t M, int64_t V, const float *temperature,
                          float *out) {
    LseJob job = {{x, rows, V, temperature}, out};
    parallel_for(M, M * V * 4, lse_range, &job);
}

/* ---- The k largest of each row of x [M, V], sorted (value descending, then token id ascending): torch.topk's
 * values for the sampler's top-k / top-p candidates (tally/sample/filters.py). One pass keeps the values above a
 * threshold that rises to the k-th largest kept each time the buffer of 4k fills (quickselect), so most values
 * cost a compare: k = 1,024 of 151,936 logits took torch.topk ~0.7 ms on the Zen 4 VM, this 0.09. A row holding a
 * NaN is the caller's (0 in its slot of `done`). */
typedef struct { float v; int64_t id; } Scored;

static inline int before(Scored a, Scored b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

static inline void swap_scored(Scored *a, Scored *b) {
    Scored t = *a;
    *a = *b, *b = t;
}

/* buf[lo..hi] around a median-of-three pivot: returns p with buf[lo..p] before-or-equal and buf[p+1..hi] after */
static int64_t split(Scored *buf, int64_t lo, int64_t hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (before(buf[mid], buf[lo])) swap_scored(buf + mid, buf + lo);
    if (before(buf[hi], buf[lo])) swap_scored(buf + hi, buf + lo);
    if (before(buf[hi], buf[mid])) swap_scored(buf + hi, buf + mid);
    Scored pivot = buf[mid];
    int64_t i = lo - 1, j = hi + 1;
    for (;;) {  /* Hoare's scheme */
        do i++; while (before(buf[i], pivot));
        do j--; while (before(pivot, buf[j]));
        if (i >= j) return j;
        swap_scored(buf + i, buf + j);
    }
}

/* buf[lo..hi] ordered through position `upto` (the rest in any order): `upto` = hi sorts it all */
static void order_through(Scored *buf, int64_t lo, int64_t hi, int64_t upto) {
    while (hi - lo > 16) {
        int64_t p = split(buf, lo, hi);
        if (upto > p) {  /* the left part is wholly needed: sort it, go on right */
            order_through(buf, lo, p, p);
            lo = p + 1;
        } else {
            hi = p;  /* nothing right of p is needed */
        }
    }
    for (int64_t i = lo + 1; i <= hi; i++) {  /* a short run: insertion */
        Scored x = buf[i];
        int64_t j = i - 1;
        for (; j >= lo && before(x, buf[j]); j--) buf[j + 1] = buf[j];
        buf[j + 1] = x;
    }
}

/* buf[0..k) the k first of buf[0..n) (value descending, id ascending), in any order: quickselect */
static void keep_first(Scored *buf, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (hi - lo > 16) {
        int64_t p = split(buf, lo, hi);
        if (k - 1 <= p) hi = p;
        else lo = p + 1;
    }
    order_through(buf, lo, hi, hi);
}

typedef struct { SampledRows src; int64_t k; float *values; int64_t *ids; int64_t *done; } TopJob;

/* values: the k largest divided by t (as the row's divided copy would hold them) */
static int64_t top_row(const float *row, int64_t V, int64_t k, float t, Scored *buf, int64_t cap, float *values,
                       int64_t *ids) {
    RowBlocks r = row_blocks(row, V);
    int64_t n = 0;
    float thr = -INFINITY;
    __m256 nan = _mm256_setzero_ps();
    for (int64_t b = 0; b < r.blocks; b++) {
        const float *p = block_at(&r, b);
        __m256 v = _mm256_loadu_ps(p);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        for (int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(thr), _CMP_GT_OQ)); mask;
             mask &= mask - 1) {
            int j = __builtin_ctz(mask);
            if (p[j] <= thr) continue;  /* the threshold rose within this block */
            buf[n++] = (Scored){p[j], 8 * b + j};
            if (n == cap) {  /* keep the k largest; later values must beat the k-th (ties: a smaller id is kept) */
                keep_first(buf, n, k);
                n = k, thr = buf[0].v;
                for (int64_t m = 1; m < k; m++) thr = buf[m].v < thr ? buf[m].v : thr;
            }
        }
    }
    if (_mm256_movemask_ps(nan)) return 0;
    for (int64_t i = 0; n < k && i < V; i++)  /* fewer than k above -inf (min-p, a grammar): -inf ones, by id */
        if (row[i] == -INFINITY) buf[n++] = (Scored){row[i], i};
    keep_first(buf, n, k);
    order_through(buf, 0, k - 1, k - 1);
    for (int64_t j = 0; j < k; j++) values[j] = buf[j].v / t, ids[j] = buf[j].id;
    return 1;
}

static void top_range(const void *ctx, int64_t r0, int64_t r1) {
    const TopJob *j = ctx;
    int64_t cap = 4 * j->k;
    Scored *buf = malloc(sizeof(Scored) * cap);
    for (int64_t r = r0; r < r1; r++)
        j->done[r] = top_row(row_at(&j->src, r), j->src.V, j->k, temperature_at(&j->src, r), buf, cap,
                             j->values + r * j->k, j->ids + r * j->k);
    free(buf);
}

void tally_top_rows(const float *x, const int64_t *rows, int64_t M, int64_t V, int64_t k, const float *temperature,
                    float *values, int64_t *ids, int64_t *done) {
    TopJob job = {{x, rows, V, temperature}, k, values, ids, done};
    parallel_for(M, M * V * 2, top_range, &job);
}
