/* Tally's CPU kernels (AVX2 + FMA + F16C; outputs fp32).
 *
 * Why they exist: at one to a few tokens per step the CPU time goes to reading weights and to the
 * number of small framework calls, not to arithmetic. PyTorch's CPU weight-only kernels are slow with
 * fp32 activations on AVX2, and a decode layer costs ~60 dispatcher calls. These kernels read int4 / int8
 * weights into byte dot products with int8-rounded activations (as llama.cpp does) and fp16 weights into fp32
 * FMAs, fuse a layer's small steps (norm, rotary + cache write, paged decode attention, SiLU-and-multiply) into
 * one call each, and run a whole decode step's layers in one call (tally_decode_layers, at the end).
 *
 * Conventions: row-major, contiguous; activations and outputs fp32; x [M, K], weights [N, K] (fp16: panels,
 * see tally_gemm_f16), y [M, N].
 * `accumulate` != 0 adds into y (a projection that feeds the residual stream writes straight into it).
 * Threads: pool.h's parallel loop over output tiles, as many as torch.set_num_threads asks (OpenMP's count: the
 * library links the libgomp torch has already loaded).
 */
#include <immintrin.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PAR_MIN (1 << 18) /* multiply-adds per call below which threading costs more than it saves */
#include "pool.h"
#include "kv_rows.h"  /* the KV cache's formats: load8, store_row, widen_row; store_bf16x8 */
#include "vec_math.h"  /* hsum, exp256, tanh256 */

static inline void store_out(float *y, float v, const float *bias, int64_t n, int accumulate) {
    if (bias) v += bias[n];
    *y = accumulate ? *y + v : v;
}

/* Bytes ahead of a weight stream to prefetch, for the integer tiles (int_dots.h) and the fp16 panels (gemm_f16.h): a
 * tile's weights are contiguous and a thread's tiles follow each other; the hardware prefetcher alone leaves a
 * one-row pass well below the read bandwidth; the distance is the measured best (docs/benchmarks.md#kernels). */
#ifndef PREFETCH
#define PREFETCH 2048
#endif
/* And bytes ahead to prefetch into L2 (hint T1) beside it, in the loops of 1-4 rows: with L1's distance alone a
 * one-row pass from memory reads the nibble formats well below plain loads' rate (docs/benchmarks.md#kernels). The
 * pairs' loop (5 rows on) gains nothing from it, so has none.
 * (`python benchmarks/native_builds.py --define PREFETCH_L2=2048,8192 --copies 30` measures the distance again.) */
#ifndef PREFETCH_L2
#define PREFETCH_L2 8192
#endif

/* p + near into L1, p + far into L2 */
static inline __attribute__((always_inline)) void prefetch_stream(const uint8_t *p, int64_t near, int64_t far) {
    _mm_prefetch((const char *)(p + near), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + far), _MM_HINT_T1);
}

#include "int_tiles.h"  /* activations to int8, integer weights in tiles: tally_gemm_q4, tally_gemm_q8 */

#include "gemm_f16.h"  /* fp16, bf16 or fp32 weights in panels: tally_gemm_f16, _bf16, _f32 */


/* ---- RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w, per row of D (D a multiple of 8) ------------------ */
typedef struct {
    const float *x, *w;
    float *y;
    int64_t D;
    float eps;
} NormJob;

static void norm_rows(const void *job, int64_t r0, int64_t r1) {
    const NormJob *j = job;
    const float *x = j->x, *w = j->w;
    float *y = j->y;
    int64_t D = j->D;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * D;
        __m256 ss = _mm256_setzero_ps();
        for (int64_t i = 0; i < D; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            ss = _mm256_fmadd_ps(v, v, ss);
        }
        __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(ss) / (float)D + j->eps));
        for (int64_t i = 0; i < D; i += 8)
            _mm256_storeu_ps(y + r * D + i,
                             _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), inv), _mm256_loadu_ps(w + i)));
    }
}

/* Rows on the pool's threads where there are enough of them (a prompt's); in place (y == x) too: a row's values
 * are read before they are written */
void tally_rms_norm(const float *x, const float *w, float *y, int64_t M, int64_t D, float eps) {
    NormJob job = {x, w, y, D, eps};
    parallel_for(M, M * D * 4, norm_rows, &job);
}

/* ---- q/k norms and rotary (rotate-half) on q and k in place, then k and v into the paged cache ------------
 * qkv [T, row] holds q [Hq, D], k [Hkv, D], v [Hkv, D] side by side. q_norm, k_norm (NULL: none) are RMSNorm
 * weights applied before the rotation: of each head's D values (norm_whole 0: Qwen3, Gemma 3) or of all heads' at
 * once (1: OLMo 2). cos, sin [T, R] (NULL: a layer without rotary, SmolLM3's NoPE layers) rotate each head's first R
 * dimensions (R < D: partial rotary, Phi-4-mini). The caches are [slots, Hkv, D] of `kind` (fp32, fp16 or bf16);
 * slots [T] the cache slot of each token. */
