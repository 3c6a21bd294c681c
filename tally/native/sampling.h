/* The sampler's kernels (tally/sample/): the greedy argmax, a random row's token at one uniform, the top-k of rows
 * and their logsumexp. Included by kernels.c after exp256 and the pool. */

/* ---- Greedy tokens: the first index of each row's maximum, x [M, V] -> out [M]; -1 for a row holding a NaN
 * (torch.argmax takes the first NaN there: the caller asks it); returns how many such rows there are.
 * torch.argmax runs a scalar loop on CPU, a visible share of a decode step over a large vocabulary
 * (docs/benchmarks.md#sampler). Here two sets of 8 lanes each keep their first maximum (a strictly greater value
 * replaces it), then the lanes' maxima meet: the largest value, and of lanes holding it the smallest index. */
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
 * passes u [M] (in [0, 1)) times the row's: the inverse of the distribution function at u, one uniform a row, where
 * an exponential race (argmax of probs / Exp(1)) draws one a token (docs/benchmarks.md#sampler). Here a max, a pass
 * of exps into running sums (doubles) a chunk of the row, and a walk over one chunk (sample_row). A seeded row still
 * takes its own generator's next number, whatever the batch. The temperature scales the exponents, e^((x - max) / t),
 * so a row that only has one (the sampler's plain rows) is read where its logits lie: no copy of the row, no pass
 * dividing it. */
typedef struct { SampledRows src; const double *u; int64_t *out; } SampleJob;

static inline __m256 kept_exp(const float *v8, __m256 top, __m256 inv_t) {  /* e^((v - top) inv_t); 0 at v = -inf */
    __m256 v = _mm256_loadu_ps(v8);
    return _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ),
                         exp256(_mm256_mul_ps(_mm256_sub_ps(v, top), inv_t)));
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

/* Blocks of 8 a chunk of the row's mass: a chunk's exps add up in vectors of doubles, one horizontal sum a chunk
 * rather than a scalar double add a block. What is left of the pass is its exps. */
#define MASS_CHUNK 64

static inline double hsum4d(__m256d v) {
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* sum of e^((v - top) inv_t) over blocks b0..b1, in double */
static inline double blocks_mass(const RowBlocks *r, int64_t b0, int64_t b1, __m256 top_v, __m256 inv_v) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (int64_t b = b0; b < b1; b++) {
        __m256 e = kept_exp(block_at(r, b), top_v, inv_v);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    return hsum4d(_mm256_add_pd(lo, hi));
}

/* sum of e^((v - top) inv_t) over the row in double, chunk by chunk; sums (or NULL): the running sum after each
 * chunk of MASS_CHUNK blocks */
static double mass(const RowBlocks *r, float top, float inv_t, double *sums) {
    __m256 top_v = _mm256_set1_ps(top), inv_v = _mm256_set1_ps(inv_t);
    double total = 0;
    for (int64_t c = 0; c * MASS_CHUNK < r->blocks; c++) {
        int64_t b1 = (c + 1) * MASS_CHUNK < r->blocks ? (c + 1) * MASS_CHUNK : r->blocks;
        total += blocks_mass(r, c * MASS_CHUNK, b1, top_v, inv_v);
        if (sums) sums[c] = total;
    }
    return total;
}

/* row's token at u and 1 / temperature inv_t; -1 where it holds a NaN or +inf or keeps nothing. sums: room for its
 * chunks (MASS_CHUNK blocks of 8). The first chunk whose running sum passes the target, then in it the first block
 * and token, their exps added one by one from the chunk's start: the chunk's vector sum and that walk may round apart,
 * so a walk that does not pass the target within its chunk takes the chunk's last kept token (the last chunk's
 * running sum is the total, so the chunk found keeps one). */
static int64_t sample_row(const float *row, int64_t V, float inv_t, double u, double *sums) {
    RowBlocks r = row_blocks(row, V);
    int has_nan;
    float top = row_top(&r, &has_nan);
    if (has_nan || !isfinite(top)) return -1;  /* +inf: e^(inf - inf) would be NaN */
    double target = u * mass(&r, top, inv_t, sums);
    int64_t lo = 0, hi = (r.blocks + MASS_CHUNK - 1) / MASS_CHUNK - 1;  /* the first chunk passing the target */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (sums[mid] > target) hi = mid;
        else lo = mid + 1;
    }
    __m256 top_v = _mm256_set1_ps(top), inv_v = _mm256_set1_ps(inv_t);
    int64_t b1 = (lo + 1) * MASS_CHUNK < r.blocks ? (lo + 1) * MASS_CHUNK : r.blocks, last = -1;
    double run = lo ? sums[lo - 1] : 0;
    for (int64_t b = lo * MASS_CHUNK; b < b1; b++) {
        float e[8];
        _mm256_storeu_ps(e, kept_exp(block_at(&r, b), top_v, inv_v));
        for (int j = 0; j < 8; j++) {
            if (e[j] <= 0) continue;
            last = 8 * b + j, run += e[j];
            if (run > target) return last;
        }
    }
    return last;
}

static void sample_range(const void *ctx, int64_t r0, int64_t r1) {
    const SampleJob *j = ctx;
    double *sums = malloc(sizeof(double) * ((j->src.V + 8 * MASS_CHUNK - 1) / (8 * MASS_CHUNK)));
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
 * the top-p filter's mass over a whole row and the logprobs' normaliser, a max and one pass of exps (torch's makes
 * max, subtract, exp, sum and log separate passes). */
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
 * cost a compare (docs/benchmarks.md#sampler). A row holding a NaN is the caller's (0 in its slot of `done`).
 * A kept value is one 64-bit key, its order in the high half (descending values ascend) and its token id in the low,
 * so that keys ascend in the order wanted and one integer compare orders two of them, and the partition is branch-free
 * (a float compare with its tie on ids would make partitioning the row's main cost). */
typedef uint64_t Key;

static inline Key key_of(float v, int64_t id) {
    uint32_t bits;
    float w = v + 0.0f;  /* -0 as +0: equal values, ordered by id */
    memcpy(&bits, &w, 4);
    uint32_t ascending = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
    return (Key)~ascending << 32 | (uint32_t)id;
}

static inline int64_t id_of(Key key) { return (int64_t)(uint32_t)key; }

static inline float value_of(Key key) {
    uint32_t ascending = ~(uint32_t)(key >> 32), bits = ascending & 0x80000000u ? ascending & 0x7FFFFFFFu : ~ascending;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

/* a[lo..hi] around the median of three: returns p with a[lo..p) below a[p] and a[p + 1..hi] above (keys differ). The
 * loop's swap and step are branch-free (Lomuto's scheme): which side a key goes is the data's coin flip. */
static int64_t split(Key *a, int64_t lo, int64_t hi) {
    int64_t mid = lo + (hi - lo) / 2;
    Key x = a[lo], y = a[mid], z = a[hi];  /* the median into a[hi] */
    Key med = x < y ? (y < z ? y : x < z ? z : x) : (x < z ? x : y < z ? z : y);
    int64_t at = med == x ? lo : med == y ? mid : hi;
    a[at] = z, a[hi] = med;
    int64_t i = lo;
    for (int64_t j = lo; j < hi; j++) {
        Key v = a[j];
        int64_t below = v < med;
        a[j] = a[i], a[i] = v, i += below;
    }
    a[hi] = a[i], a[i] = med;
    return i;
}

static void insertion_sort(Key *a, int64_t lo, int64_t hi) {
    for (int64_t i = lo + 1; i <= hi; i++) {
        Key x = a[i];
        int64_t j = i - 1;
        for (; j >= lo && a[j] > x; j--) a[j + 1] = a[j];
        a[j + 1] = x;
    }
}

/* a[lo..hi] ordered through position `upto` (the rest in any order): `upto` = hi sorts it all */
static void order_through(Key *a, int64_t lo, int64_t hi, int64_t upto) {
    while (hi - lo > 16) {
        int64_t p = split(a, lo, hi);
        if (upto > p) {  /* the left part is wholly needed: sort it, go on right */
            order_through(a, lo, p - 1, p - 1);
            lo = p + 1;
        } else {
            hi = p - 1;  /* nothing right of p is needed */
        }
    }
    insertion_sort(a, lo, hi);
}

/* a[0..k) the k smallest keys of a[0..n), in any order (quickselect); returns the largest of them */
static Key keep_first(Key *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (hi - lo > 16) {
        int64_t p = split(a, lo, hi);
        if (p == k - 1) return a[p];
        if (p < k - 1) lo = p + 1;
        else hi = p - 1;
    }
    insertion_sort(a, lo, hi);
    return a[k - 1];
}

typedef struct { SampledRows src; int64_t k; float *values; int64_t *ids; int64_t *done; } TopJob;

/* Values of the row above thr into buf (n of them; each time the buffer of cap fills, the k largest stay and thr rises
 * to their smallest: later values must beat the k-th, ties keeping the smaller id); returns whether the row holds a
 * NaN */
static int collect_above(const RowBlocks *r, int64_t k, float thr, Key *buf, int64_t cap, int64_t *count) {
    const RowBlocks row = *r;  /* a local copy: the stores into buf would otherwise reload its fields every block */
    int64_t n = 0;
    __m256 nan = _mm256_setzero_ps();
    for (int64_t b = 0; b < row.blocks; b++) {
        const float *p = block_at(&row, b);
        __m256 v = _mm256_loadu_ps(p);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(thr), _CMP_GT_OQ));
        if (__builtin_expect(!mask, 1)) continue;  /* most blocks: laid out as the loop's straight path */
        for (; mask; mask &= mask - 1) {
            int j = __builtin_ctz(mask);
            if (p[j] <= thr) continue;  /* the threshold rose within this block */
            buf[n++] = key_of(p[j], 8 * b + j);
            if (n == cap) {
                thr = value_of(keep_first(buf, n, k));
                n = k;
            }
        }
    }
    *count = n;
    return _mm256_movemask_ps(nan) != 0;
}

/* Blocks of 8 between two a sample of the row (sampled_threshold), doubled until the sample fits the buffer */
#define SAMPLE_STRIDE 64

/* A threshold that most of the time lies below the row's k-th largest with ~2k values above it, or -inf: the
 * (2k / stride)-th largest of every stride-th block's values. Started from -inf, a row's first 4k values enter the
 * buffer and the threshold climbs by quickselects over it. */
static float sampled_threshold(const RowBlocks *r, int64_t k, Key *buf, int64_t cap) {
    int64_t stride = SAMPLE_STRIDE, n = 0;
    while ((r->blocks + stride - 1) / stride * 8 > cap) stride *= 2;
    int64_t j = 2 * k / stride;
    if (j < 8) return -INFINITY;  /* too few sampled values above it to place it well */
    for (int64_t b = 0; b < r->blocks; b += stride) {
        const float *p = block_at(r, b);
        for (int l = 0; l < 8; l++)
            if (!isnan(p[l])) buf[n++] = key_of(p[l], 8 * b + l);
    }
    return j > n ? -INFINITY : value_of(keep_first(buf, n, j));
}

/* values: the k largest divided by t (as the row's divided copy would hold them). From a sampled threshold, the k
 * largest are exact whenever at least k values lie above it; otherwise every value is collected again from -inf. */
static int64_t top_row(const float *row, int64_t V, int64_t k, float t, Key *buf, int64_t cap, float *values,
                       int64_t *ids) {
    RowBlocks r = row_blocks(row, V);
    float thr = sampled_threshold(&r, k, buf, cap);
    int64_t n;
    int has_nan = collect_above(&r, k, thr, buf, cap, &n);
    if (!has_nan && n < k && thr > -INFINITY) has_nan = collect_above(&r, k, -INFINITY, buf, cap, &n);
    if (has_nan) return 0;
    for (int64_t i = 0; n < k && i < V; i++)  /* fewer than k above -inf (min-p, a grammar): -inf ones, by id */
        if (row[i] == -INFINITY) buf[n++] = key_of(row[i], i);
    keep_first(buf, n, k);
    order_through(buf, 0, k - 1, k - 1);
    for (int64_t j = 0; j < k; j++) ids[j] = id_of(buf[j]), values[j] = row[ids[j]] / t;
    return 1;
}

static void top_range(const void *ctx, int64_t r0, int64_t r1) {
    const TopJob *j = ctx;
    int64_t cap = 4 * j->k;
    Key *buf = malloc(sizeof(Key) * cap);
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
