/* LoRA deltas, per row: y_row += B_s (A_s x_row) for the adapter s of each row (-1: the base, left alone), after a
 * projection of the one-call decode step (kernels.c) or of a layer (tally/native/lora_delta.py). The step's adapters
 * are stacked per projection (tally/layers/lora.py): A [R, in] and B^T [R, out], B block-diagonal over a fused
 * projection's parts with the scale folded in; each adapter owns a span of the R rows. Each row's sums run in one
 * fixed order whatever rows share the call, so its delta is the same alone or in any batch; rows of one adapter
 * share each weight row's load. (Included by kernels.c after kv_rows.h and pool.h.) */
enum { LORA_QKV = 0, LORA_O = 1, LORA_GATE_UP = 2, LORA_DOWN = 3, LORA_SITES = 4 };

typedef struct {
    const void *a, *bt;     /* A [R, k], B^T [R, n] in Lora.kind's format; a NULL: no adapter of the step here */
    const int64_t *cols;    /* [R, 2]: the columns of B^T's row r that are not zero, [from, to) */
    const int64_t *spans;   /* [slots, 2]: each adapter's rows of the stacks, [from, to) (empty: not here) */
    int64_t k, n;           /* in and out features, as Proj's */
} LoraSite;

typedef struct {
    int64_t layers, slots, kind;  /* kind: the stacks' format, as the KV cache's (kv_rows.h: F32, F16 or BF16) */
    const int64_t *row_slot;      /* [n]: each row's adapter, -1 for the base */
    const LoraSite *sites;        /* [layers][LORA_SITES] */
} Lora;

static inline float lora_value(const void *row, int64_t i, int kind) {
    if (kind == KV_F16) return _cvtsh_ss(((const uint16_t *)row)[i]);
    if (kind == KV_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)row)[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    return ((const float *)row)[i];
}

typedef struct {
    const LoraSite *site;
    int kind;
    const float *x;
    float *y, *low;        /* low [n, R]: each row's A x, in its adapter's columns */
    const int64_t *order;  /* the rows with an adapter, grouped by adapter: slot s's are order[at[s] .. at[s + 1]) */
    const int64_t *at;
    int64_t slots, R;
} LoraJob;

/* out[u] = A[k0 + u] . x for M stacked rows at once (their rows `stride` bytes apart): each dot one FMA chain over
 * 8-float blocks, then across lanes, then the tail, so its order is the same however many share the pass; M chains
 * side by side share each load of x */
static inline __attribute__((always_inline)) void lora_dots(const uint8_t *a, int64_t stride, const float *x,
                                                            int64_t in, int kind, float *out, const int M) {
    __m256 acc[8];
    for (int u = 0; u < M; u++) acc[u] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= in; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        for (int u = 0; u < M; u++) acc[u] = _mm256_fmadd_ps(load8(a + u * stride, i, kind), xv, acc[u]);
    }
    for (int u = 0; u < M; u++) {
        float s = hsum(acc[u]);
        for (int64_t t = i; t < in; t++) s = fmaf(lora_value(a + u * stride, t, kind), x[t], s);
        out[u] = s;
    }
}

#define LORA_ROWS 16  /* a step's rows a pass over 8 rows of A: their x stays in L2 while A's rows stay in L1 */

/* low[r, k] = A[k] . x_r for the stacked rows k in [k0, k1), over the rows r of the adapter that owns k */
static void lora_down_rows(const void *ctx, int64_t k0, int64_t k1) {
    const LoraJob *j = ctx;
    const LoraSite *st = j->site;
    int64_t stride = st->k * kv_bytes(j->kind);
    for (int64_t s = 0; s < j->slots; s++) {
        int64_t from = st->spans[2 * s] > k0 ? st->spans[2 * s] : k0;
        int64_t to = st->spans[2 * s + 1] < k1 ? st->spans[2 * s + 1] : k1;
        for (int64_t i0 = j->at[s]; i0 < j->at[s + 1]; i0 += LORA_ROWS) {
            int64_t i1 = i0 + LORA_ROWS < j->at[s + 1] ? i0 + LORA_ROWS : j->at[s + 1];
            for (int64_t k = from; k < to; k += 8) {
                const uint8_t *a = (const uint8_t *)st->a + k * stride;
                int m = to - k < 8 ? (int)(to - k) : 8;
                for (int64_t i = i0; i < i1; i++) {
                    int64_t r = j->order[i];
                    const float *x = j->x + r * st->k;
                    float *out = j->low + r * j->R + k;
                    switch (m) {  /* a constant count each: the accumulators stay in registers */
                        case 8: lora_dots(a, stride, x, st->k, j->kind, out, 8); break;
                        case 7: lora_dots(a, stride, x, st->k, j->kind, out, 7); break;
                        case 6: lora_dots(a, stride, x, st->k, j->kind, out, 6); break;
                        case 5: lora_dots(a, stride, x, st->k, j->kind, out, 5); break;
                        case 4: lora_dots(a, stride, x, st->k, j->kind, out, 4); break;
                        case 3: lora_dots(a, stride, x, st->k, j->kind, out, 3); break;
                        case 2: lora_dots(a, stride, x, st->k, j->kind, out, 2); break;
                        default: lora_dots(a, stride, x, st->k, j->kind, out, 1);
                    }
                }
            }
        }
    }
}