typedef struct {
    float *qkv;
    int64_t row, norm_whole, R, Hq, Hkv, D;
    const float *q_norm, *k_norm, *cos, *sin;
    float eps;
    const int64_t *slots;
    void *k_cache, *v_cache;  /* fp32, fp16 or bf16 rows of `kind`; int8 values with their scales below */
    int kind;
    const float *query_scale, *key_scale;
    float *k_scales, *v_scales;
} RopeJob;

/* token t's q/k norms and rotary, in place */
static void qk_prepare(const RopeJob *j, int64_t t) {
    int64_t D = j->D, half = j->R / 2;
    float *q = j->qkv + t * j->row, *k = q + j->Hq * D;
    if (j->q_norm) {  /* in place: tally_rms_norm reads a row's values before it writes them */
        tally_rms_norm(q, j->q_norm, q, j->norm_whole ? 1 : j->Hq, j->norm_whole ? j->Hq * D : D, j->eps);
        tally_rms_norm(k, j->k_norm, k, j->norm_whole ? 1 : j->Hkv, j->norm_whole ? j->Hkv * D : D, j->eps);
    }
    if (!j->cos) return;
    const float *c = j->cos + t * j->R, *s = j->sin + t * j->R;
    for (int64_t h = 0; h < j->Hq + j->Hkv; h++) {
        float *v = q + h * D;
        for (int64_t i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * c[i] - b * s[i];
            v[i + half] = b * c[i + half] + a * s[i + half];
        }
    }
}

static void rope_store_rows(const void *job, int64_t t0, int64_t t1) {
    const RopeJob *j = job;
    int64_t bytes = j->Hkv * j->D * kv_bytes(j->kind);
    for (int64_t t = t0; t < t1; t++) {
        qk_prepare(j, t);
        const float *k = j->qkv + t * j->row + j->Hq * j->D, *v = k + j->Hkv * j->D;
        store_row((char *)j->k_cache + j->slots[t] * bytes, k, j->Hkv * j->D, j->kind);
        store_row((char *)j->v_cache + j->slots[t] * bytes, v, j->Hkv * j->D, j->kind);
    }
}

/* Tokens on the pool's threads where a prompt brings enough of them; each token's values are its own */
void tally_rope_store(float *qkv, int64_t T, int64_t row, const float *q_norm, const float *k_norm,
                      int64_t norm_whole, float eps, const float *cos, const float *sin, int64_t R, int64_t Hq,
                      int64_t Hkv, int64_t D, void *k_cache, void *v_cache, const int64_t *slots, int kind) {
    RopeJob job = {qkv, row, norm_whole, R, Hq, Hkv, D, q_norm, k_norm, cos, sin, eps, slots, k_cache, v_cache,
                   kind, NULL, NULL, NULL, NULL};
    parallel_for(T, T * row * 4, rope_store_rows, &job);
}

/* ---- The int8 KV cache (tally/attention/kv_cache.py, whose arithmetic this repeats): values int8 [slots, Hkv, D],
 * one fp32 scale per (slot, KV head) from that token's own values, so a token's bits do not depend on what was
 * written with it or before it. x [Hkv, D] is one token's K or V for `slot`. */
static void store_q8(const float *x, int8_t *values, float *scales, int64_t slot, int64_t Hkv, int64_t D) {
    for (int64_t h = 0; h < Hkv; h++) {
        const float *xh = x + h * D;
        float amax = 0.0f;
        for (int64_t i = 0; i < D; i++) amax = fmaxf(amax, fabsf(xh[i]));
        float s = fmaxf(amax / 127.0f, 1e-12f);
        int8_t *dst = values + (slot * Hkv + h) * D;
        for (int64_t i = 0; i < D; i++) dst[i] = (int8_t)lrintf(xh[i] / s);
        scales[slot * Hkv + h] = s;
    }
}

static void rope_store_q8_rows(const void *job, int64_t t0, int64_t t1) {
    const RopeJob *j = job;
    int64_t Hq = j->Hq, Hkv = j->Hkv, D = j->D;
    for (int64_t t = t0; t < t1; t++) {
        qk_prepare(j, t);
        float *qt = j->qkv + t * j->row, *kt = qt + Hq * D, *vt = kt + Hkv * D;
        if (j->key_scale) {
            for (int64_t i = 0; i < Hq * D; i++) qt[i] *= j->query_scale[i];
            for (int64_t i = 0; i < Hkv * D; i++) kt[i] *= j->key_scale[i];
        }
        store_q8(kt, j->k_cache, j->k_scales, j->slots[t], Hkv, D);
        store_q8(vt, j->v_cache, j->v_scales, j->slots[t], Hkv, D);
    }
}

/* tally_rope_store's work into the int8 cache: norms and rotary, then with key smoothing (query_scale [Hq, D],
 * key_scale [Hkv, D], or NULL) q and k scaled, then k and v quantized into their slots (values [slots, Hkv, D],
 * scales [slots, Hkv]) */
