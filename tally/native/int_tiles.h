/* The integer weight formats' projections (int4 with minima, GGUF Q5_0 / Q6_K with planes of high bits, int8):
 * activations rounded to int8 per block of 32 or more, tiles of 8 outputs, and tally_gemm_q4 / tally_gemm_q8.
 * Included by kernels.c after pool.h and its small helpers (store_out); includes int_dots.h: the tiles' layout, byte
 * products. */

/* ---- Activations to int8: x ~ xq * dx, dx per row and block of xblock values ------------------------------
 * The integer kernels below multiply int8 activations by the integer weights with AVX2's byte dot products
 * (32 multiply-adds per instruction), which is what makes them faster than converting every weight to fp32.
 * The scale is per block of `span` values (a job's xblock, activation_block): 32 is llama.cpp's Q8_0 (the 32-block
 * formats' choice), 256 its Q8_K (the K-quants'), K one scale per token (W8A8's dynamic per-token activations); dx
 * holds it once per 32 values either way. Each row is quantized on its own, so a token's result never depends on
 * its batch. */
typedef struct { int8_t *xq; float *dx; } QuantizedRows;

/* In vectors, with the scalar loop's bits (a test holds them to it): the max of |x| is exact in any order, and
 * vmaxps returns its second operand for a NaN first, as fmaxf ignores one; cvtps rounds to nearest even, as lrintf
 * does in the default mode, and |x * inv| <= 127 rounds inside int8, so the saturating packs never clip. The scalar
 * form calls libm's fmaxf and lrintf per value, a large share of a prefill. span: a multiple of 32. */
static void quantize_segments(const float *x, QuantizedRows q, int64_t s0, int64_t s1, int64_t span) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  /* the packs' dwords back in k order */
    for (int64_t s = s0; s < s1; s++) {
        const float *xs = x + s * span;
        __m256 m = _mm256_setzero_ps();
        for (int64_t i = 0; i < span; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xs + i)), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        float dx = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t b = 0; b < span / 32; b++) q.dx[s * (span / 32) + b] = dx;
        const __m256 vinv = _mm256_set1_ps(inv);
        for (int64_t i = 0; i < span; i += 32) {
            __m256i v[4];
            for (int j = 0; j < 4; j++) v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + i + 8 * j), vinv));
            __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(q.xq + s * span + i), _mm256_permutevar8x32_epi32(bytes, order));
        }
    }
}

static inline int32_t sum_i8(const int8_t *p, int64_t n) {  /* n: a multiple of 16 */
    __m128i acc = _mm_setzero_si128();
    for (int64_t i = 0; i < n; i += 16)
        acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(_mm_set1_epi8(1),
                                                                  _mm_loadu_si128((const __m128i *)(p + i))),
                                                _mm_set1_epi16(1)));
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(acc, _mm_shuffle_epi32(acc, _MM_SHUFFLE(2, 3, 0, 1))));
}

#include "int_dots.h"  /* the tile layout (TILE, MR, store_tile), the formats' byte products; AVX-512: int_tile_pair */

/* A product's rows made ready for its tiles, split over the pool's threads by rows (a prompt's rows would otherwise
 * wait on one thread): x to int8 (quantize_segments, a scale per `span`), then per row either (int4, xsum) each
 * group's sum of its values (activation blocks of 32: of its int8 values times their scales; longer blocks: of its
 * int8 values, exact in fp32, the block's scale coming with the dots': dots_into), or (xoff) each span's sum times
 * `offset`. Each row on its own: the same bits. */
typedef struct {
    const float *x;
    QuantizedRows q;
    float *xsum;
    int32_t *xoff;
    int64_t K, span, group, offset;
} RowsJob;

static void prepare_rows(const void *ctx, int64_t r0, int64_t r1) {
    const RowsJob *j = ctx;
    int64_t K = j->K, group = j->group, span = span_of(group);
    quantize_segments(j->x, j->q, r0 * K / j->span, r1 * K / j->span, j->span);
    if (j->xsum) {
        int64_t G = K / group;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t g = 0; g < G; g++) {
                float s = 0;
                for (int64_t k0 = r * K + g * group; k0 < r * K + (g + 1) * group; k0 += span) {
                    float n = (float)sum_i8(j->q.xq + k0, span);
                    s += j->span > 32 ? n : j->q.dx[k0 / 32] * n;
                }
                j->xsum[r * G + g] = s;
            }
    } else if (j->xoff) {
        for (int64_t s = r0 * (K / span); s < r1 * (K / span); s++)
            j->xoff[s] = sum_i8(j->q.xq + s * span, span) * (int32_t)j->offset;
    }
}

/* Rows of x quantized per `span` (and, for a job's group, their sums: RowsJob), threaded from a few rows on */
static void run_rows_job(RowsJob *j, int64_t M) {
    j->q = (QuantizedRows){malloc(M * j->K), malloc(sizeof(float) * M * (j->K / 32))};
    parallel_for(M, M * j->K * 4, prepare_rows, j);  /* ~4 multiply-adds' time a value */
}

#ifdef ONE_ROW_BROADCASTS
/* One row of int8 activations as int8_one_row_dots takes them: per 4 k, the 4 bytes broadcast to 32 and their
 * magnitudes broadcast to 32 (XU_BLOCK bytes a block of 32 k) */
