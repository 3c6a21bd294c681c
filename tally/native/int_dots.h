/* The integer weights' tile layout, and the formats' block dot products (int_tiles.h: int_tile) in the widths this
 * build has: AVX2, VNNI on 32-byte vectors; AVX-512 VNNI builds a whole kernel of its own over pairs of tiles
 * (int_tile_pair). Included by int_tiles.h; every build forms the same integer sums
 * (tests/test_native_builds_agree.py holds them to the AVX2 bits). */

/* ---- Integer weights in tiles of 8 outputs ------------------------------------------------------------
 * Both integer formats store each 8 outputs' weights interleaved, a few k at a time, so that one 32-byte load
 * holds 8 outputs x 4 (int8) or 8 (int4) k. A row's 4 activation bytes, broadcast, meet all 8 outputs in one
 * byte dot product (maddubs), and each fp32 lane ends as one output: no horizontal sums, the scales of 8
 * outputs are one vector, and the unpacking of a tile is shared by up to MR activation rows (like the fp16
 * panels in kernels.c, and llama.cpp's repacked q4_0 8x8). The tile stays in L1 while every row block passes over it.
 * The AVX-512 build takes two tiles at a time, one in each half of a 64-byte vector (below: int_tile_pair).
 * Scales are [T][G][8]: per tile, per group, the 8 outputs' values (T = ceil(N / 8), rows past N zero), in one of
 * GroupValues' forms (below). */
#define TILE 8
#define MR 4
/* Rows r.. r + mr of y, outputs of tile t, from one fp32 lane per output */
static inline void store_tile(float *y, int64_t N, int64_t t, const __m256 *acc, int mr, const float *bias,
                              int accumulate) {
    int64_t n0 = t * TILE, nr = N - n0 < TILE ? N - n0 : TILE;
    if (nr == TILE) {  /* a whole tile: store_out's sums as vectors, the faster form */
        for (int i = 0; i < mr; i++) {
            __m256 v = bias ? _mm256_add_ps(acc[i], _mm256_loadu_ps(bias + n0)) : acc[i];
            float *out = y + i * N + n0;
            _mm256_storeu_ps(out, accumulate ? _mm256_add_ps(_mm256_loadu_ps(out), v) : v);
        }
        return;
    }
    for (int i = 0; i < mr; i++) {
        float out[TILE];
        _mm256_storeu_ps(out, acc[i]);
        for (int64_t j = 0; j < nr; j++) store_out(y + i * N + n0 + j, out[j], bias, n0 + j, accumulate);
    }
}

/* A tile's per-group values (scales d / s, minima m), [T][G][8], in one of three forms, the kernels' `scale_form`
 * argument (tally/native/ops.py: pack_tile_scales, pack_tile_factors, scale_form):
 * 0: fp32.
 * 1: fp16, where every value of the layer converts exactly. GGUF stores Q4_0 / Q4_1 / Q5_0 / Q8_0's d and m in fp16;
 *    as fp32 they would be a sixth of an int4 layer's bytes, which a one-row decode streams from memory.
 * P >= 2, a power of two: GGUF's K-quant form, an fp16 factor per super-block of P groups times an int8 step per
 *    group (Q4_K: d * sc and -dmin * mn, P = 8; Q6_K: d * sc, P = 16). Per tile and super-block a unit of 16 bytes
 *    (8 outputs' factors) then P * 8 steps (group-major). Their fp32 products are exact (11 + 8 bits): the values
 *    fp32 held, at 1.125-1.25 bytes a group instead of 4.
 * Every form gives the kernels the same floats: same bits (though form P meets activations rounded per 256 values,
 * int_tiles.h: activation_block, as a K-quant's super-block does in llama.cpp). */
typedef struct { const void *v; int form; } GroupValues;

static inline int64_t unit_bytes(int form) { return 16 + 8 * (int64_t)form; }  /* form P >= 2: a super-block's */

static inline GroupValues values_from(GroupValues a, int64_t i) {  /* from element i on (P >= 2: a unit's first) */
    if (!a.v) return a;
    if (a.form == 0) a.v = (const float *)a.v + i;
    else if (a.form == 1) a.v = (const uint16_t *)a.v + i;
    else a.v = (const uint8_t *)a.v + i / (8 * a.form) * unit_bytes(a.form);
    return a;
}

static inline const uint8_t *unit_of(GroupValues a, int64_t g, const int8_t **steps) {  /* P >= 2: group g's */
    int shift = __builtin_ctz((unsigned)a.form);  /* a power of two: no division per group */
    const uint8_t *unit = (const uint8_t *)a.v + (g >> shift) * unit_bytes(a.form);
    *steps = (const int8_t *)(unit + 16) + (g & (a.form - 1)) * 8;
    return unit;
}

/* elements i..i+7 (i a multiple of 8) of form 0 or 1: int_tile's loop for those forms (the factored form has a loop
 * of its own, GroupRun below) */
static inline __m256 plain_values8(GroupValues a, int64_t i) {
    return a.form ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)a.v + i)))
                  : _mm256_loadu_ps((const float *)a.v + i);
}

static inline __m256 values8(GroupValues a, int64_t i) {  /* elements i..i+7, i a multiple of 8, any form */
    if (a.form < 2) return plain_values8(a, i);
    const int8_t *steps;
    const uint8_t *unit = unit_of(a, i / 8, &steps);
    __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)steps)));
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)unit)), s);
}