void tally_rope_store_q8(float *qkv, int64_t T, int64_t row, const float *q_norm, const float *k_norm,
                         int64_t norm_whole, float eps, const float *cos, const float *sin, int64_t R, int64_t Hq,
                         int64_t Hkv, int64_t D, const float *query_scale, const float *key_scale, int8_t *k_values,
                         int8_t *v_values, float *k_scales, float *v_scales, const int64_t *slots) {
    RopeJob job = {qkv, row, norm_whole, R, Hq, Hkv, D, q_norm, k_norm, cos, sin, eps, slots, k_values, v_values,
                   KV_I8, query_scale, key_scale, k_scales, v_scales};
    parallel_for(T, T * row * 4, rope_store_q8_rows, &job);
}

/* y[0..n) = cap * tanh(x / cap), in place where y == x (Gemma 2's soft-capped scores and logits) */
static void softcap_values(const float *x, float *y, int64_t n, float cap) {
    const __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(tanh256(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv)), c));
    for (; i < n; i++) y[i] = tanhf(x[i] / cap) * cap;
}

/* softcap_values row by row (x, y [M, N]): which of a row's values take the scalar tail never depends on the rows
 * beside it (Gemma 2's logits, the same bits in the one-call step and layer by layer) */
void tally_softcap_rows(const float *x, float *y, int64_t M, int64_t N, float cap) {
    for (int64_t r = 0; r < M; r++) softcap_values(x + r * N, y + r * N, N, cap);
}

#include "gated.h"  /* act(gate) * up: tally_gated_mul */

/* ---- Memory read rate: the roofline benchmarks hold decode against (benchmarks/decode_roofline.py). torch's sum is
 * limited by its arithmetic, well below plain loads' rate: a roofline below what Tally's own kernels stream
 * (docs/benchmarks.md#decode-roofline). Here each chunk's bytes are xor-folded into its own slot of `out` (so no
 * load can be dropped), on the kernels' own threads. */
#define READ_CHUNK ((int64_t)256 << 10)
typedef struct { const uint8_t *p; int64_t n; int64_t *out; } ReadJob;

static void read_chunks(const void *ctx, int64_t c0, int64_t c1) {
    const ReadJob *j = ctx;
    for (int64_t c = c0; c < c1; c++) {
        const uint8_t *p = j->p + c * READ_CHUNK;
        int64_t len = j->n - c * READ_CHUNK < READ_CHUNK ? j->n - c * READ_CHUNK : READ_CHUNK, i = 0;
        __m256i a = _mm256_setzero_si256(), b = a, e = a, f = a;
        for (; i + 128 <= len; i += 128) {
            a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(p + i)));
            b = _mm256_xor_si256(b, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
            e = _mm256_xor_si256(e, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
            f = _mm256_xor_si256(f, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
        }
        int64_t tail = 0;
        for (; i < len; i++) tail ^= p[i];
        __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(e, f));
        j->out[c] = _mm256_extract_epi64(x, 0) ^ _mm256_extract_epi64(x, 1) ^ _mm256_extract_epi64(x, 2) ^
                    _mm256_extract_epi64(x, 3) ^ tail;
    }
}

void tally_read_bytes(const uint8_t *p, int64_t n, int64_t *out) {  /* out: one slot per READ_CHUNK bytes */
    ReadJob job = {p, n, out};
    parallel_for((n + READ_CHUNK - 1) / READ_CHUNK, n, read_chunks, &job);
}

#include "sampling.h"  /* the sampler's kernels: argmax, a draw at one uniform, top-k, logsumexp */

#include "decode_attention.h"  /* decode_attention: paged attention of one query token a row */

void tally_decode_attention(const float *q, int64_t q_stride, const void *k_cache, const void *v_cache, int kind,
                            const int64_t *block_tables, int64_t bt_stride, const int64_t *ctx, int64_t n,
                            int64_t Hq, int64_t Hkv, int64_t D, int64_t block_size, int64_t window, float scale,
                            float softcap, const float *sinks, float *out) {
    decode_attention(q, q_stride, k_cache, v_cache, kind, NULL, NULL, block_tables, bt_stride, ctx, n, Hq, Hkv, D,
                     block_size, window, scale, softcap, sinks, out);
}

/* the same over the int8 KV cache: values int8, scales fp32 [slots, Hkv] (tally/attention/kv_cache.py) */
void tally_decode_attention_q8(const float *q, int64_t q_stride, const int8_t *k_cache, const int8_t *v_cache,
                               const float *k_scales, const float *v_scales, const int64_t *block_tables,
                               int64_t bt_stride, const int64_t *ctx, int64_t n, int64_t Hq, int64_t Hkv, int64_t D,
                               int64_t block_size, int64_t window, float scale, float softcap, const float *sinks,
                               float *out) {
    decode_attention(q, q_stride, k_cache, v_cache, KV_I8, k_scales, v_scales, block_tables, bt_stride, ctx, n, Hq,
                     Hkv, D, block_size, window, scale, softcap, sinks, out);
}

#include "prefill_attention.h"  /* prefill_attention: causal attention of a prompt's rows of one sequence */