static uint8_t *one_row_broadcasts(const int8_t *x, int64_t K) {
    uint8_t *u = malloc(K / 4 * 64);
    for (int64_t k = 0; k < K; k += 4) {
        __m256i v = broadcast4(x + k);
        _mm256_storeu_si256((__m256i *)(u + k * 16), v);
        _mm256_storeu_si256((__m256i *)(u + k * 16 + 32), _mm256_sign_epi8(v, v));
    }
    return u;
}
#endif

#ifdef TALLY_AVX512
/* x + 128 as unsigned bytes (x in -127..127: 1..255), for byte products whose signed operand is the weight (AVX-512's
 * int8 loops) */
static uint8_t *offset_bytes(const int8_t *x, int64_t n) {  /* n: a multiple of 32 */
    uint8_t *u = malloc(n);
    for (int64_t i = 0; i < n; i += 32)
        _mm256_storeu_si256((__m256i *)(u + i), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x + i)),
                                                                 _mm256_set1_epi8((char)0x80)));
    return u;
}
#endif
#define INT_MB 64  /* activation rows per pass over the weights: their int8 copies stay in L2 */

/* acc[i] += a[i] times row i's scale of the activation block holding block b; a[i] = 0 */
static inline __attribute__((always_inline)) void fold_block(__m256 *acc, __m256 *a, const float *dx, int64_t blocks,
                                                             int64_t b, int mr) {
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) {
        acc[i] = _mm256_fmadd_ps(a[i], _mm256_set1_ps(dx[i * blocks + b]), acc[i]);
        a[i] = _mm256_setzero_ps();
    }
}

/* The float operations of span s (a group's part in block b, `span` values), in this order in every loop of every
 * build. Activation blocks of 32 (`blocked` 0): acc[i] += row i's integer dot times the group's scales sg times the
 * row's block scale. Longer blocks (a K-quant's 256, W8A8's row; `blocked` 1: a constant of the pair and AMX
 * instances, a runtime flag of int_tile's): a[i] += the dot times sg, and where the span ends an activation block
 * acc[i] += a[i] times the row's scale of that block (fold_block): a block of 8 or 16 spans takes its activation
 * scale once, not once a span, whose multiply per span and row is what bounds AMX's tiles
 * (docs/benchmarks.md#kernels); blocks of 32 keep the one multiply-add a span, which few rows' tiles run faster.
 * xoff (formats without minima, else NULL): row i's offsets, one a span of the rows' int8 values, s this span's:
 * IntJob */
static inline __attribute__((always_inline)) void dots_into(__m256 *acc, __m256 *a, __m256i *dot, __m256 sg,
                                                            const float *dx, const int32_t *xoff, int64_t span,
                                                            int64_t s, int64_t K, int64_t b, int64_t xblock,
                                                            int blocked, int mr) {
    if (xoff) {
        _Pragma("GCC unroll 8")
        for (int i = 0; i < mr; i++) dot[i] = _mm256_sub_epi32(dot[i], _mm256_set1_epi32(xoff[i * (K / span) + s]));
    }
    if (!blocked) {
        _Pragma("GCC unroll 8")
        for (int i = 0; i < mr; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]),
                                     _mm256_mul_ps(sg, _mm256_set1_ps(dx[i * (K / 32) + b])), acc[i]);
        return;
    }
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) a[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]), sg, a[i]);
    if (block_ends((s + 1) * span, xblock)) fold_block(acc, a, dx, K / 32, b, mr);
}

/* Block b's dot products over chunks c0..c1 (span s), through dots_into */
static inline __attribute__((always_inline)) void int_block_into(
    __m256 *acc, __m256 *a, __m256 sg, const int8_t *xq, const uint8_t *xu, const float *dx, const int32_t *xoff,
    int64_t span, int64_t s, int64_t K, int64_t b, int64_t xblock, int blocked, const uint8_t *w, const uint8_t *hb,
    int bits, int expanded, int c0, int c1, int mr) {
    int64_t block_bytes = bits == 8 || expanded ? 256 : 128, plane_bytes = bits == 6 ? 64 : bits == 5 ? 32 : 0;
    __m256i dot[MR];
    int_block_dots(xq + b * 32, xu ? xu + b * XU_BLOCK : NULL, K, w + b * block_bytes, hb ? hb + b * plane_bytes : NULL,
                   bits, expanded, c0, c1, mr, dot);
    dots_into(acc, a, dot, sg, dx, xoff, span, s, K, b, xblock, blocked, mr);
}

/* Group g's blocks' dot products times the group's scales sg, through dots_into */
static inline __attribute__((always_inline)) void int_group_into(
    __m256 *acc, __m256 *a, int64_t g, __m256 sg, const int8_t *xq, const uint8_t *xu, const float *dx,
    const int32_t *xoff, int64_t K, int64_t group, int64_t xblock, int blocked, const uint8_t *w, const uint8_t *hb,
    int bits, int expanded, int mr) {
    int64_t group_blocks = group / 32;
    if (group_blocks > 0) {  /* whole blocks, every chunk: constant bounds keep the block's index work small */
        for (int64_t b = g * group_blocks; b < (g + 1) * group_blocks; b++)
            int_block_into(acc, a, sg, xq, xu, dx, xoff, 32, b, K, b, xblock, blocked, w, hb, bits, expanded, 0, 4,
                           mr);
    } else {  /* a group of 16: chunks 0-1 or 2-3 of block g / 2 */
        int c0 = (int)(g & 1) * 2;
        int_block_into(acc, a, sg, xq, xu, dx, xoff, 16, g, K, g / 2, xblock, blocked, w, hb, bits, expanded, c0,
                       c0 + 2, mr);
    }
}