/* Form P >= 2 over a super-block's P groups (int_tile, calls of a few rows): the base converted once a run, so a
 * group's values cost a load, two converts and a multiply, as fast as fp16 values (values8 per group is slower).
 * Calls of more rows convert the layer's values to fp32 once instead (int_tiles.h: values_in_fp32). */
typedef struct { const int8_t *steps; __m256 base; } GroupRun;

static inline GroupRun run_at(GroupValues a, int64_t g0) {  /* the super-block starting at group g0 (a.v may be NULL) */
    GroupRun r = {NULL, _mm256_setzero_ps()};
    if (a.v) r.base = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)unit_of(a, g0, &r.steps)));
    return r;
}

static inline __m256 run_values8(GroupRun r, int64_t j) {  /* the super-block's group j, as values8 */
    __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(r.steps + 8 * j))));
    return _mm256_mul_ps(r.base, s);
}

static inline int64_t span_of(int64_t group) { return group < 32 ? group : 32; }  /* a group's part in one block */

/* Whether an activation block of xblock values (int_tiles.h: IntJob.xblock) ends where k values end */
static inline int block_ends(int64_t k, int64_t xblock) {
    return (xblock & (xblock - 1) ? k % xblock : k & (xblock - 1)) == 0;
}

/* VNNI (AVX-VNNI, or AVX-512 VNNI with VL) multiplies unsigned by signed bytes and adds each 4 products into
 * an int32 lane in one instruction, where AVX2 needs maddubs, madd and add: the same sums, exactly (no int16
 * stage to saturate). tally/native/library.py builds this file a second time with those flags where the CPU has
 * them; everything else is the same source. */
#if defined(__AVXVNNI__)
#define TALLY_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TALLY_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#endif

static inline __m256i broadcast4(const int8_t *p) {  /* 4 activation bytes into every 32-bit lane */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The integer formats differ only in how a 32-block's byte products are formed (int_block_dots); around that,
 * one body (`bits` a constant after inlining): per group g, acc += (block dot) * scale_g * dx_block, and int4 adds
 * its group minima, m_g * sum(x_g) (without them, GGUF Q4_0's w = d * (q - 8), its offset as int5 / int6's below).
 * int4, asymmetric per group: w = q * d + m, q in 0..15. qs [T][K/8][32]: chunk c of tile t holds k = 8c..8c+7
 * of outputs 8t..8t+7; byte 4j + i: low nibble (8t + j, 8c + i), high nibble (8t + j, 8c + 4 + i). 0..15 times
 * -127..127 fits maddubs' int16 pairs (|.| <= 3810), so a 32-block's 8 products add up in int16 (<= 30480)
 * before one widening.
 * int5 / int6 (GGUF Q5_0: w = d * (q - 16), q in 0..31, groups of 32; Q6_K: w = d * (q - 32), q in 0..63, groups
 * of 16): int4's nibbles plus the bits above them, qh [T][K/32][32 * (bits - 4)] (value byte b of the block's vector
 * s: chunk s / 2's low nibbles for even s, high for odd):
 * - int5, one plane of 32 bytes: bit s of byte b is bit 4 of vector s's byte b, so one shift and mask put it in place
 *   (high_bits).
 * - int6, one plane of pairs of 64 bytes: byte 32 (c & 1) + b holds bits 4-5 of chunk c's two vectors' bytes b, the
 *   low nibbles' at bit 4 (c >> 1), the high nibbles' 2 above (pair_bits). One shift and mask, or one affine
 *   transform, give a vector both its bits, and the AVX-512 one-tile loop's halves (chunks c, c + 1) both lie at one
 *   shift in the plane as loaded (two planes of single bits take more instructions a vector:
 *   docs/benchmarks.md#kernels).
 * The offset, -2^(bits - 1) d, is not stored (m NULL): 2^(bits - 1) times the activations' sum comes off each
 * block's (Q6_K: half-block's) integer dot before it turns float, so a block's dot is sum x (q - 2^(bits - 1))
 * exactly, without a float FMA per row and group beside the byte products, which share their ports.
 * Pairs reach 2 * 63 * 127, two of them 32004: each chunk widens at once. Held per weight: 0.75 bytes (int5,
 * against int8's 1.125) and 1 byte (int6, against fp16's 2).
 * int8, symmetric per group: w = q * s (group = K: per output channel). q [T][K/4][32]: chunk c of tile t holds
 * k = 4c..4c+3 of outputs 8t..8t+7, byte 4j + i = (8t + j, 4c + i). maddubs wants one unsigned operand, so it
 * gets |w| and x with w's sign (llama.cpp's trick); its pairs reach 2 * 127 * 127, so each widens at once.
 * (AVX-512, both its loops: x + 128 against w as stored, block_dots_pair.) */
/* LUT4 (GGUF IQ4_NL, IQ4_XS, MXFP4): 4-bit indices into a table of 16 int8 values, w = d * v[q]. The nibbles as
 * int4's, and in place of the planes of high bits (`hb`) the table, 16 bytes: one byte shuffle turns a vector of
 * nibbles into the values, 0.5 bytes a weight where the int8 values they stand for take 1. With VNNI the table is
 * held as v + 128 (unsigned, as nibbles are) and 128 times the activations' sum comes off each block's dot (the
 * offset, as Q4_0's 8); AVX2 without VNNI takes int8's sign trick on the values (|v| against x with v's sign), whose
 * pairs widen at once. Either way a block's dot is sum x v[q] exactly: the int8 layer's sums, and so its bits. */
#define LUT4 3
#ifdef TALLY_VNNI
#define LUT4_OFFSET 128
#else
#define LUT4_OFFSET 0  /* no offset: the sign trick's sums are exact as they are */
#endif