void tally_prefill_attention(const float *q, int64_t q_stride, const void *k_cache, const void *v_cache, int kind,
                             const int64_t *block_table, int64_t n, int64_t first_pos, int64_t Hq, int64_t Hkv,
                             int64_t D, int64_t block_size, int64_t window, float scale, float softcap,
                             const float *sinks, float *out) {
    prefill_attention(q, q_stride, k_cache, v_cache, kind, block_table, n, first_pos, Hq, Hkv, D, block_size, window,
                      scale, softcap, sinks, out);
}

/* ---- A whole decode step through every layer, in one call ---------------------------------------------
 * For decode-only steps of models whose projections all have native formats: per layer the same sequence as
 * DecoderLayer._forward_native (norm, qkv, q/k norms, rotary + cache write, paged attention, o, its output norm,
 * into the residual, norm, gate/up, the gated activation, down, or the experts (experts.h), its output norm, into
 * the residual), with no interpreter between the steps; each family's traits are fields below. The Python side
 * (tally/models/native_decode_step.py) fills these structs once, from the loaded model's tensors. */
#include "project.h"  /* Proj, project(): a projection in any native format */
#include "lora_delta.h"  /* LoRA adapters' per-row deltas after a projection */
#include "experts.h"  /* a mixture of experts' MLP: routing, and each expert's rows through its projections */

typedef struct {
    const float *input_norm, *post_norm;        /* before attention and before the MLP; NULL: none (OLMo 2) */
    const float *attn_out_norm, *mlp_out_norm;  /* of each block's output before the residual add; NULL: none */
    const float *q_norm, *k_norm;               /* before the rotation (Model.qk_norm_whole says over what); or NULL */
    const float *cos, *sin;                     /* this layer's rotary table [positions, rotary_dim]; NULL: none */
    int64_t window;                             /* sliding window in keys; 0: full attention */
    const float *sinks;                         /* [heads] the softmaxes' sink logits (GPT-OSS); NULL: none */
    Proj qkv, o, gate_up, down;
    void *k_cache, *v_cache;
    int64_t kv_kind;                        /* the caches' format (kv_rows.h) */
    float *k_scales, *v_scales;             /* int8 KV cache: [slots, Hkv]; NULL otherwise */
    const float *key_scale, *query_scale;   /* int8 KV key smoothing: k *= [Hkv, D], q *= [Hq, D]; or NULL */
    const void *experts;  /* an Experts (experts.h): a mixture of experts in place of gate_up and down; or NULL */
} Layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size;
    int64_t rotary_dim, qk_norm_whole, activation;  /* rotated dims of a head; q/k norms over all heads; ACT_* */
    float scale, eps;
    float softcap;              /* attention scores' soft cap (Gemma 2); 0: none */
    float embedding_multiplier, residual_multiplier;  /* the looked-up embeddings', each block output's (Granite) */
    float logits_scaling, final_softcap;  /* logits / logits_scaling (Granite), then soft-capped (Gemma 2; 0: none) */
    float swiglu_alpha, swiglu_limit;     /* ACT_CLAMPED_SWIGLU's (GPT-OSS) */
    const Layer *layers;
    const float *final_norm;  /* with `head` (kind 0: none), a step can end in the logits */
    Proj head;
    Proj embed;               /* the token table as int4 / int8 rows (kind 0: the caller embeds) */
    const void *lora;         /* a Lora (lora_delta.h): the step's adapters, set for a step that has them; or NULL */
} Model;

int64_t tally_dequant_q4_rows(const uint8_t *qs, const uint8_t *qh, const void *d, const void *m, const int64_t *rows,
                              int64_t n_rows, int64_t table_rows, int64_t K, int64_t group, int64_t bits,
                              int scale_form, float *out);
int64_t tally_dequant_q8_rows(const int8_t *q, const void *s, const int64_t *rows, int64_t n_rows, int64_t table_rows,
                              int64_t K, int64_t group, int scale_form, float *out);

/* h += block(x) (times the residual multiplier, after the block output's norm where there is one): straight into
 * h where neither applies, else through `out` [n, hidden], in the order the PyTorch layer computes it */
static void add_output(const Model *md, float *out, const float *norm, float *h, int64_t n);

static void add_block(const Model *md, const Proj *p, int64_t site, const float *x, const float *norm, float *out,
                      float *h, int64_t n) {
    const Lora *lora = md->lora;
    int delta = lora && site < lora->layers * LORA_SITES && lora->sites[site].a;
    if (!norm && md->residual_multiplier == 1.0f && !delta) {
        project(p, x, h, n, 1);
        return;
    }
    project(p, x, out, n, 0);
    if (delta) lora_add(lora, site, x, out, n);  /* the projection's output with its delta, as the layer's */
    add_output(md, out, norm, h, n);
}

/* h += out, after its norm and the residual multiplier where they apply */
static void add_output(const Model *md, float *out, const float *norm, float *h, int64_t n) {
    if (norm) tally_rms_norm(out, norm, out, n, md->hidden, md->eps);
    /* two passes: the product rounded on its own, as PyTorch's, not contracted into the add (a multiply-add) */
    if (md->residual_multiplier != 1.0f)
        for (int64_t i = 0; i < n * md->hidden; i++) out[i] *= md->residual_multiplier;
    for (int64_t i = 0; i < n * md->hidden; i++) h[i] += out[i];
}

