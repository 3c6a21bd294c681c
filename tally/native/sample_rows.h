/* Sampling: one token a row of x [M, V] (logits after temperature and the filters; -inf: dropped), the first in
 * token order whose running softmax mass passes u [M] (in [0, 1)) times the row's: the inverse of the distribution
 * function at u, one uniform a row. The exponential race it replaces (argmax of probs / Exp(1)) drew one a token:
 * over Qwen's 151,936 logits torch's uniform, log, exp and divide took 1.3-1.5 ms a row on the Zen 4 VM, here a max,
 * a pass of exps into per-8 sums and a walk over them. A seeded row still takes its own generator's next number,
 * whatever the batch. The sums are doubles, and the walk adds the same per-8 sums in the same order as the total,
 * so its last running sum is the total and the walk ends on a kept token. Included by kernels.c after exp256. */
typedef struct { const float *x; int64_t V; const double *u; int64_t *out; } SampleJob;

static inline __m256 kept_exp(const float *v8, __m256 top) {  /* e^(v - top), 0 where v is -inf */
    __m256 v = _mm256_loadu_ps(v8);
    return _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ), exp256(_mm256_sub_ps(v, top)));
}

static inline float sum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* row's token at u; -1 where it holds a NaN or keeps nothing. sums: room for its blocks of 8 */
static int64_t sample_row(const float *row, int64_t V, double u, double *sums) {
    int64_t blocks = (V + 7) / 8;
    float tail[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    memcpy(tail, row + V / 8 * 8, sizeof(float) * (V % 8));
#define BLOCK(b) ((b) < V / 8 ? row + 8 * (b) : tail)  /* a ragged last block: its values, then -inf */
    __m256 top8 = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        __m256 v = _mm256_loadu_ps(BLOCK(b));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top8 = _mm256_max_ps(top8, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, top8);
    float top = lanes[0];
    for (int l = 1; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
    if (_mm256_movemask_ps(nan) || top == -INFINITY) return -1;
    __m256 top_v = _mm256_set1_ps(top);
    double total = 0;
    for (int64_t b = 0; b < blocks; b++) sums[b] = total += sum8(kept_exp(BLOCK(b), top_v));
    double target = u * total;
    int64_t lo = 0, hi = blocks - 1;  /* the first block whose running sum passes target */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (sums[mid] > target) hi = mid;
        else lo = mid + 1;
    }
    float e[8];
    _mm256_storeu_ps(e, kept_exp(BLOCK(lo), top_v));
#undef BLOCK
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
    double *sums = malloc(sizeof(double) * ((j->V + 7) / 8));
    for (int64_t r = r0; r < r1; r++) j->out[r] = sample_row(j->x + r * j->V, j->V, j->u[r], sums);
    free(sums);
}

/* Returns how many rows gave -1 */
int64_t tally_sample_rows(const float *x, int64_t M, int64_t V, const double *u, int64_t *out) {
    SampleJob job = {x, V, u, out};
    parallel_for(M, M * V * 4, sample_range, &job);
    int64_t failed = 0;
    for (int64_t r = 0; r < M; r++) failed += out[r] < 0;
    return failed;
}