/* (int4) group g's minima mg times the rows' sums (RowsJob: xsum): into acc after the group's dots (activation
 * blocks of 32), or into a before them (longer blocks, within one of which a group lies). Formed where it is
 * added: formed before the blocks, it would hold a register through them and slow the many-row int4 / int6 tiles. */
static inline __attribute__((always_inline)) void int_minima_into(__m256 *into, int64_t g, int64_t G, __m256 mg,
                                                                  const float *xsum, int mr) {
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) into[i] = _mm256_fmadd_ps(mg, _mm256_set1_ps(xsum[i * G + g]), into[i]);
}

#ifdef TALLY_AVX512
/* Groups of 16, block b's two (2b with sg0, 2b + 1 with sg1) from one pass over the block: int_group_into's sums
 * and float operations, in its order for each row */
static inline __attribute__((always_inline)) void int_halves_into(
    __m256 *acc, __m256 *a, __m256 sg0, __m256 sg1, const int8_t *xq, const float *dx, const int32_t *xoff, int64_t K,
    int64_t b, int64_t xblock, int blocked, const uint8_t *w, const uint8_t *hb, int bits, int mr) {
    __m256i dot0[MR], dot1[MR];
    int_block_halves512(xq + b * 32, K, w + b * 128, hb + b * (bits == 6 ? 64 : 32), bits, mr, dot0, dot1);
    dots_into(acc, a, dot0, sg0, dx, xoff, 16, 2 * b, K, b, xblock, blocked, mr);
    dots_into(acc, a, dot1, sg1, dx, xoff, 16, 2 * b + 1, K, b, xblock, blocked, mr);
}
#endif

static inline __attribute__((always_inline)) void int_tile(
    const int8_t *xq, const uint8_t *xu, const float *dx, const float *xsum, const int32_t *xoff, int64_t K,
    int64_t group, const uint8_t *w, const uint8_t *hb, GroupValues scale, GroupValues m, int bits, int expanded,
    int mr, float *y, int64_t N, int64_t t, const float *bias, int accumulate, int runs, int64_t xblock,
    int blocked) {
    int64_t G = K / group;
    __m256 acc[MR], a[MR];  /* the row's sum; (blocked) the activation block's, before its scale: dots_into */
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) acc[i] = a[i] = _mm256_setzero_ps();
#define GROUP_INTO(G_, SG_) \
    int_group_into(acc, a, G_, SG_, xq, xu, dx, xoff, K, group, xblock, blocked, w, hb, bits, expanded, mr)
    if (!runs) {  /* forms 0 and 1 */
        for (int64_t g = 0; g < G; g++) {
            if (blocked && m.v) int_minima_into(a, g, G, plain_values8(m, g * TILE), xsum, mr);
            GROUP_INTO(g, plain_values8(scale, g * TILE));
            if (!blocked && m.v) int_minima_into(acc, g, G, plain_values8(m, g * TILE), xsum, mr);
            /* blocked, acc waits in memory between folds (a super-block apart; no instruction here): kept in
             * registers, it made the many-row AVX2 passes spill a[] and the group's values, whose chains run every
             * block (docs/benchmarks.md#kernels) */
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr && blocked; i++) __asm__ volatile("" : "+m"(acc[i]));
        }
    } else {  /* form P (a K-quant's: blocked): super-blocks, their bases once a run (GroupRun). A constant `runs`
               * keeps one loop per instance: both loops in one instance, or nested, run slower */
        for (int64_t g0 = 0; g0 < G; g0 += scale.form) {
            GroupRun sr = run_at(scale, g0), mr_ = run_at(m, g0);
#ifdef TALLY_AVX512
            if (group == 16 && !m.v && !expanded) {  /* two groups a block: int_halves_into */
                for (int64_t j = 0; j < scale.form; j += 2)
                    int_halves_into(acc, a, run_values8(sr, j), run_values8(sr, j + 1), xq, dx, xoff, K, (g0 + j) / 2,
                                    xblock, blocked, w, hb, bits, mr);
                continue;
            }
#endif
            for (int64_t j = 0; j < scale.form; j++) {
                if (m.v) int_minima_into(a, g0 + j, G, run_values8(mr_, j), xsum, mr);
                GROUP_INTO(g0 + j, run_values8(sr, j));
            }
        }
    }
#undef GROUP_INTO
    store_tile(y, N, t, acc, mr, bias, accumulate);
}