#define LORA_COLUMNS 64  /* output columns a piece: 8 vectors, held in registers over an adapter's rows of B^T */

/* t[0 .. 64) = sum over k in [k0, k1) of w[k] b_k[c0 ..], where every row k either covers the piece or misses it */
static inline __attribute__((always_inline)) void lora_up_piece(const LoraSite *st, const float *w, int64_t k0,
                                                                int64_t k1, int64_t c0, int kind, float *t) {
    __m256 acc[8];
    for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
    int64_t bytes = kv_bytes(kind);
    for (int64_t k = k0; k < k1; k++) {
        if (st->cols[2 * k] > c0 || st->cols[2 * k + 1] < c0 + LORA_COLUMNS) continue;
        const void *b = (const uint8_t *)st->bt + (k * st->n + c0) * bytes;
        __m256 wv = _mm256_set1_ps(w[k]);
        for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(wv, load8(b, 8 * u, kind), acc[u]);
    }
    for (int u = 0; u < 8; u++) _mm256_storeu_ps(t + 8 * u, acc[u]);
}

/* y[r, c] += sum over k of low[r, k] B^T[k, c], k in its adapter's span in order, for the columns of pieces
 * [p0, p1): every product a fused multiply-add, so a column's sum is the same in registers or in memory, whichever
 * lanes it falls in */
static void lora_up_columns(const void *ctx, int64_t p0, int64_t p1) {
    const LoraJob *j = ctx;
    const LoraSite *st = j->site;
    int64_t bytes = kv_bytes(j->kind);
    float t[LORA_COLUMNS];
    for (int64_t p = p0; p < p1; p++) {
        int64_t c0 = p * LORA_COLUMNS, c1 = c0 + LORA_COLUMNS < st->n ? c0 + LORA_COLUMNS : st->n;
        for (int64_t s = 0; s < j->slots; s++) {
            int64_t k0 = st->spans[2 * s], k1 = st->spans[2 * s + 1], touched = 0, whole = c1 - c0 == LORA_COLUMNS;
            for (int64_t k = k0; k < k1; k++) {
                int64_t from = st->cols[2 * k], to = st->cols[2 * k + 1];
                if (from < c1 && to > c0) {
                    touched = 1;
                    whole &= from <= c0 && to >= c1;  /* a row that covers part of the piece: the loop in memory */
                }
            }
            if (!touched) continue;
            for (int64_t i = j->at[s]; i < j->at[s + 1]; i++) {
                int64_t r = j->order[i];
                const float *w = j->low + r * j->R;
                if (whole) {
                    lora_up_piece(st, w, k0, k1, c0, j->kind, t);
                } else {
                    memset(t, 0, sizeof t);
                    for (int64_t k = k0; k < k1; k++) {
                        int64_t from = st->cols[2 * k] > c0 ? st->cols[2 * k] : c0;
                        int64_t to = st->cols[2 * k + 1] < c1 ? st->cols[2 * k + 1] : c1;
                        const void *b = (const uint8_t *)st->bt + k * st->n * bytes;
                        for (int64_t c = from; c < to; c++)
                            t[c - c0] = fmaf(w[k], lora_value(b, c, j->kind), t[c - c0]);
                    }
                }
                float *yr = j->y + r * st->n;
                for (int64_t c = c0; c < c1; c++) yr[c] += t[c - c0];
            }
        }
    }
}

/* y [n, out] += each row's delta of x [n, in] at `site` (layer * LORA_SITES + the projection) */
static void lora_add(const Lora *lr, int64_t site, const float *x, float *y, int64_t n) {
    if (!lr || site >= lr->layers * LORA_SITES || !lr->sites[site].a) return;
    const LoraSite *st = lr->sites + site;
    int64_t R = 0, slots = lr->slots, used = 0;
    for (int64_t s = 0; s < slots; s++) R = st->spans[2 * s + 1] > R ? st->spans[2 * s + 1] : R;
    int64_t *at = calloc(slots + 1, sizeof(int64_t)), *order = malloc(sizeof(int64_t) * (n ? n : 1));
    for (int64_t r = 0; r < n; r++)
        if (lr->row_slot[r] >= 0 && lr->row_slot[r] < slots) at[lr->row_slot[r] + 1]++;
    for (int64_t s = 0; s < slots; s++) at[s + 1] += at[s];
    int64_t *fill = malloc(sizeof(int64_t) * (slots + 1));
    memcpy(fill, at, sizeof(int64_t) * (slots + 1));
    for (int64_t r = 0; r < n; r++)
        if (lr->row_slot[r] >= 0 && lr->row_slot[r] < slots) order[fill[lr->row_slot[r]]++] = r, used++;
    if (used) {
        float *low = malloc(sizeof(float) * n * (R ? R : 1));
        LoraJob job = {st, (int)lr->kind, x, y, low, order, at, slots, R};
        parallel_for(R, used * st->k * R / slots, lora_down_rows, &job);
        parallel_for((st->n + LORA_COLUMNS - 1) / LORA_COLUMNS, used * st->n * R / slots, lora_up_columns, &job);
        free(low);
    }
    free(at); free(order); free(fill);
}

void tally_lora_add(const Lora *lr, int64_t site, const float *x, float *y, int64_t n) {
    lora_add(lr, site, x, y, n);
}