/* LUT4's table in both 128-bit lanes, as the loops take it */
static inline __m256i table256(const uint8_t *table) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return LUT4_OFFSET ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;
}

static inline __m256i high_bits(__m256i plane, int s) {  /* int5: 16 in each byte whose bit s is set */
    __m256i v = s <= 4 ? _mm256_sll_epi16(plane, _mm_cvtsi32_si128(4 - s))
                       : _mm256_srl_epi16(plane, _mm_cvtsi32_si128(s - 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));  /* 16-bit shifts by <= 4 move no neighbour into bit 4 */
}

static inline __m256i pair_bits(__m256i plane, int f) {  /* int6: bits f, f + 1 of each byte at bits 4, 5 */
    __m256i v = f <= 4 ? _mm256_sll_epi16(plane, _mm_cvtsi32_si128(4 - f))
                       : _mm256_srl_epi16(plane, _mm_cvtsi32_si128(f - 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x30));  /* what a 16-bit shift brings from the neighbour: masked */
}

/* The bits above the nibbles of chunk c's vector 2c + e (e 1: the high nibbles'), from the block's plane (int5: p4)
 * or plane of pairs (int6: p4 its first 32 bytes, for even c; p5 the rest) */
static inline __m256i chunk_high_bits(__m256i p4, __m256i p5, int c, int e, int bits) {
    return bits == 5 ? high_bits(p4, 2 * c + e) : pair_bits(c & 1 ? p5 : p4, 4 * (c >> 1) + 2 * e);
}

/* AVX-512 (VNNI and BW), one tile (a job of fewer than PAIR_ROWS rows: int_tile): two
 * chunks side by side in one 64-byte vector, the same layout and the same integer sums as the 256-bit loop below, in
 * half its instructions. Lanes 0-7 hold chunk c's 8 outputs, lanes 8-15 chunk c + 1's; the halves add up at the end.
 * A row's activations for both chunks come from one 16-byte load, their 4-byte units spread over the halves by one
 * permute. High bits: int5's plane, in the upper half shifted right by 2, puts chunk c + 1's vectors (2c + 2, 2c + 3)
 * where the lower half has chunk c's, so one uniform shift serves both halves (high_bits' rule; the bits a 16-bit
 * shift by 2 brings in from the neighbouring byte land at bits 6-7, never read); int6's plane of pairs has them so as
 * it is stored. library.py builds this where the CPU has the flags. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define TALLY_AVX512 1
/* high_bits' and pair_bits' rules. GFNI's affine transform moves bits within each byte in one instruction, where the
 * shifts take two (a shift and a mask, which the or after it absorbs into one vpternlog). int6's pairs always take
 * it; int5's plane only at one row, where the activation permutes keep the shifts' pipes busy
 * (docs/benchmarks.md#kernels). library.py builds with GFNI where the CPU has it. */
static inline __m512i high_bits512(__m512i plane, int s, int one_row) {
#ifdef __GFNI__
    if (one_row)  /* the matrix's byte 3 picks bit s for the result's bit 4, and nothing else */
        return _mm512_gf2p8affine_epi64_epi8(plane, _mm512_set1_epi64((long long)((1ull << s) << 24)), 0);
#endif
    (void)one_row;
    __m512i v = s <= 4 ? _mm512_sll_epi16(plane, _mm_cvtsi32_si128(4 - s))
                       : _mm512_srl_epi16(plane, _mm_cvtsi32_si128(s - 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x10));
}

static inline __m512i pair_bits512(__m512i plane, int f) {  /* pair_bits; GFNI: bytes 3 and 2 pick bits f, f + 1 */
#ifdef __GFNI__
    return _mm512_gf2p8affine_epi64_epi8(plane, _mm512_set1_epi64((long long)(((1ull << f) << 24) |
                                                                              ((2ull << f) << 16))), 0);
#else
    __m512i v = f <= 4 ? _mm512_sll_epi16(plane, _mm_cvtsi32_si128(4 - f))
                       : _mm512_srl_epi16(plane, _mm_cvtsi32_si128(f - 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x30));
#endif
}

/* lo, hi: the values of 64 bytes of nibbles (low and high nibbles) of chunk c (and whatever the upper half holds)
 * with the bits above them: int5 from p4 (high_bits512's rule; one_row: the one-tile loop at one row), int6 from the
 * plane of pairs p4 (even c) or p5 (odd c) as the caller arranged them; LUT4 through the table p4 */
static inline __attribute__((always_inline)) void nibble_values512(__m512i raw, __m512i p4, __m512i p5, int c, int bits,
                                                                   int one_row, __m512i *lo, __m512i *hi) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(raw, low4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    if (bits == 5) {
        *lo = _mm512_or_si512(*lo, high_bits512(p4, 2 * c, one_row));
        *hi = _mm512_or_si512(*hi, high_bits512(p4, 2 * c + 1, one_row));
    } else if (bits == 6) {
        __m512i plane = c & 1 ? p5 : p4;
        *lo = _mm512_or_si512(*lo, pair_bits512(plane, 4 * (c >> 1)));
        *hi = _mm512_or_si512(*hi, pair_bits512(plane, 4 * (c >> 1) + 2));
    } else if (bits == LUT4) {  /* p4: the table (table512) */
        *lo = _mm512_shuffle_epi8(p4, *lo);
        *hi = _mm512_shuffle_epi8(p4, *hi);
    }
}

