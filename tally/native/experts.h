/* A mixture of experts' MLP in one call: the router, top-k routing, and each chosen expert's gated MLP over the rows
 * that chose it, on the same integer and fp16 projections as the dense layers (project.h: weights as stored, a
 * GGUF's blocks included). Included by kernels.c after project.h, gated.h and vec_math.h. Every row is routed and
 * computed on its own (its router logits in one fixed order, its activations rounded to int8 by itself, its expert
 * outputs added in expert order), so a token's result never depends on which other rows share its experts. */

enum { ROUTE_SOFTMAX = 0, ROUTE_TOP_K_SOFTMAX = 1 };

typedef struct {
    int64_t num_experts, top_k, hidden, intermediate;
    int64_t routing;      /* ROUTE_SOFTMAX: softmax over every expert, then the top k; ROUTE_TOP_K_SOFTMAX: the top k
                             logits, then their softmax */
    int64_t normalize;    /* the chosen weights rescaled to sum to one */
    int64_t activation;   /* ACT_* */
    const float *router;  /* [num_experts, hidden] */
    const float *router_bias;  /* [num_experts] or NULL */
    const Proj *gate_up;  /* [num_experts]: expert e's gate and up side by side, [2 intermediate, hidden] */
    const Proj *down;     /* [num_experts]: [hidden, intermediate] */
    float swiglu_alpha, swiglu_limit;  /* ACT_CLAMPED_SWIGLU's */
} Experts;

static float row_dot(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The k largest of v[0..n) (first index on ties), largest first: k is a handful, so k passes */
static void top_k(const float *v, int64_t n, int64_t k, int64_t *index) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; i++) {
            int taken = 0;
            for (int64_t p = 0; p < j; p++) taken |= index[p] == i;
            if (!taken && (best < 0 || v[i] > v[best])) best = i;
        }
        index[j] = best;
    }
}