/* One integer product, the argument of its tiles' range function: rows m0..m1 against every tile */
typedef struct {
    const int8_t *xq;
    const uint8_t *xu;             /* int8 beside xq (XU_BLOCK bytes a block): AVX-512 (both loops) xq + 128,
                                    * unsigned; AVX2 at one row of symmetric weights one_row_broadcasts; else NULL */
    const float *dx, *xsum;        /* per row: activation block scales, one a 32 values [K/32]; (int4) per group the
                                    * sum of its values (RowsJob) */
    const int32_t *xoff;           /* per row, without minima (Q4_0, int5, int6, LUT4 with VNNI): per span (a group's
                                    * part in a block), 2^(bits - 1) (LUT4: LUT4_OFFSET) times the sum of its int8
                                    * values, taken off each span's dot */
    const uint8_t *w, *hb;         /* tiles; high-bit planes (int5 / int6), LUT4's table, or NULL */
    GroupValues scale, min;        /* min.v NULL: int8, and w = d * (q - 2^(bits - 1)) */
    const float *bias;
    float *y;
    int64_t K, N, group, m0, m1;
    int64_t xblock;                /* values per activation scale (activation_block): dots_into's fold */
    int accumulate;
} IntJob;

/* int5 / int6 tiles are unpacked once a call (int_dots.h: expand_tile) for jobs of more than EXPAND_ROWS rows, into a
 * buffer on the thread's stack of 8 bytes a k (K <= EXPAND_MAX_K: 128 KB), so that each pass of MR rows does not
 * unpack the planes of high bits again (docs/benchmarks.md#kernels). int4's unpacking is three instructions a chunk:
 * it gains nothing expanded, so it stays. */
#define EXPAND_ROWS MR
#define EXPAND_MAX_K 16384

/* One-row passes (a decode step's) of groups of 32 get the group as a constant: int_tile's block loop and index work
 * then fold away (docs/benchmarks.md#kernels). Groups of 16 gain nothing so; instances per row count would multiply
 * the build's compile time. Full passes of MR rows take `blocked` as a constant too (a many-row K-quant's fp32
 * scales: blocked; the 32-block formats: not): as a runtime flag it held AVX2's a[] in registers, and the 32-block
 * formats' 4-row loop spilled its dots (docs/benchmarks.md#kernels). int8's loop ran no faster so and keeps the flag,
 * as do the shorter passes, whose instances would cost compile time for nothing. `fixed` (a constant) 256: full
 * passes over a K-quant's super-blocks get the group and the activation block as constants too (Q4_K with either form
 * of scales; Q6_K with fp32 ones: with factored ones, 5-63 rows, its constant group ran slower); 32: so do the 32-block
 * formats' (Q4_0 / Q4_1, Q5_0), whose groups are their activation blocks, and so do their passes of 1-3 rows after
 * them (a speculative verify step's 5-7 rows: docs/benchmarks.md#kernels). */
static inline __attribute__((always_inline)) void tile_rows_of(const IntJob *j, int64_t t, int bits, const uint8_t *w,
                                                               const uint8_t *hb, int expanded, int fixed) {
    int64_t K = j->K, G = K / j->group;
    GroupValues d = values_from(j->scale, t * G * TILE), m = values_from(j->min, t * G * TILE);
    for (int64_t r = j->m0; r < j->m1; r += MR) {
        int mr = j->m1 - r < MR ? (int)(j->m1 - r) : MR;
#define INT_TILE_(MR_, GROUP_, RUNS_, XBLOCK_, BLOCKED_) \
    int_tile(j->xq + r * K, j->xu ? j->xu + r * K : NULL, j->dx + r * (K / 32), j->xsum ? j->xsum + r * G : NULL, \
             j->xoff ? j->xoff + r * (K / span_of(GROUP_)) : NULL, K, GROUP_, w, hb, d, m, bits, expanded, MR_, \
             j->y + r * j->N, j->N, t, j->bias, j->accumulate, RUNS_, XBLOCK_, BLOCKED_)
#define INT_TILE(MR_, GROUP_) \
    do { if (d.form >= 2) INT_TILE_(MR_, GROUP_, 1, j->xblock, 1); \
         else if ((MR_) < MR || bits == 8) INT_TILE_(MR_, GROUP_, 0, j->xblock, j->xblock > 32); \
         else if (j->xblock > 32) INT_TILE_(MR_, GROUP_, 0, j->xblock, 1); \
         else INT_TILE_(MR_, GROUP_, 0, j->xblock, 0); } while (0)
        int k_pass = fixed == 256 && j->xblock == 256;  /* a K-quant's super-block: 8 groups of 32 or 16 of 16 */
        int block32 = fixed == 32 && j->xblock == 32 && j->group == 32 && d.form < 2;  /* a 32-block format's */
        switch (mr) {
            case 4:
                if (k_pass && j->group == 32 && d.form >= 2) INT_TILE_(MR, 32, 1, 256, 1);
                else if (k_pass && j->group == 32) INT_TILE_(MR, 32, 0, 256, 1);
                else if (k_pass && j->group == 16 && d.form < 2) INT_TILE_(MR, 16, 0, 256, 1);
                else if (block32) INT_TILE_(MR, 32, 0, 32, 0);
                else INT_TILE(4, j->group);
                break;
            case 3:
                if (block32) INT_TILE_(3, 32, 0, 32, 0);
                else INT_TILE(3, j->group);
                break;
            case 2:
                if (block32) INT_TILE_(2, 32, 0, 32, 0);
                else INT_TILE(2, j->group);
                break;
            default:
                if (block32) INT_TILE_(1, 32, 0, 32, 0);
                else if (j->group == 32) INT_TILE(1, 32);
                else INT_TILE(1, j->group);
                break;
        }
#undef INT_TILE
#undef INT_TILE_
    }
}