static inline __m512i plane_pair(const uint8_t *plane) {  /* int5: [plane, plane >> 2]: see above */
    __m256i v = _mm256_loadu_si256((const __m256i *)plane);
    return _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 2), 1);
}

static inline __m512i units_apart(const void *x, int64_t bytes, __m512i which) {  /* 4-byte units a, b: halves */
    __m128i u = bytes == 16 ? _mm_loadu_si128((const __m128i *)x) : _mm_loadl_epi64((const __m128i *)x);
    return _mm512_permutexvar_epi32(which, _mm512_castsi128_si512(u));
}

/* A nibble block's bits above the nibbles for the one-tile loop: int5's plane as plane_pair gives it, int6's plane of
 * pairs as stored (in p4 and p5: its chunks c and c + 1 lie in its halves), LUT4's table, zero where the format has
 * none */
static inline __m512i table512(const uint8_t *table) {  /* LUT4's table in every 128-bit lane (table256) */
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)table)),
                            _mm512_set1_epi8((char)0x80));
}

static inline __attribute__((always_inline)) void block_planes512(const uint8_t *hb, int bits, __m512i *p4,
                                                                  __m512i *p5) {
    if (bits > 4) prefetch_stream(hb, PREFETCH / 4 * (bits - 4), PREFETCH_L2 / 4 * (bits - 4));
    *p4 = bits == 5 ? plane_pair(hb) : bits == 6 ? _mm512_loadu_si512((const void *)hb)
        : bits == LUT4 ? table512(hb) : _mm512_setzero_si512();
    *p5 = *p4;
}

/* acc[i] += row i's products with chunks c and c + 1 of a nibble block */
static inline __attribute__((always_inline)) void nibble_chunks512(const int8_t *xq, int64_t K, const uint8_t *wb,
                                                                   __m512i p4, __m512i p5, int c, int bits, int mr,
                                                                   __m512i *acc) {
    const __m512i lo_units = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i hi_units = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
    prefetch_stream(wb + c * 32, PREFETCH, PREFETCH_L2);
    __m512i lo, hi;
    nibble_values512(_mm512_loadu_si512((const void *)(wb + c * 32)), p4, p5, c, bits, mr == 1, &lo, &hi);
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) {
        const int8_t *xp = xq + i * K + c * 8;
        acc[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[i], lo, units_apart(xp, 16, lo_units)), hi,
                                     units_apart(xp, 16, hi_units));
    }
}

static inline __attribute__((always_inline)) void fold512(const __m512i *acc, int mr, __m256i *dot) {  /* halves */
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++)
        dot[i] = _mm256_add_epi32(_mm512_castsi512_si256(acc[i]), _mm512_extracti64x4_epi64(acc[i], 1));
}

static inline __attribute__((always_inline)) void int_block_dots512(
    const int8_t *xq, const uint8_t *xu, int64_t K, const uint8_t *wb, const uint8_t *hb, int bits, int c0, int c1,
    int mr, __m256i *dot) {
    __m512i acc[MR];
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) acc[i] = _mm512_setzero_si512();
    if (bits != 8) {
        __m512i p4, p5;
        block_planes512(hb, bits, &p4, &p5);
        _Pragma("GCC unroll 1")
        for (int c = c0; c < c1; c += 2) nibble_chunks512(xq, K, wb, p4, p5, c, bits, mr, acc);
    } else {
        /* xu: the activations + 128 against the weights as stored, as the pairs take them (block_dots_pair); faster
         * than the sign trick (|w| against x with w's sign): docs/benchmarks.md#kernels */
        const __m512i units = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        __m512i offset = _mm512_setzero_si512();
        _Pragma("GCC unroll 1")
        for (int c = 0; c < 8; c += 2) {
            prefetch_stream(wb + c * 32, PREFETCH, PREFETCH_L2);
            __m512i raw = _mm512_loadu_si512((const void *)(wb + c * 32));
            offset = _mm512_dpbusd_epi32(offset, _mm512_set1_epi8((char)0x80), raw);
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++)
                acc[i] = _mm512_dpbusd_epi32(acc[i], units_apart(xu + i * K + c * 4, 8, units), raw);
        }
        _Pragma("GCC unroll 8")
        for (int i = 0; i < mr; i++) acc[i] = _mm512_sub_epi32(acc[i], offset);
    }
    fold512(acc, mr, dot);
}

/* Groups of 16 (Q6_K): both halves of block b in one pass, dot0 over chunks 0-1 and dot1 over 2-3, the planes of high
 * bits loaded once (int_block_dots512, called per half, loads them twice): the same sums. */
static inline __attribute__((always_inline)) void int_block_halves512(
    const int8_t *xq, int64_t K, const uint8_t *wb, const uint8_t *hb, int bits, int mr, __m256i *dot0,
    __m256i *dot1) {
    __m512i p4, p5;
    block_planes512(hb, bits, &p4, &p5);
    _Pragma("GCC unroll 1")
    for (int c = 0; c < 4; c += 2) {
        __m512i acc[MR];
        _Pragma("GCC unroll 8")
        for (int i = 0; i < mr; i++) acc[i] = _mm512_setzero_si512();
        nibble_chunks512(xq, K, wb, p4, p5, c, bits, mr, acc);
        fold512(acc, mr, c ? dot1 : dot0);
    }
}
#endif