/* h [n, hidden] (the embeddings in, the last layer's output out, in place); with `ids` [n] (the model has an
 * `embed` table) the call looks the embeddings up itself; positions, slots [n]; block_tables [>= n, bt_stride];
 * ctx [n]. With `logits` (the model has a head): logits [m, head.n] of the rows logit_rows [m] of h, final norm and
 * LM head included. Both keep the interpreter out of the step: after the weights' stream every Python and torch
 * call starts from cold caches, many times slower than warm. Returns -1, having run nothing, when an id lies outside
 * the table; else 0. */
int64_t tally_decode_layers(const Model *md, float *h, int64_t n, const int64_t *ids, const int64_t *positions,
                            const int64_t *slots, const int64_t *block_tables, int64_t bt_stride, const int64_t *ctx,
                            const int64_t *logit_rows, int64_t m, float *logits) {
    if (ids) {
        const Proj *e = &md->embed;
        int64_t status = e->kind == PROJ_Q4
            ? tally_dequant_q4_rows(e->w, e->high, e->scale, e->min, ids, n, e->n, e->k, e->group, e->bits,
                                    (int)e->scale_form, h)
            : tally_dequant_q8_rows(e->w, e->scale, ids, n, e->n, e->k, e->group, (int)e->scale_form, h);
        if (status < 0) return status;
    }
    int64_t H = md->hidden, D = md->head_dim, R = md->rotary_dim, q_size = md->heads * D;
    int64_t row = (md->heads + 2 * md->kv_heads) * D, I = md->intermediate;
    if (ids && md->embedding_multiplier != 1.0f)
        for (int64_t i = 0; i < n * H; i++) h[i] *= md->embedding_multiplier;
    float *x = malloc(sizeof(float) * n * H), *out = malloc(sizeof(float) * n * H);
    float *qkv = malloc(sizeof(float) * n * row), *att = malloc(sizeof(float) * n * q_size);
    float *gu = malloc(sizeof(float) * n * 2 * I), *act = malloc(sizeof(float) * n * I);
    float *cos = malloc(sizeof(float) * n * R), *sin = malloc(sizeof(float) * n * R);
    const float *table = NULL;  /* the rotary table cos and sin hold this step's rows of */
    for (int64_t l = 0; l < md->num_layers; l++) {
        const Layer *L = md->layers + l;
        if (L->cos && L->cos != table) {
            for (int64_t t = 0; t < n; t++) {
                memcpy(cos + t * R, L->cos + positions[t] * R, sizeof(float) * R);
                memcpy(sin + t * R, L->sin + positions[t] * R, sizeof(float) * R);
            }
            table = L->cos;
        }
        const float *c = L->cos ? cos : NULL, *s = L->cos ? sin : NULL;
        if (L->input_norm) tally_rms_norm(h, L->input_norm, x, n, H, md->eps);
        project(&L->qkv, L->input_norm ? x : h, qkv, n, 0);
        lora_add(md->lora, l * LORA_SITES + LORA_QKV, L->input_norm ? x : h, qkv, n);
        if (L->kv_kind == KV_I8) {
            tally_rope_store_q8(qkv, n, row, L->q_norm, L->k_norm, md->qk_norm_whole, md->eps, c, s, R, md->heads,
                                md->kv_heads, D, L->query_scale, L->key_scale, L->k_cache, L->v_cache, L->k_scales,
                                L->v_scales, slots);
        } else {
            tally_rope_store(qkv, n, row, L->q_norm, L->k_norm, md->qk_norm_whole, md->eps, c, s, R, md->heads,
                             md->kv_heads, D, L->k_cache, L->v_cache, slots, (int)L->kv_kind);
        }
        decode_attention(qkv, row, L->k_cache, L->v_cache, (int)L->kv_kind, L->k_scales, L->v_scales, block_tables,
                         bt_stride, ctx, n, md->heads, md->kv_heads, D, md->block_size, L->window, md->scale,
                         md->softcap, L->sinks, att);
        add_block(md, &L->o, l * LORA_SITES + LORA_O, att, L->attn_out_norm, out, h, n);
        if (L->post_norm) tally_rms_norm(h, L->post_norm, x, n, H, md->eps);
        if (L->experts) {
            tally_experts(L->experts, L->post_norm ? x : h, n, out);
            add_output(md, out, L->mlp_out_norm, h, n);
            continue;
        }
        project(&L->gate_up, L->post_norm ? x : h, gu, n, 0);
        lora_add(md->lora, l * LORA_SITES + LORA_GATE_UP, L->post_norm ? x : h, gu, n);
        tally_gated_mul(gu, act, n, I, (int)md->activation, md->swiglu_alpha, md->swiglu_limit);
        add_block(md, &L->down, l * LORA_SITES + LORA_DOWN, act, L->mlp_out_norm, out, h, n);
    }
    if (logits && m > 0) {
        float *rows = malloc(sizeof(float) * m * H);
        for (int64_t i = 0; i < m; i++) memcpy(rows + i * H, h + logit_rows[i] * H, sizeof(float) * H);
        tally_rms_norm(rows, md->final_norm, rows, m, H, md->eps);
        project(&md->head, rows, logits, m, 0);
        free(rows);
        int64_t V = md->head.n;
        if (md->logits_scaling != 1.0f)
            for (int64_t i = 0; i < m * V; i++) logits[i] /= md->logits_scaling;
        if (md->final_softcap > 0) tally_softcap_rows(logits, logits, m, V, md->final_softcap);
    }
    free(x); free(qkv); free(out); free(att); free(gu); free(act); free(cos); free(sin);
    return 0;
}

