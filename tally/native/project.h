/* A projection in any native format (Proj) and project(), which runs it: the decode step's layers and the experts
 * (experts.h) describe their weights so. Included by kernels.c after the formats' kernels (int_tiles.h, gemm_f16.h). */

enum { PROJ_Q4 = 1, PROJ_Q8 = 2, PROJ_F16 = 3, PROJ_W8A8 = 4, PROJ_CONCAT = 5, PROJ_F32 = 6 };

typedef struct {
    int64_t kind, n, k, group, bits; /* concat: `group` parts; q4: 4, 5, 6 bits or LUT4; q8: 8 (7: no -128) */
    const void *w;                   /* concat: the parts, an array of Proj */
    const void *scale, *min;         /* q4: d, m (int5 / int6: d, NULL); q8 / w8a8: s, unused; f16, f32: unused */
    const float *bias;
    const uint8_t *high;             /* q4: int5 / int6's high-bit planes, LUT4's table, or NULL */
    int64_t scale_form;              /* scale and min: fp32, fp16 or factored (int_dots.h: GroupValues) */
} Proj;

static void project(const Proj *p, const float *x, float *y, int64_t M, int accumulate) {
    if (p->kind == PROJ_CONCAT) {  /* parts in different formats (a GGUF's q/k in Q4_K, v in Q6_K) side by side */
        const Proj *parts = (const Proj *)p->w;
        int64_t offset = 0;
        for (int64_t i = 0; i < p->group; i++) {
            const Proj *part = parts + i;
            float *out = malloc(sizeof(float) * M * part->n);
            project(part, x, out, M, 0);
            for (int64_t r = 0; r < M; r++) {
                float *dst = y + r * p->n + offset;
                const float *src = out + r * part->n;
                if (accumulate)
                    for (int64_t j = 0; j < part->n; j++) dst[j] += src[j];
                else
                    memcpy(dst, src, sizeof(float) * part->n);
            }
            free(out);
            offset += part->n;
        }
        return;
    }
    if (p->kind == PROJ_Q4)
        tally_gemm_q4(x, p->w, p->high, p->scale, p->min, p->bias, y, M, p->n, p->k, p->group, p->bits, accumulate,
                      (int)p->scale_form);
    else if (p->kind == PROJ_Q8 || p->kind == PROJ_W8A8)
        tally_gemm_q8(x, p->w, p->scale, p->bias, y, M, p->n, p->k, p->group, accumulate, p->kind == PROJ_W8A8,
                      (int)p->scale_form, p->bits == 7);
    else
        gemm_panels(x, p->w, p->bias, y, M, p->n, p->k, accumulate, p->kind == PROJ_F32);
}

/* A projection's work as one range of items, for a parallel region it shares with other projections (experts.h runs
 * every chosen expert's in one): the same job, rows and kernels project() would run, so the same bits. */
typedef struct {
    RangeFn fn;             /* over items [0, items): tiles, pairs of tiles (AVX-512) or fp16/fp32 panels */
    int64_t items, work;    /* work: multiply-adds, as parallel_for weighs them */
    union { IntCall i; F16Job f; } call;  /* fn's argument: work_arg */
} ProjWork;

/* Prepares p over x [M, K] into y; 0 (nothing prepared: the caller runs project()) where it has no such form: parts
 * in several formats, or more rows than one pass over the weights. */
static int project_work(const Proj *p, const float *x, float *y, int64_t M, ProjWork *w) {
    if (p->kind == PROJ_F16 || p->kind == PROJ_F32) {
        if (M > F16_MB) return 0;
        w->call.f = (F16Job){x, p->bias, p->w, y, p->n, p->k, 0, M, 0, p->kind == PROJ_F32};
        w->fn = f16_panels, w->items = (p->n + PANEL - 1) / PANEL;
    } else if (p->kind == PROJ_Q4 || p->kind == PROJ_Q8 || p->kind == PROJ_W8A8) {
        if (M > INT_MB) return 0;
        w->call.i = p->kind == PROJ_Q4
            ? q4_call(x, p->w, p->high, p->scale, p->min, p->bias, y, M, p->n, p->k, p->group, p->bits, 0,
                      (int)p->scale_form)
            : q8_call(x, p->w, p->scale, p->bias, y, M, p->n, p->k, p->group, 0, p->kind == PROJ_W8A8,
                      (int)p->scale_form, p->bits == 7);
        w->fn = w->call.i.k.tiles, w->items = (p->n + TILE - 1) / TILE;
#ifdef TALLY_AVX512
        if (M >= PAIR_ROWS) w->fn = w->call.i.k.pairs, w->items = (w->items + 1) / 2;
#endif
    } else {
        return 0;
    }
    w->work = p->n * p->k * M;
    return 1;
}

static const void *work_arg(const ProjWork *w) {
    return w->fn == f16_panels ? (const void *)&w->call.f : (const void *)&w->call.i.job;
}

static void project_work_free(ProjWork *w) {
    if (w->fn != f16_panels) int_call_free(&w->call.i);
}