/* AVX-512, jobs of PAIR_ROWS rows or more (int_tiles.h): two tiles side by side in one 64-byte vector, lanes 0-7
 * tile t's 8 outputs and lanes 8-15 tile u's, each half the same chunk (the same k) of its tile, in the layout
 * above. A row's 4 activation bytes then meet 16 outputs as one broadcast, which the CPU serves from its load
 * ports, where the chunk-pair loop above needs a permute per product and a fold per block. The scales of both tiles
 * are one vector, so the float work per block is one convert and two multiplies for 16 outputs (a K-quant's: one, its
 * activation scale once a super-block: int_tiles.h, dots_into), and up to MR512 rows
 * share each unpacked weight vector (docs/benchmarks.md#kernels). The integer sums and the float operations per
 * output are the 256-bit loop's, in the same order: the same bits (tests/test_native_builds_agree.py). */
#ifdef TALLY_AVX512
#define MR512 8  /* rows per pass: 8 float (blocked: 16) and 8 integer accumulators, within AVX-512's 32 registers */

static inline __m512i halves(const void *a, const void *b) {  /* 32 bytes of tile t, then 32 of tile u */
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

static inline __m512 halves_ps(__m256 a, __m256 b) {  /* a in lanes 0-7, b in 8-15 */
    return _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_castps_si256(a)),
                                                  _mm256_castps_si256(b), 1));
}

static inline __m512i broadcast4x16(const int8_t *p) {  /* 4 activation bytes into all 16 lanes */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Both tiles' sums over the part chunks c0..c1 of block b (int8: the whole block), per row. Prefetches run PREFETCH
 * bytes ahead in each tile's stream (`pos`: the block's offset in its tile of `tile_bytes`) and past a tile's end
 * go on in the next pair's tile of the same side: ahead at a fixed distance, the first stream would run into its
 * partner (read already) and nothing would fetch the next pair's second tile ahead of use; a distance of two tiles
 * runs past L1 on long rows. */
static inline __attribute__((always_inline)) void block_dots_pair(
    const int8_t *xq, const uint8_t *xu, int64_t K, const uint8_t *wa, const uint8_t *wb, const uint8_t *ha,
    const uint8_t *hb, int bits, int expanded, int c0, int c1, int mr, int64_t pos, int64_t tile_bytes, __m512i *dot) {
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) dot[i] = _mm512_setzero_si512();
    if (expanded) {  /* wa: the block in expand_pair's bytes (wb, ha, hb unused) */
        _Pragma("GCC unroll 1")
        for (int c = c0; c < c1; c++) {
            __m512i lo = _mm512_load_si512((const void *)(wa + c * 128));
            __m512i hi = _mm512_load_si512((const void *)(wa + c * 128 + 64));
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++) {
                const int8_t *xp = xq + i * K + c * 8;
                dot[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[i], lo, broadcast4x16(xp)), hi,
                                             broadcast4x16(xp + 4));
            }
        }
    } else if (bits != 8) {
        __m512i p4 = bits > 4 ? halves(ha, hb) : bits == LUT4 ? table512(ha) : _mm512_setzero_si512();
        __m512i p5 = bits > 5 ? halves(ha + 32, hb + 32) : _mm512_setzero_si512();
        _Pragma("GCC unroll 1")
        for (int c = c0; c < c1; c++) {
            int64_t ahead = pos + c * 32 + PREFETCH < tile_bytes ? PREFETCH : PREFETCH + tile_bytes;
            _mm_prefetch((const char *)(wa + c * 32 + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(wb + c * 32 + ahead), _MM_HINT_T0);
            __m512i raw = halves(wa + c * 32, wb + c * 32);
            __m512i lo, hi;
            nibble_values512(raw, p4, p5, c, bits, 0, &lo, &hi);
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++) {
                const int8_t *xp = xq + i * K + c * 8;
                dot[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[i], lo, broadcast4x16(xp)), hi,
                                             broadcast4x16(xp + 4));
            }
        }
    } else {
        /* int8: xu holds the activations plus 128 (unsigned), the weights are the signed operand as stored, and
         * 128 * (the block's sum of each output's weights), one product a chunk for all rows, comes off at the end:
         * exact integers, the sums of the sign trick the 256-bit loops keep, which cost an abs and a mask a chunk
         * and a masked subtract a row (docs/benchmarks.md#kernels). */
        __m512i offset = _mm512_setzero_si512();
        _Pragma("GCC unroll 1")
        for (int c = 0; c < 8; c++) {
            int64_t ahead = pos + c * 32 + PREFETCH < tile_bytes ? PREFETCH : PREFETCH + tile_bytes;
            _mm_prefetch((const char *)(wa + c * 32 + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(wb + c * 32 + ahead), _MM_HINT_T0);
            __m512i raw = halves(wa + c * 32, wb + c * 32);
            offset = _mm512_dpbusd_epi32(offset, _mm512_set1_epi8((char)0x80), raw);
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++)
                dot[i] = _mm512_dpbusd_epi32(dot[i], broadcast4x16((const int8_t *)xu + i * K + c * 4), raw);
        }
        _Pragma("GCC unroll 8")
        for (int i = 0; i < mr; i++) dot[i] = _mm512_sub_epi32(dot[i], offset);
    }
}

/* A pair's values unpacked once a call into bytes, 512 a block of 32 k: k = 4q..4q + 3 of its 16 outputs in 64 bytes,
 * q = 0..7 in order (each tile t's 32 bytes, then u's). Nibble formats: chunk c's lo vector, then its hi, the bytes
 * the unexpanded loop forms meeting the same activations, so int5 / int6 for more rows than a pass (int_tiles.h:
 * int_pairs) load them instead of unpacking planes of high bits again, as expand_tile does for one tile: the same sums
 * and bits. int8: the chunks as stored, side by side. Either way a block is an AMX tile of weights as it takes them
 * (amx_tiles.h). */