static void softmax_in_place(float *v, int64_t n) {
    float m = v[0], s = 0;
    for (int64_t i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    for (int64_t i = 0; i < n; i++) s += v[i] = expf(v[i] - m);
    for (int64_t i = 0; i < n; i++) v[i] /= s;
}

/* Row r's experts chosen[r * k ..] and their weights, as MixtureOfExperts.forward routes (tally/models/experts.py);
 * logits: room for num_experts */
static void route_rows(const Experts *e, const float *x, int64_t n, float *logits, int64_t *chosen, float *weights) {
    int64_t E = e->num_experts, k = e->top_k;
    for (int64_t r = 0; r < n; r++) {
        int64_t *c = chosen + r * k;
        float *w = weights + r * k;
        for (int64_t i = 0; i < E; i++)
            logits[i] = row_dot(x + r * e->hidden, e->router + i * e->hidden, e->hidden)
                        + (e->router_bias ? e->router_bias[i] : 0.0f);
        if (e->routing == ROUTE_SOFTMAX) softmax_in_place(logits, E);
        top_k(logits, E, k, c);
        for (int64_t j = 0; j < k; j++) w[j] = logits[c[j]];
        if (e->routing == ROUTE_TOP_K_SOFTMAX) softmax_in_place(w, k);
        if (e->normalize) {
            float s = 0;
            for (int64_t j = 0; j < k; j++) s += w[j];
            for (int64_t j = 0; j < k; j++) w[j] /= s;
        }
    }
}

/* The chosen experts' projections in one parallel region: its items are (expert, tile) pairs across the experts, so a
 * layer pays one start and join of the threads for all the gate_ups and one for all the downs, not two per chosen
 * expert (docs/benchmarks.md#decode-roofline). Each expert's share is the job project() runs (project_work), so the
 * same bits. The pool cuts a region's items into equal shares, but an expert's tile costs more the more rows chose
 * it: each expert gets items in proportion to its tiles' cost, mapped evenly onto its own tiles, so the threads'
 * shares are even in time and neither waits for the other. */
typedef struct { const ProjWork *works; const int64_t *first; int64_t count; } Grouped;  /* first: [count + 1] */

static void grouped_items(const void *ctx, int64_t b, int64_t end) {
    const Grouped *g = ctx;
    for (int64_t i = 0; i < g->count && b < end; i++) {
        if (b >= g->first[i + 1]) continue;
        int64_t stop = end < g->first[i + 1] ? end : g->first[i + 1], span = g->first[i + 1] - g->first[i];
        int64_t units = g->works[i].items, u0 = (b - g->first[i]) * units / span;
        int64_t u1 = (stop - g->first[i]) * units / span;
        if (u1 > u0) g->works[i].fn(work_arg(g->works + i), u0, u1);
        b = stop;
    }
}

/* proj[ex] over expert ex's rows start[ex] .. start[ex + 1] of x [., K] into the same rows of y [., N]; an expert whose
 * projection has no work form (project_work) runs alone first. works, first: room for E and E + 1. */
static void project_experts(const Proj *proj, const int64_t *start, int64_t E, const float *x, int64_t K, float *y,
                            int64_t N, ProjWork *works, int64_t *first) {
    int64_t count = 0, work = 0, cheapest = 0;
    first[0] = 0;
    for (int64_t ex = 0; ex < E; ex++) {
        int64_t r0 = start[ex], c = start[ex + 1] - r0;
        if (!c) continue;
        if (!project_work(proj + ex, x + r0 * K, y + r0 * N, c, works + count)) {
            project(proj + ex, x + r0 * K, y + r0 * N, c, 0);
            continue;
        }
        /* a unit's cost in half rows: a tile over c rows takes about as long as c + 1/2 rows' products, the pass
         * over its weights worth half a row's (docs/benchmarks.md#decode-roofline) */
        int64_t cost = works[count].work / c / works[count].items * (2 * c + 1);
        cheapest = !count || cost < cheapest ? cost : cheapest;
        first[count + 1] = cost;  /* for now */
        work += works[count++].work;
    }
    for (int64_t i = 0; i < count; i++) first[i + 1] = first[i] + works[i].items * first[i + 1] / cheapest;
    Grouped g = {works, first, count};
    parallel_for(first[count], work, grouped_items, &g);
    for (int64_t i = 0; i < count; i++) project_work_free(works + i);
}

/* A thread's buffers, kept between calls up to SCRATCH_MAX bytes (a decode step's), so the hot call allocates only
 * what the projections' activations take; a larger call (a prompt's many rows) allocates its own */
#define SCRATCH_MAX ((size_t)16 << 20)
static __thread struct { void *p; size_t size; } scratch;

static void *scratch_bytes(size_t size) {
    if (size > SCRATCH_MAX) return malloc(size);
    if (size > scratch.size) {
        free(scratch.p);
        scratch.p = malloc(size), scratch.size = size;
    }
    return scratch.p;
}

/* out [n, hidden] = the experts' weighted sum for x [n, hidden]. Rows are grouped by expert: each expert's
 * projections run once over its rows, so a batch reads an expert's weights once however many of its rows chose it. */
void tally_experts(const Experts *e, const float *x, int64_t n, float *out) {
    int64_t H = e->hidden, I = e->intermediate, k = e->top_k, E = e->num_experts, nk = n * k;
    size_t size = sizeof(ProjWork) * E + sizeof(int64_t) * (2 * nk + 3 * E + 2)
                  + sizeof(float) * (E + nk + nk * (2 * H + 3 * I));
    char *buf = scratch_bytes(size);
    ProjWork *works = (ProjWork *)buf;
    int64_t *chosen = (int64_t *)(works + E), *picks = chosen + nk, *start = picks + nk, *fill = start + E + 1;
    int64_t *first = fill + E;
    float *logits = (float *)(first + E + 1), *weights = logits + E, *xr = weights + nk, *gu = xr + nk * H;
    float *act = gu + nk * 2 * I, *y = act + nk * I;
    route_rows(e, x, n, logits, chosen, weights);
    memset(start, 0, sizeof(int64_t) * (E + 1));
    for (int64_t i = 0; i < nk; i++) start[chosen[i] + 1]++;
    for (int64_t ex = 0; ex < E; ex++) start[ex + 1] += start[ex];
    memcpy(fill, start, sizeof(int64_t) * E);
    /* the (row, slot) choices grouped by expert, rows in order, and their rows side by side in that order */
    for (int64_t i = 0; i < nk; i++) picks[fill[chosen[i]]++] = i;
    for (int64_t i = 0; i < nk; i++) memcpy(xr + i * H, x + picks[i] / k * H, sizeof(float) * H);
    project_experts(e->gate_up, start, E, xr, H, gu, 2 * I, works, first);
    tally_gated_mul(gu, act, nk, I, (int)e->activation, e->swiglu_alpha, e->swiglu_limit);
    project_experts(e->down, start, E, act, I, y, H, works, first);
    memset(out, 0, sizeof(float) * n * H);
    for (int64_t i = 0; i < nk; i++) {  /* in expert order, each row's outputs as they come */
        float *yr = y + i * H, *o = out + picks[i] / k * H, w = weights[picks[i]];
        /* two passes: the product rounded on its own, as PyTorch's, not contracted into the add */
        for (int64_t j = 0; j < H; j++) yr[j] *= w;
        for (int64_t j = 0; j < H; j++) o[j] += yr[j];
    }
    if (size > SCRATCH_MAX) free(buf);
}