/* Up to `steps` greedy decode steps of n rows in one call (the engine's multi-step decode: tally/engine/multi_step.py).
 * Each step is tally_decode_layers from the token ids to the logits; each row's argmax (torch.argmax's: the first
 * maximum, or the first NaN) is its next token, one position on, its KV slot found in its block table. ids,
 * positions, ctx [n] as the first step takes them (left unchanged); out [n, steps]. A row is done once it makes one
 * of its stop ids (row r's: stop_ids[stop_at[r] .. stop_at[r + 1]]), and the call ends after the step where every
 * row is: what would follow is dropped anyway. Needs the model's token table and head. Returns the steps run, or
 * -1 as tally_decode_layers. Why: a step that returns to the interpreter pays its scheduling, inputs, sampling and
 * outputs, from cold caches; here they are paid once a call. */
int64_t tally_decode_greedy(const Model *md, int64_t n, const int64_t *ids, const int64_t *positions,
                            const int64_t *block_tables, int64_t bt_stride, const int64_t *ctx, int64_t steps,
                            const int64_t *stop_ids, const int64_t *stop_at, int64_t *out) {
    int64_t V = md->head.n, bs = md->block_size, ran = 0, done = 0;
    int64_t *state = malloc(sizeof(int64_t) * 7 * n);
    int64_t *cur = state, *pos = cur + n, *lens = pos + n, *slots = lens + n, *rows = slots + n, *best = rows + n;
    int64_t *stopped = best + n;
    float *h = malloc(sizeof(float) * n * md->hidden), *logits = malloc(sizeof(float) * n * V);
    memcpy(cur, ids, sizeof(int64_t) * n);
    memcpy(pos, positions, sizeof(int64_t) * n);
    memcpy(lens, ctx, sizeof(int64_t) * n);
    for (int64_t r = 0; r < n; r++) rows[r] = r, stopped[r] = 0;
    while (ran < steps && done < n) {
        for (int64_t r = 0; r < n; r++) slots[r] = block_tables[r * bt_stride + pos[r] / bs] * bs + pos[r] % bs;
        if (tally_decode_layers(md, h, n, cur, pos, slots, block_tables, bt_stride, lens, rows, n, logits) < 0) {
            ran = -1;
            break;
        }
        tally_argmax_rows(logits, n, V, best);
        for (int64_t r = 0; r < n; r++) {
            if (best[r] < 0) {  /* a NaN in the row: torch.argmax's answer is the first one */
                const float *row = logits + r * V;
                best[r] = 0;
                while (!isnan(row[best[r]])) best[r]++;
            }
            cur[r] = out[r * steps + ran] = best[r];
            pos[r]++;
            lens[r]++;
            for (int64_t i = stop_at[r]; i < stop_at[r + 1] && !stopped[r]; i++)
                if (stop_ids[i] == best[r]) stopped[r] = 1, done++;
        }
        ran++;
    }
    free(state); free(h); free(logits);
    return ran;
}

/* ---- Dequantizing to bf16 for a dense matmul: the many-token path of the integer and fp16 layers ----
 * Where the CPU multiplies bf16 many times faster than the integer kernels work (AVX-512 BF16, AMX), a prompt's
 * rows go through a bf16 matmul over weights dequantized per call, a few tiles at a time (no second copy).
 * Out: W rows [8 (t1 - t0), K] (16 for f16 panels), bf16 bits, rounded to nearest even. */

typedef struct {  /* one dequantization: tiles (panels) of the stored weights, bf16 out */
    const void *q;
    const uint8_t *qh;
    GroupValues d, m;
    uint16_t *w;
    int64_t K, group, bits, n;
} DequantJob;

/* Chunk c of tile t (nibble formats: k = 8c..8c+7, the bits above the nibbles or-ed in; LUT4: the values the nibbles
 * index) as fp32 integers, v[j] output j's 8 values in k order */