/* The unpacked tiles' passes (int5, int6; Q6_K's with fp32 scales apart) and int4's full passes with constant groups
 * (K-quants, 32-block formats) in functions of their own, as the pairs' (unpacked_pair_rows5): inlined beside the
 * stored tiles' loop, or one beside the other, GCC's code for them shifts with edits elsewhere (Q4_K lost ~5% beside
 * the 32-block instance) */
static __attribute__((noinline)) void unpacked_tile_rows5(const IntJob *j, int64_t t, const uint8_t *v) {
    tile_rows_of(j, t, 5, v, NULL, 1, 32);
}

static __attribute__((noinline)) void unpacked_tile_rows6(const IntJob *j, int64_t t, const uint8_t *v) {
    tile_rows_of(j, t, 6, v, NULL, 1, 0);
}

static __attribute__((noinline)) void unpacked_k_tile_rows6(const IntJob *j, int64_t t, const uint8_t *v) {
    tile_rows_of(j, t, 6, v, NULL, 1, 256);
}

static __attribute__((noinline)) void block32_tile_rows4(const IntJob *j, int64_t t, const uint8_t *w) {
    tile_rows_of(j, t, 4, w, NULL, 0, 32);
}

static __attribute__((noinline)) void k_tile_rows4(const IntJob *j, int64_t t, const uint8_t *w) {
    tile_rows_of(j, t, 4, w, NULL, 0, 256);
}

#if !defined(TALLY_AVX512) && !defined(TALLY_VNNI)
/* int8 weights within +-16, as a GGUF's Q5_0 rows widened beside Q8_0 ones (tally/quant/gguf_blocks.py:
 * concat_blocks): a block's 8 byte products of a row add up in int16 (8 * 2 * 16 * 127 = 32512) before one widening,
 * where wider weights widen each (maddubs and madd take one port of a Zen 1 core: docs/benchmarks.md#kernels). Each
 * tile is checked once a pass of many rows, whose unpacking it costs a fraction of; the same integer sums, so the
 * same bits. */
#define NARROW_INT8 16
static int narrow_int8_tile(const uint8_t *w, int64_t K) {
    __m256i most = _mm256_setzero_si256();
    for (int64_t i = 0; i < TILE * K; i += 32)
        most = _mm256_max_epu8(most, _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(w + i))));
    __m256i within = _mm256_cmpeq_epi8(_mm256_max_epu8(most, _mm256_set1_epi8(NARROW_INT8)),
                                       _mm256_set1_epi8(NARROW_INT8));
    return _mm256_movemask_epi8(within) == -1;
}

static __attribute__((noinline)) void narrow_int8_tile_rows(const IntJob *j, int64_t t, const uint8_t *w) {
    tile_rows_of(j, t, 8, w, NULL, 1, 0);
}
#endif

static inline __attribute__((always_inline)) void tile_rows(const IntJob *j, int64_t t, int bits) {  /* int_tile */
    int64_t K = j->K, tile_bytes = bits == 8 ? TILE * K : TILE * K / 2;
    const uint8_t *w = j->w + t * tile_bytes, *hb = j->hb && bits > 4 ? j->hb + t * K * (bits - 4) : j->hb;
#if !defined(TALLY_AVX512) && !defined(TALLY_VNNI)
    if (bits == 8 && j->m1 - j->m0 > EXPAND_ROWS && narrow_int8_tile(w, K)) {
        narrow_int8_tile_rows(j, t, w);
        return;
    }
#endif
    if (bits > 4 && bits < 8 && j->m1 - j->m0 > EXPAND_ROWS && K <= EXPAND_MAX_K) {
        uint8_t values[TILE * K] __attribute__((aligned(32)));
        expand_tile(w, hb, K, bits, values);
        if (bits == 5) unpacked_tile_rows5(j, t, values);
        else if (j->xblock == 256 && j->scale.form < 2) unpacked_k_tile_rows6(j, t, values);
        else unpacked_tile_rows6(j, t, values);
    } else if (bits == 4 && j->xblock == 32 && j->m1 - j->m0 >= MR) {
        block32_tile_rows4(j, t, w);
    } else if (bits == 4 && j->xblock == 256 && j->m1 - j->m0 >= MR) {
        k_tile_rows4(j, t, w);
    } else {
        tile_rows_of(j, t, bits, w, hb, 0, 0);
    }
}

static inline __attribute__((always_inline)) void int_tiles(const IntJob *j, int64_t t0, int64_t t1, int bits) {
    for (int64_t t = t0; t < t1; t++) tile_rows(j, t, bits);
}

static void q4_tiles(const void *j, int64_t t0, int64_t t1) { int_tiles(j, t0, t1, 4); }
static void q5_tiles(const void *j, int64_t t0, int64_t t1) { int_tiles(j, t0, t1, 5); }
static void q6_tiles(const void *j, int64_t t0, int64_t t1) { int_tiles(j, t0, t1, 6); }
static void q8_tiles(const void *j, int64_t t0, int64_t t1) { int_tiles(j, t0, t1, 8); }
static void qlut_tiles(const void *j, int64_t t0, int64_t t1) { int_tiles(j, t0, t1, LUT4); }