static void expand_pair(const uint8_t *wa, const uint8_t *wb, const uint8_t *ha, const uint8_t *hb, int64_t K, int bits,
                        uint8_t *out) {
    int64_t plane_bytes = bits == 6 ? 64 : 32;
    for (int64_t b = 0; b < K / 32; b++) {
        if (bits == 8) {
            for (int c = 0; c < 8; c++)
                _mm512_store_si512((void *)(out + b * 512 + c * 64), halves(wa + b * 256 + c * 32, wb + b * 256 + c * 32));
            continue;
        }
        __m512i p4 = bits == 5 || bits == 6 ? halves(ha + b * plane_bytes, hb + b * plane_bytes)
                   : bits == LUT4 ? table512(ha) : _mm512_setzero_si512();
        __m512i p5 = bits == 6 ? halves(ha + b * plane_bytes + 32, hb + b * plane_bytes + 32) : _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i lo, hi;
            nibble_values512(halves(wa + b * 128 + c * 32, wb + b * 128 + c * 32), p4, p5, c, bits, 0, &lo, &hi);
            _mm512_store_si512((void *)(out + b * 512 + c * 128), lo);
            _mm512_store_si512((void *)(out + b * 512 + c * 128 + 64), hi);
        }
    }
}

/* into[i] += group g's minima of tiles t and u (ma, mb) times row i's sum (int_tiles.h: int_minima_into), rows
 * 0..rows: the pairs' and AMX's */
static inline __attribute__((always_inline)) void minima_pair_into(__m512 *into, GroupValues ma, GroupValues mb,
                                                                   int64_t g, int64_t G, const float *xsum, int rows) {
    __m512 mg = halves_ps(values8(ma, g * TILE), values8(mb, g * TILE));
    _Pragma("GCC unroll 16")
    for (int i = 0; i < rows; i++) into[i] = _mm512_fmadd_ps(mg, _mm512_set1_ps(xsum[i * G + g]), into[i]);
}

/* Rows 0..mr of y, outputs of tiles t (wa, ha, sa, ma) and u (wb, ...; u == t: only t's are stored), over all
 * of K: int_tile's sums, 16 outputs at a time */
static inline __attribute__((always_inline)) void int_tile_pair(
    const int8_t *xq, const uint8_t *xu, const float *dx, const float *xsum, const int32_t *xoff, int64_t K,
    int64_t group, const uint8_t *wa, const uint8_t *wb, const uint8_t *ha, const uint8_t *hb, GroupValues sa,
    GroupValues sb, GroupValues ma, GroupValues mb, int bits, int expanded, int mr, float *y, int64_t N, int64_t t,
    int64_t u, const float *bias, int accumulate, int64_t xblock, int blocked) {
    int64_t G = K / group, blocks = K / 32, span = span_of(group), block_bytes = expanded ? 512 : bits == 8 ? 256 : 128;
    int64_t plane_bytes = bits == 6 ? 64 : bits == 5 ? 32 : 0;  /* LUT4: ha, hb the table, the same every block */
    __m512 acc[MR512], a[MR512];  /* int_tile's acc and (blocked) a: int_tiles.h, dots_into */
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) acc[i] = a[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        if (blocked && ma.v) minima_pair_into(a, ma, mb, g, G, xsum, mr);
        __m512 sg = halves_ps(values8(sa, g * TILE), values8(sb, g * TILE));
        for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += span) {
            int64_t b = k0 / 32;
            int c0 = (int)(k0 % 32) / 8;
            __m512i dot[MR512];
            block_dots_pair(xq + b * 32, xu ? xu + b * 32 : NULL, K, wa + b * block_bytes, wb + b * block_bytes,
                            ha ? ha + b * plane_bytes : NULL, hb ? hb + b * plane_bytes : NULL, bits, expanded, c0,
                            c0 + (int)span / 8, mr, b * block_bytes, K * (bits == 8 ? TILE : TILE / 2), dot);
            if (xoff) {
                _Pragma("GCC unroll 8")
                for (int i = 0; i < mr; i++)
                    dot[i] = _mm512_sub_epi32(dot[i], _mm512_set1_epi32(xoff[i * (K / span) + k0 / span]));
            }
            if (!blocked) {
                _Pragma("GCC unroll 8")
                for (int i = 0; i < mr; i++)
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]),
                                             _mm512_mul_ps(sg, _mm512_set1_ps(dx[i * blocks + b])), acc[i]);
                continue;
            }
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++) a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), sg, a[i]);
            if (block_ends(k0 + span, xblock)) {
                _Pragma("GCC unroll 8")
                for (int i = 0; i < mr; i++) {
                    acc[i] = _mm512_fmadd_ps(a[i], _mm512_set1_ps(dx[i * blocks + b]), acc[i]);
                    a[i] = _mm512_setzero_ps();
                }
            }
        }
        if (!blocked && ma.v) minima_pair_into(acc, ma, mb, g, G, xsum, mr);
    }
    __m256 lo[MR512], hi[MR512];
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) {
        lo[i] = _mm512_castps512_ps256(acc[i]);
        hi[i] = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(acc[i]), 1));
    }
    store_tile(y, N, t, lo, mr, bias, accumulate);
    if (u != t) store_tile(y, N, u, hi, mr, bias, accumulate);
}
#endif