static inline __attribute__((always_inline)) void q4_chunk_values(const uint8_t *qs, const uint8_t *qh, int64_t t,
                                                                  int64_t c, int64_t K, int64_t bits, __m256 v[TILE]) {
    /* 32 bytes: byte 4j + i holds (output j, k 8c + i) low and (j, 8c + 4 + i) high */
    __m256i b = _mm256_loadu_si256((const __m256i *)(qs + (t * (K / 8) + c) * 32));
    __m256i lo = _mm256_and_si256(b, _mm256_set1_epi8(15));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(15));
    if (bits == LUT4) {  /* the indices' int8 values from the table (qh), signed from here on */
        __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qh));
        lo = _mm256_shuffle_epi8(table, lo);
        hi = _mm256_shuffle_epi8(table, hi);
    } else if (bits > 4) {
        const uint8_t *planes = qh + (t * (K / 32) + c / 4) * 32 * (bits - 4);
        __m256i p4 = _mm256_loadu_si256((const __m256i *)planes);
        __m256i p5 = bits > 5 ? _mm256_loadu_si256((const __m256i *)(planes + 32)) : p4;
        lo = _mm256_or_si256(lo, chunk_high_bits(p4, p5, (int)(c % 4), 0, (int)bits));
        hi = _mm256_or_si256(hi, chunk_high_bits(p4, p5, (int)(c % 4), 1, (int)bits));
    }
    /* per 128-bit lane, 4-byte units: lo j, hi j side by side = output j's 8 k in order */
    const __m256i halves[2] = {_mm256_unpacklo_epi32(lo, hi), _mm256_unpackhi_epi32(lo, hi)};
    for (int h = 0; h < 2; h++)
        for (int lane = 0; lane < 2; lane++) {
            __m128i part = lane ? _mm256_extracti128_si256(halves[h], 1) : _mm256_castsi256_si128(halves[h]);
            for (int u = 0; u < 2; u++) {  /* unpacklo: units 0,1 of the lane; unpackhi: 2,3 */
                __m128i bytes = u ? _mm_srli_si128(part, 8) : part;
                v[lane * 4 + h * 2 + u] = _mm256_cvtepi32_ps(bits == LUT4 ? _mm256_cvtepi8_epi32(bytes)
                                                                          : _mm256_cvtepu8_epi32(bytes));
            }
        }
}

/* Chunks c, c + 1 of int8 tile t (k = 4c..4c+7) as fp32, v[j] output j's 8 values in k order */
static inline __attribute__((always_inline)) void q8_chunk_values(const int8_t *q, int64_t t, int64_t c, int64_t K,
                                                                  __m256 v[TILE]) {
    /* byte 4j + i holds (output j, k 4c + i); the two chunks side by side: output j's 8 k */
    const int8_t *base = q + (t * (K / 4) + c) * 32;
    __m256i a = _mm256_loadu_si256((const __m256i *)base);
    __m256i b = _mm256_loadu_si256((const __m256i *)(base + 32));
    const __m256i halves[2] = {_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b)};
    for (int h = 0; h < 2; h++)
        for (int lane = 0; lane < 2; lane++) {
            __m128i part = lane ? _mm256_extracti128_si256(halves[h], 1) : _mm256_castsi256_si128(halves[h]);
            for (int u = 0; u < 2; u++)
                v[lane * 4 + h * 2 + u] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(u ? _mm_srli_si128(part, 8) : part));
        }
}

/* A group's 8 outputs' scales and minima (int5 / int6: -2^(bits - 1) d, not stored; LUT4: none), any form */
static inline void group_values(GroupValues d, GroupValues m, int64_t i, int64_t bits, float ds[TILE], float ms[TILE]) {
    __m256 dv = values8(d, i);  /* values8: one address a group */
    _mm256_storeu_ps(ds, dv);
    _mm256_storeu_ps(ms, m.v ? values8(m, i) : bits == LUT4 ? _mm256_setzero_ps()
                                             : _mm256_mul_ps(dv, _mm256_set1_ps(-(float)(1 << (bits - 1)))));
}

static void dequant_q4_tiles(const void *job, int64_t t0, int64_t t1) {
    const DequantJob *j = job;
    int64_t K = j->K, group = j->group, G = K / group;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t g = 0; g < G; g++) {
            float ds[TILE], ms[TILE];
            group_values(j->d, j->m, (t * G + g) * TILE, j->bits, ds, ms);
            for (int64_t c = g * group / 8; c < (g + 1) * group / 8; c++) {
                __m256 v[TILE];
                q4_chunk_values(j->q, j->qh, t, c, K, j->bits, v);
                for (int o = 0; o < TILE; o++)
                    store_bf16x8(j->w + (t * TILE + o) * K + 8 * c,
                                 _mm256_fmadd_ps(v[o], _mm256_set1_ps(ds[o]), _mm256_set1_ps(ms[o])));
            }
        }
}

static void dequant_q8_tiles(const void *job, int64_t t0, int64_t t1) {
    const DequantJob *j = job;
    int64_t K = j->K, group = j->group, G = K / group;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t g = 0; g < G; g++) {
            float ss[TILE];
            _mm256_storeu_ps(ss, values8(j->d, (t * G + g) * TILE));
            for (int64_t c = g * group / 4; c < (g + 1) * group / 4; c += 2) {
                __m256 v[TILE];
                q8_chunk_values(j->q, t, c, K, v);
                for (int o = 0; o < TILE; o++)
                    store_bf16x8(j->w + (t * TILE + o) * K + 4 * c, _mm256_mul_ps(v[o], _mm256_set1_ps(ss[o])));
            }
        }
}