#ifdef TALLY_AVX512
/* Items are pairs of tiles (t, t + 1); an odd last tile pairs with itself and stores one half. Jobs of fewer than
 * PAIR_ROWS rows take the tiles one at a time: with weights streamed from memory (a decode step's), a thread's two
 * streams are slower than one tile's at a few rows, though from cache the pairs win at every row count
 * (docs/benchmarks.md#kernels). (-DPAIR_ROWS=n overrides it: benchmarks/native_builds.py --define.) */
#ifndef PAIR_ROWS
#define PAIR_ROWS 5
#endif
/* int5 / int6 pairs are unpacked once a call (int_dots.h: expand_pair) for jobs of more rows than one pass of MR512,
 * into 16 bytes a k on the thread's stack (K <= EXPAND_MAX_K: 256 KB), as tile_rows does for one tile
 * (docs/benchmarks.md#kernels); int4's unpacking is three instructions a chunk and gains nothing expanded.
 * (-DPAIR_EXPAND_ROWS=n overrides the rows: benchmarks/native_builds.py --define.) */
#ifndef PAIR_EXPAND_ROWS
#define PAIR_EXPAND_ROWS MR512
#endif
/* Rows m0..m1 of one pair (t, u) in passes of MR512: the pair's tiles as stored, or (expanded) expand_pair's bytes */
static inline __attribute__((always_inline)) void pair_rows(const IntJob *j, int64_t t, int64_t u, const uint8_t *wa,
                                                            const uint8_t *wb, const uint8_t *ha, const uint8_t *hb,
                                                            int bits, int expanded) {
    int64_t K = j->K, G = K / j->group;
    GroupValues sa = values_from(j->scale, t * G * TILE), sb = values_from(j->scale, u * G * TILE);
    GroupValues ma = values_from(j->min, t * G * TILE), mb = values_from(j->min, u * G * TILE);
    for (int64_t r = j->m0; r < j->m1; r += MR512) {
        int mr = j->m1 - r < MR512 ? (int)(j->m1 - r) : MR512;
#define PAIR_(MR_, BLOCKED_) \
    int_tile_pair(j->xq + r * K, j->xu ? j->xu + r * K : NULL, j->dx + r * (K / 32), j->xsum ? j->xsum + r * G : NULL, \
                  j->xoff ? j->xoff + r * (K / span_of(j->group)) : NULL, K, j->group, wa, wb, ha, hb, sa, sb, ma, mb, \
                  bits, expanded, MR_, j->y + r * j->N, j->N, t, u, j->bias, j->accumulate, j->xblock, BLOCKED_)
#define PAIR(MR_) do { if (j->xblock > 32) PAIR_(MR_, 1); else PAIR_(MR_, 0); } while (0)
        switch (mr) {
            case 8: PAIR(8); break;
            case 7: PAIR(7); break;
            case 6: PAIR(6); break;
            case 5: PAIR(5); break;
            case 4: PAIR(4); break;
            case 3: PAIR(3); break;
            case 2: PAIR(2); break;
            default: PAIR(1); break;
        }
#undef PAIR
#undef PAIR_
    }
}

/* The unpacked pairs' passes (int5, int6) in functions of their own: inlined beside the stored pairs' loop, GCC's code
 * for them shifts with edits elsewhere. */
static __attribute__((noinline)) void unpacked_pair_rows5(const IntJob *j, int64_t t, int64_t u, const uint8_t *v) {
    pair_rows(j, t, u, v, v, NULL, NULL, 5, 1);
}

static __attribute__((noinline)) void unpacked_pair_rows6(const IntJob *j, int64_t t, int64_t u, const uint8_t *v) {
    pair_rows(j, t, u, v, v, NULL, NULL, 6, 1);
}

#ifdef __AMX_INT8__
#include "amx_tiles.h"  /* amx_on, amx_pair_rows: 16 rows at a time on AMX's tiles */

/* The calling thread's buffer for a pair's expanded values (16 bytes a k), kept for the thread's life: a call's pieces
 * would otherwise map and fault it afresh */
static uint8_t *amx_buffer(int64_t K) {
    static __thread uint8_t *buffer;
    static __thread int64_t bytes;
    if (16 * K > bytes) {
        free(buffer);
        buffer = aligned_alloc(64, (size_t)(16 * K));
        bytes = 16 * K;
    }
    return buffer;
}