/* The values of a 32-block's chunk c (nibble formats): lo its vector 2c, hi 2c + 1, the bits above the nibbles or-ed
 * in (chunk_high_bits), or LUT4's through its table */
static inline __attribute__((always_inline)) void nibble_values256(__m256i raw, __m256i p4, __m256i p5, int c, int bits,
                                                                   __m256i *lo, __m256i *hi) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(raw, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    if (bits > 4) {
        *lo = _mm256_or_si256(*lo, chunk_high_bits(p4, p5, c, 0, bits));
        *hi = _mm256_or_si256(*hi, chunk_high_bits(p4, p5, c, 1, bits));
    } else if (bits == LUT4) {  /* p4: the table (table256) */
        *lo = _mm256_shuffle_epi8(p4, *lo);
        *hi = _mm256_shuffle_epi8(p4, *hi);
    }
}

/* int5 / int6 for many rows (int_tiles.h: tile_rows): a tile's values unpacked once a call into bytes, 256 a block
 * (chunk c's lo vector, then its hi), so each pass of MR rows loads them instead of unpacking planes of high bits
 * again: the same bytes meet the same activations, so the sums and the bits are the 256-bit loop's. */
static void expand_tile(const uint8_t *w, const uint8_t *hb, int64_t K, int bits, uint8_t *out) {
    int64_t plane_bytes = bits == 6 ? 64 : 32;
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *h = hb + b * plane_bytes;
        __m256i p4 = _mm256_loadu_si256((const __m256i *)h);
        __m256i p5 = bits > 5 ? _mm256_loadu_si256((const __m256i *)(h + 32)) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            nibble_values256(_mm256_loadu_si256((const __m256i *)(w + b * 128 + c * 32)), p4, p5, c, bits, &lo, &hi);
            _mm256_store_si256((__m256i *)(out + b * 256 + c * 64), lo);
            _mm256_store_si256((__m256i *)(out + b * 256 + c * 64 + 32), hi);
        }
    }
}

/* Chunk c's values (nibble formats): from expand_tile's bytes, or unpacked (nibble_values256) */
static inline __attribute__((always_inline)) void chunk_values256(const uint8_t *wb, __m256i p4, __m256i p5, int c,
                                                                  int bits, int expanded, __m256i *lo, __m256i *hi) {
    if (expanded) {
        *lo = _mm256_load_si256((const __m256i *)(wb + c * 64));
        *hi = _mm256_load_si256((const __m256i *)(wb + c * 64 + 32));
    } else {
        _mm_prefetch((const char *)(wb + c * 32 + PREFETCH), _MM_HINT_T0);
        /* once a 64-byte line: one a chunk slows AVX2's Q6_K at one row */
        if (!(c & 1)) _mm_prefetch((const char *)(wb + c * 32 + PREFETCH_L2), _MM_HINT_T1);
        nibble_values256(_mm256_loadu_si256((const __m256i *)(wb + c * 32)), p4, p5, c, bits, lo, hi);
    }
}

/* Nibble formats: chunks c0..c1 of the block (a group of 16 is two chunks); int8: the whole block. expanded: wb is
 * the block in expand_tile's bytes (hb unused); int8: every weight of the tile is narrow, within +-16 (AVX2 without
 * VNNI: int_tiles.h, narrow_int8_tile) */
static inline __attribute__((always_inline)) void int_block_dots256(
    const int8_t *xq, int64_t K, const uint8_t *wb, const uint8_t *hb, int bits, int expanded, int c0, int c1, int mr,
    __m256i *dot) {
    const __m256i ones = _mm256_set1_epi16(1);
    _Pragma("GCC unroll 8")
    for (int i = 0; i < mr; i++) dot[i] = _mm256_setzero_si256();
    /* the chunk loops stay rolled: unrolled, GCC hoists every product first and spills them */
    if (bits != 8) {
        if (bits > 4 && !expanded) prefetch_stream(hb, PREFETCH / 4 * (bits - 4), PREFETCH_L2 / 4 * (bits - 4));
        __m256i p4 = bits > 4 && !expanded ? _mm256_loadu_si256((const __m256i *)hb)
                   : bits == LUT4 ? table256(hb) : _mm256_setzero_si256();
        __m256i p5 = bits > 5 && !expanded ? _mm256_loadu_si256((const __m256i *)(hb + 32)) : _mm256_setzero_si256();
#ifndef TALLY_VNNI
        /* Q5_0: two chunks' products add up in int16 (4 * 2 * 31 * 127 = 31496) before one widening */
        if (bits == 5 && (c1 - c0) % 2 == 0) {
            _Pragma("GCC unroll 1")
            for (int c = c0; c < c1; c += 2) {
                __m256i lo0, hi0, lo1, hi1;
                chunk_values256(wb, p4, p5, c, bits, expanded, &lo0, &hi0);
                chunk_values256(wb, p4, p5, c + 1, bits, expanded, &lo1, &hi1);
                _Pragma("GCC unroll 8")
                for (int i = 0; i < mr; i++) {
                    const int8_t *xp = xq + i * K + c * 8;
                    __m256i pairs = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_maddubs_epi16(lo0, broadcast4(xp)),
                                         _mm256_maddubs_epi16(hi0, broadcast4(xp + 4))),
                        _mm256_add_epi16(_mm256_maddubs_epi16(lo1, broadcast4(xp + 8)),
                                         _mm256_maddubs_epi16(hi1, broadcast4(xp + 12))));
                    dot[i] = _mm256_add_epi32(dot[i], _mm256_madd_epi16(pairs, ones));
                }
            }
            return;
        }