static void dequant_f16_rows(const void *job, int64_t k0, int64_t k1) {
    /* out W^T [K, 16 P]: each (panel, k) holds 16 outputs side by side, so rows copy across whole */
    const DequantJob *j = job;
    const uint16_t *panels = j->q;
    uint16_t *w_t = j->w;
    int64_t K = j->K, n_panels = j->n, n = n_panels * 16;
    for (int64_t k = k0; k < k1; k++)
        for (int64_t p = 0; p < n_panels; p++) {
            const uint16_t *src = panels + (p * K + k) * 16;
            for (int h = 0; h < 2; h++)
                store_bf16x8(w_t + k * n + p * 16 + 8 * h,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 8 * h))));
        }
}

void tally_dequant_q4_bf16(const uint8_t *qs, const uint8_t *qh, const void *d, const void *m, uint16_t *w,
                           int64_t n_tiles, int64_t K, int64_t group, int64_t bits, int scale_form) {  /* as gemm_q4 */
    DequantJob job = {qs, qh, {d, scale_form}, {m, scale_form}, w, K, group, bits, n_tiles};
    parallel_for_then(n_tiles, n_tiles * K * TILE, dequant_q4_tiles, &job, 0);
}

void tally_dequant_q8_bf16(const int8_t *q, const void *s, uint16_t *w, int64_t n_tiles, int64_t K,
                           int64_t group, int scale_form) {
    DequantJob job = {q, NULL, {s, scale_form}, {NULL, 0}, w, K, group, 8, n_tiles};
    parallel_for_then(n_tiles, n_tiles * K * TILE, dequant_q8_tiles, &job, 0);
}

void tally_dequant_f16_bf16(const uint16_t *panels, uint16_t *w_t, int64_t n_panels, int64_t K) {
    DequantJob job = {panels, NULL, {NULL, 0}, {NULL, 0}, w_t, K, 0, 16, n_panels};
    parallel_for_then(K, n_panels * K * 16, dequant_f16_rows, &job, 0);
}

/* ---- Rows of the dequantized weight in fp32, out [n_rows, K]: a token table read from its tiles (an embedding
 * lookup, one row a token). q * d + m in two roundings, as the PyTorch expression these replace (many small tensor
 * operations a decode step; tests/test_native_kernels.py holds them to it). A row outside the
 * table's `table_rows` (tiles x 8) writes nothing and returns -1, where the PyTorch indexing raised. ---- */
static int rows_outside(const int64_t *rows, int64_t n_rows, int64_t table_rows) {
    for (int64_t r = 0; r < n_rows; r++)
        if (rows[r] < 0 || rows[r] >= table_rows) return 1;
    return 0;
}

int64_t tally_dequant_q4_rows(const uint8_t *qs, const uint8_t *qh, const void *d, const void *m, const int64_t *rows,
                              int64_t n_rows, int64_t table_rows, int64_t K, int64_t group, int64_t bits,
                              int scale_form, float *out) {
    if (rows_outside(rows, n_rows, table_rows)) return -1;
    GroupValues dv = {d, scale_form}, mv = {m, scale_form};
    int64_t G = K / group;
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t t = rows[r] / TILE, o = rows[r] % TILE;
        for (int64_t g = 0; g < G; g++) {
            float ds[TILE], ms[TILE];
            group_values(dv, mv, (t * G + g) * TILE, bits, ds, ms);
            for (int64_t c = g * group / 8; c < (g + 1) * group / 8; c++) {
                __m256 v[TILE];
                q4_chunk_values(qs, qh, t, c, K, bits, v);
                _mm256_storeu_ps(out + r * K + 8 * c, _mm256_add_ps(_mm256_mul_ps(v[o], _mm256_set1_ps(ds[o])),
                                                                    _mm256_set1_ps(ms[o])));
            }
        }
    }
    return 0;
}

int64_t tally_dequant_q8_rows(const int8_t *q, const void *s, const int64_t *rows, int64_t n_rows, int64_t table_rows,
                              int64_t K, int64_t group, int scale_form, float *out) {
    if (rows_outside(rows, n_rows, table_rows)) return -1;
    GroupValues sv = {s, scale_form};
    int64_t G = K / group;
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t t = rows[r] / TILE, o = rows[r] % TILE;
        for (int64_t g = 0; g < G; g++) {
            float ss[TILE];
            _mm256_storeu_ps(ss, values8(sv, (t * G + g) * TILE));
            for (int64_t c = g * group / 4; c < (g + 1) * group / 4; c += 2) {
                __m256 v[TILE];
                q8_chunk_values(q, t, c, K, v);
                _mm256_storeu_ps(out + r * K + 4 * c, _mm256_mul_ps(v[o], _mm256_set1_ps(ss[o])));
            }
        }
    }
    return 0;
}