/* Pairs p0..p1's rows m0..amx_end on AMX; the rows past amx_end (fewer than 16) in pair_rows */
static inline __attribute__((always_inline)) void amx_pairs(const IntJob *j, int64_t p0, int64_t p1, int bits,
                                                            int64_t amx_end) {
    int64_t K = j->K, tile_bytes = bits == 8 ? TILE * K : TILE * K / 2, T = (j->N + TILE - 1) / TILE;
    uint8_t *v = amx_buffer(K);
    IntJob rest = *j;
    rest.m0 = amx_end;
    amx_configure(span_of(j->group));
    for (int64_t p = p0; p < p1; p++) {
        int64_t t = 2 * p, u = t + 1 < T ? t + 1 : t;
        const uint8_t *ha = j->hb && bits > 4 ? j->hb + t * K * (bits - 4) : j->hb;  /* LUT4: the table */
        const uint8_t *hb = j->hb && bits > 4 ? j->hb + u * K * (bits - 4) : j->hb;
        expand_pair(j->w + t * tile_bytes, j->w + u * tile_bytes, ha, hb, K, bits, v);
        amx_pair_rows(j, t, u, v, j->m0, amx_end, bits);
        if (rest.m0 < rest.m1) pair_rows(&rest, t, u, j->w + t * tile_bytes, j->w + u * tile_bytes, ha, hb, bits, 0);
    }
    _tile_release();
}
#endif

static inline __attribute__((always_inline)) void int_pairs(const IntJob *j, int64_t p0, int64_t p1, int bits) {
    int64_t K = j->K, tile_bytes = bits == 8 ? TILE * K : TILE * K / 2, T = (j->N + TILE - 1) / TILE;
    int expand = (bits == 5 || bits == 6) && j->m1 - j->m0 > PAIR_EXPAND_ROWS && K <= EXPAND_MAX_K;
#ifdef __AMX_INT8__
    /* whole tiles of 16 rows on AMX */
    int64_t amx_end = j->m0 + (j->m1 - j->m0) / AMX_ROWS * AMX_ROWS;
    if (amx_on && amx_end > j->m0) {
        amx_pairs(j, p0, p1, bits, amx_end);
        return;
    }
#endif
    for (int64_t p = p0; p < p1; p++) {
        int64_t t = 2 * p, u = t + 1 < T ? t + 1 : t;
        const uint8_t *wa = j->w + t * tile_bytes, *wb = j->w + u * tile_bytes;
        const uint8_t *ha = j->hb && bits > 4 ? j->hb + t * K * (bits - 4) : j->hb;  /* LUT4: the table */
        const uint8_t *hb = j->hb && bits > 4 ? j->hb + u * K * (bits - 4) : j->hb;
        if (expand) {
            uint8_t values[2 * TILE * K] __attribute__((aligned(64)));
            expand_pair(wa, wb, ha, hb, K, bits, values);
            if (bits == 5) unpacked_pair_rows5(j, t, u, values);
            else unpacked_pair_rows6(j, t, u, values);
        } else {
            pair_rows(j, t, u, wa, wb, ha, hb, bits, 0);
        }
    }
}

static void q4_pairs(const void *j, int64_t p0, int64_t p1) { int_pairs(j, p0, p1, 4); }
static void q5_pairs(const void *j, int64_t p0, int64_t p1) { int_pairs(j, p0, p1, 5); }
static void q6_pairs(const void *j, int64_t p0, int64_t p1) { int_pairs(j, p0, p1, 6); }
static void q8_pairs(const void *j, int64_t p0, int64_t p1) { int_pairs(j, p0, p1, 8); }
static void qlut_pairs(const void *j, int64_t p0, int64_t p1) { int_pairs(j, p0, p1, LUT4); }
#endif

#ifndef __AMX_INT8__
int64_t tally_amx_init(void) { return 0; }  /* a build without AMX's tiles: amx_tiles.h's, never granted */
#endif

/* A format's range functions: over tiles, and (AVX-512) over pairs of tiles */
typedef struct { RangeFn tiles, pairs; } IntKernels;
#ifdef TALLY_AVX512
#define INT_KERNELS(B) ((IntKernels){q##B##_tiles, q##B##_pairs})
#else
#define INT_KERNELS(B) ((IntKernels){q##B##_tiles, NULL})
#endif

/* Activation rows in blocks of INT_MB, each block's int8 copy in L2 while every tile passes over it */
static void int_gemm(IntJob job, int64_t M, IntKernels k) {
    int64_t T = (job.N + TILE - 1) / TILE;
    for (job.m0 = 0; job.m0 < M; job.m0 += INT_MB) {
        job.m1 = M - job.m0 < INT_MB ? M : job.m0 + INT_MB;
        int64_t work = job.N * job.K * (job.m1 - job.m0);
#ifdef TALLY_AVX512
        if (job.m1 - job.m0 >= PAIR_ROWS) {
            parallel_for((T + 1) / 2, work, k.pairs, &job);
            continue;
        }
#endif
        parallel_for(T, work, k.tiles, &job);
    }
}

/* Factored values (form P) as fp32 [count], where a call has the rows to repay it: from FP32_VALUES_ROWS rows the
 * per-group conversion in every pass of MR rows costs more than converting once (docs/benchmarks.md#kernels).
 * Other forms as they are. */
#define FP32_VALUES_ROWS 64
static GroupValues values_in_fp32(GroupValues a, int64_t count, float *buf) {
    if (!a.v || a.form < 2) return a;
    for (int64_t i = 0; i < count; i += TILE) _mm256_storeu_ps(buf + i, values8(a, i));
    return (GroupValues){buf, 0};
}

/* One integer product made ready to run: its job (every row), the range functions of its format, and the buffers it
 * owns (int_call_free gives them back). tally_gemm_q4 / q8 run one at once; experts.h runs several experts' in one
 * parallel region (project.h: project_work). */