#endif
        _Pragma("GCC unroll 1")
        for (int c = c0; c < c1; c++) {
            __m256i lo, hi;
            chunk_values256(wb, p4, p5, c, bits, expanded, &lo, &hi);
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++) {  /* int4: int16 sums while in the block (VNNI: int32 at once) */
                const int8_t *xp = xq + i * K + c * 8;
#ifdef TALLY_VNNI
                dot[i] = DPBUSD(DPBUSD(dot[i], lo, broadcast4(xp)), hi, broadcast4(xp + 4));
#else
                if (bits == LUT4) {  /* signed values: the sign trick, each pair widened (2 * 128 * 127 fits int16) */
                    __m256i plo = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(broadcast4(xp), lo));
                    __m256i phi = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi),
                                                       _mm256_sign_epi8(broadcast4(xp + 4), hi));
                    dot[i] = _mm256_add_epi32(dot[i], _mm256_add_epi32(_mm256_madd_epi16(plo, ones),
                                                                       _mm256_madd_epi16(phi, ones)));
                    continue;
                }
                __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast4(xp)),
                                                 _mm256_maddubs_epi16(hi, broadcast4(xp + 4)));
                dot[i] = bits > 4 ? _mm256_add_epi32(dot[i], _mm256_madd_epi16(pairs, ones))
                                  : _mm256_add_epi16(dot[i], pairs);
#endif
            }
        }
    } else {
        _Pragma("GCC unroll 1")
        for (int c = 0; c < 8; c++) {
            _mm_prefetch((const char *)(wb + c * 32 + PREFETCH), _MM_HINT_T0);
            if (!(c & 1)) _mm_prefetch((const char *)(wb + c * 32 + PREFETCH_L2), _MM_HINT_T1);
            __m256i raw = _mm256_loadu_si256((const __m256i *)(wb + c * 32));
            __m256i mag = _mm256_sign_epi8(raw, raw);
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++) {
                __m256i xs = _mm256_sign_epi8(broadcast4(xq + i * K + c * 4), raw);
#ifdef TALLY_VNNI
                dot[i] = DPBUSD(dot[i], mag, xs);
#else
                __m256i pairs = _mm256_maddubs_epi16(mag, xs);
                /* narrow (int_tiles.h: narrow_int8_tile): the block's pairs add up in int16, one widening after */
                dot[i] = expanded ? _mm256_add_epi16(dot[i], pairs)
                                  : _mm256_add_epi32(dot[i], _mm256_madd_epi16(pairs, ones));
#endif
            }
        }
#ifndef TALLY_VNNI
        if (expanded) {
            _Pragma("GCC unroll 8")
            for (int i = 0; i < mr; i++) dot[i] = _mm256_madd_epi16(dot[i], ones);
        }
#endif
    }
#ifndef TALLY_VNNI
    if (bits == 4) {
        _Pragma("GCC unroll 8")
        for (int i = 0; i < mr; i++) dot[i] = _mm256_madd_epi16(dot[i], ones);
    }
#endif
    (void)ones;
}

#if !defined(TALLY_AVX512) && !defined(TALLY_VNNI)
/* int8 at one row (AVX2 without VNNI), the sign trick turned round: the activations' magnitudes, unsigned, against the
 * weights with the activations' signs, both broadcasts made once a call (int_tiles.h: one_row_broadcasts), so a chunk
 * takes one sign where the many-row loop takes two: a decode step's int8 head is bound by these instructions, not by
 * the memory (docs/benchmarks.md#peers-decode-and-prefill). The weights' signs move only where no weight is -128 (its
 * negation wraps), which the caller checks. Integer sums, so the many-row loop's bits. */
#define ONE_ROW_BROADCASTS 1
#define XU_BLOCK 512
static inline __attribute__((always_inline)) void int8_one_row_dots(const uint8_t *xb, const uint8_t *wb,
                                                                    __m256i *dot) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i sum = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int c = 0; c < 8; c++) {
        _mm_prefetch((const char *)(wb + c * 32 + PREFETCH), _MM_HINT_T0);
        if (!(c & 1)) _mm_prefetch((const char *)(wb + c * 32 + PREFETCH_L2), _MM_HINT_T1);
        __m256i ws = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(wb + c * 32)),
                                      _mm256_loadu_si256((const __m256i *)(xb + c * 64)));
        __m256i pairs = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(xb + c * 64 + 32)), ws);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
    }
    dot[0] = sum;
}
#else
#define XU_BLOCK 32
#endif

static inline __attribute__((always_inline)) void int_block_dots(
    const int8_t *xq, const uint8_t *xu, int64_t K, const uint8_t *wb, const uint8_t *hb, int bits, int expanded,
    int c0, int c1, int mr, __m256i *dot) {
#ifdef TALLY_AVX512
    if (!expanded) {
        int_block_dots512(xq, xu, K, wb, hb, bits, c0, c1, mr, dot);
        return;
    }
#endif
#ifdef ONE_ROW_BROADCASTS
    if (xu) {  /* int8, one row: q8_call made the broadcasts */
        int8_one_row_dots(xu, wb, dot);
        /* no rows past the first here (q8_call sets xu for one row only), but GCC cannot tell: the rows dots_into
         * reads are set, which keeps the AVX2 build free of maybe-uninitialized warnings */
        for (int i = 1; i < mr; i++) dot[i] = _mm256_setzero_si256();
        return;
    }
#endif
    (void)xu;
    int_block_dots256(xq, K, wb, hb, bits, expanded, c0, c1, mr, dot);
}
