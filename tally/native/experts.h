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

/* Row r's experts chosen[r * k ..] and their weights, as MixtureOfExperts.forward routes (tally/models/experts.py) */
static void route_rows(const Experts *e, const float *x, int64_t n, int64_t *chosen, float *weights) {
    int64_t E = e->num_experts, k = e->top_k;
    float *logits = malloc(sizeof(float) * E);
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
    free(logits);
}

/* out [n, hidden] = the experts' weighted sum for x [n, hidden]. Rows are grouped by expert: each expert's
 * projections run once over its rows, so a batch reads an expert's weights once however many of its rows chose it. */
void tally_experts(const Experts *e, const float *x, int64_t n, float *out) {
    int64_t H = e->hidden, I = e->intermediate, k = e->top_k, E = e->num_experts;
    int64_t *chosen = malloc(sizeof(int64_t) * n * k), *picks = malloc(sizeof(int64_t) * n * k);
    int64_t *start = calloc(E + 1, sizeof(int64_t));
    float *weights = malloc(sizeof(float) * n * k);
    route_rows(e, x, n, chosen, weights);
    for (int64_t i = 0; i < n * k; i++) start[chosen[i] + 1]++;
    for (int64_t ex = 0; ex < E; ex++) start[ex + 1] += start[ex];
    int64_t *fill = malloc(sizeof(int64_t) * E);
    memcpy(fill, start, sizeof(int64_t) * E);
    /* the (row, slot) choices grouped by expert, rows in order */
    for (int64_t i = 0; i < n * k; i++) picks[fill[chosen[i]]++] = i;
    float *xr = malloc(sizeof(float) * n * H), *gu = malloc(sizeof(float) * n * 2 * I);
    float *act = malloc(sizeof(float) * n * I), *y = malloc(sizeof(float) * n * H);
    memset(out, 0, sizeof(float) * n * H);
    for (int64_t ex = 0; ex < E; ex++) {
        int64_t c = start[ex + 1] - start[ex];
        if (!c) continue;
        const int64_t *p = picks + start[ex];
        for (int64_t i = 0; i < c; i++) memcpy(xr + i * H, x + p[i] / k * H, sizeof(float) * H);
        project(e->gate_up + ex, xr, gu, c, 0);
        tally_gated_mul(gu, act, c, I, (int)e->activation);
        project(e->down + ex, act, y, c, 0);
        for (int64_t i = 0; i < c; i++) {
            float *yr = y + i * H, *o = out + p[i] / k * H, w = weights[p[i]];
            /* two passes: the product rounded on its own, as PyTorch's, not contracted into the add */
            for (int64_t j = 0; j < H; j++) yr[j] *= w;
            for (int64_t j = 0; j < H; j++) o[j] += yr[j];
        }
    }
    free(chosen); free(picks); free(start); free(fill); free(weights); free(xr); free(gu); free(act); free(y);
}