typedef struct {
    IntJob job;
    IntKernels k;
    void *owned[5];
} IntCall;

static void int_call_free(IntCall *c) {
    for (int i = 0; i < 5; i++) free(c->owned[i]);
}

/* Values per activation scale for a weight of groups of `group` (the RowsJob's span, IntJob.xblock): factored
 * scales' super-block (scale_form P: P groups, a K-quant's 256 values, as llama.cpp's Q8_K meets them), else 32 (its
 * Q8_0). int_tile takes factored scales blocked. */
static int64_t activation_block(int64_t group, int scale_form) {
    return scale_form >= 2 ? scale_form * group : 32;
}

/* bits 4: qs, d, m (qh NULL; m NULL: w = d * (q - 8), GGUF Q4_0); bits 5 or 6: qs, qh, d (m NULL); LUT4: qs, qh the
 * table of 16 int8 values, d (m NULL; groups of 32); group 16 or a multiple of 32. scale_form: d and m's form
 * (int_dots.h: GroupValues) */
static IntCall q4_call(const float *x, const uint8_t *qs, const uint8_t *qh, const void *d, const void *m,
                       const float *bias, float *y, int64_t M, int64_t N, int64_t K, int64_t group, int64_t bits,
                       int accumulate, int scale_form) {
    int64_t G = K / group, span = span_of(group), xblock = activation_block(group, scale_form);
    RowsJob rows = {x, {NULL, NULL}, NULL, NULL, K, xblock, group, 0};
    if (m) {
        rows.xsum = malloc(sizeof(float) * M * G);
    } else if (bits != LUT4 || LUT4_OFFSET) {
        rows.offset = bits == LUT4 ? LUT4_OFFSET : 1 << (bits - 1);
        rows.xoff = malloc(sizeof(int32_t) * M * (K / span));
    }
    run_rows_job(&rows, M);
    QuantizedRows xq = rows.q;
    float *xsum = rows.xsum;
    int32_t *xoff = rows.xoff;
    IntCall c = {{xq.xq, NULL, xq.dx, xsum, xoff, qs, qh, {d, scale_form}, {m, scale_form}, bias, y, K, N, group, 0,
                  M, xblock, accumulate},
                 bits == 6 ? INT_KERNELS(6) : bits == 5 ? INT_KERNELS(5) : bits == LUT4 ? INT_KERNELS(lut)
                                                                                    : INT_KERNELS(4),
                 {xq.xq, xq.dx, xsum, xoff, NULL}};
    if (scale_form >= 2 && M >= FP32_VALUES_ROWS) {
        int64_t count = (N + TILE - 1) / TILE * G * TILE;
        float *plain = c.owned[4] = malloc(sizeof(float) * 2 * count);
        c.job.scale = values_in_fp32(c.job.scale, count, plain);
        c.job.min = values_in_fp32(c.job.min, count, plain + count);
    }
    return c;
}

void tally_gemm_q4(const float *x, const uint8_t *qs, const uint8_t *qh, const void *d, const void *m,
                   const float *bias, float *y, int64_t M, int64_t N, int64_t K, int64_t group, int64_t bits,
                   int accumulate, int scale_form) {
    IntCall c = q4_call(x, qs, qh, d, m, bias, y, M, N, K, group, bits, accumulate, scale_form);
    int_gemm(c.job, M, c.k);
    int_call_free(&c);
}

/* per_token != 0: activations get one scale per row (W8A8), else one per block of 32. symmetric != 0: no weight is
 * -128 (int8_one_row_dots' condition) */
static IntCall q8_call(const float *x, const int8_t *q, const void *s, const float *bias, float *y, int64_t M,
                       int64_t N, int64_t K, int64_t group, int accumulate, int per_token, int scale_form,
                       int symmetric) {
    RowsJob rows = {x, {NULL, NULL}, NULL, NULL, K, per_token ? K : activation_block(group, scale_form), 0, 0};
    run_rows_job(&rows, M);
    QuantizedRows xq = rows.q;
    uint8_t *xu = NULL;
#ifdef TALLY_AVX512
    xu = offset_bytes(xq.xq, M * K);
    (void)symmetric;
#elif defined(ONE_ROW_BROADCASTS)
    if (M == 1 && symmetric) xu = one_row_broadcasts(xq.xq, K);
#else
    (void)symmetric;
#endif
    return (IntCall){{xq.xq, xu, xq.dx, NULL, NULL, (const uint8_t *)q, NULL, {s, scale_form}, {NULL, 0}, bias, y, K,
                      N, group, 0, M, rows.span, accumulate},
                     INT_KERNELS(8), {xq.xq, xq.dx, xu, NULL, NULL}};
}

void tally_gemm_q8(const float *x, const int8_t *q, const void *s, const float *bias, float *y,
                   int64_t M, int64_t N, int64_t K, int64_t group, int accumulate, int per_token, int scale_form,
                   int symmetric) {
    IntCall c = q8_call(x, q, s, bias, y, M, N, K, group, accumulate, per_token, scale_form, symmetric);
    int_gemm(c.job, M, c.k);
    int_call_free(&c);
}
