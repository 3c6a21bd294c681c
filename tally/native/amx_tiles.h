/* AMX (Intel's tile multiply, Sapphire Rapids on): the integer formats' pairs of tiles (int_tiles.h: int_pairs) for
 * 16 activation rows at a time. One TDPBSUD (int8: TDPBSSD) forms 16 rows x 16 outputs of a span's integer dots, the
 * sums the AVX-512 loop forms a row at a time with VPDPBUSD; exact integers either way, then the same float
 * operations per row and output in the same order (int_dots.h: int_tile_pair), so the same bits
 * (tests/test_native_builds_agree.py). A span is a group's part in a block of 32 k: 32, or 16 for Q6_K's groups, so
 * that each span's dots still meet their own scales. Weights: a pair's values expanded once a call (int_dots.h:
 * expand_pair), each block an AMX tile as stored; activations: the int8 rows as quantized, one tile a span with the
 * row stride K.
 * Linux lends a process the tile registers only once it asks (tally_amx_init); library.py builds this where the CPU
 * has the flags and takes the build only where the ask is granted. Included by int_tiles.h. */
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWS 16
static int amx_on;

/* 1 where Linux grants this process the tile registers' state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA), else 0 */
int64_t tally_amx_init(void) {
    amx_on = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return amx_on;
}

typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* The calling thread's tiles: 0-3 four spans' dots (16 x 16 int32), 4-5 activations (16 rows x span bytes), 6-7
 * weights (span / 4 rows of 16 outputs x 4 bytes). Tiles are not renamed as vector registers are: four spans, each on
 * tiles of its own, let their loads, multiplies and stores pipeline. (The float work after them did not overlap the
 * tiles' work on a Xeon, and costs as much: docs/benchmarks.md#tried-and-not-kept.) Constants: GCC drops the stores
 * of a configuration built on the stack before LDTILECFG reads it. */
static const TileConfig AMX_SPAN32 = {1, 0, {0}, {64, 64, 64, 64, 32, 32, 64, 64}, {16, 16, 16, 16, 16, 16, 8, 8}};
static const TileConfig AMX_SPAN16 = {1, 0, {0}, {64, 64, 64, 64, 16, 16, 64, 64}, {16, 16, 16, 16, 16, 16, 4, 4}};

static void amx_configure(int64_t span) {
    _tile_loadconfig(span == 32 ? &AMX_SPAN32 : &AMX_SPAN16);
}

/* dots[q] = spans s + q's integer dots, q < n (1 or 4): 16 rows from xq (row stride K), 16 outputs from v */
#define AMX_SPAN(C, A, B, Q) do { \
        int64_t k0_ = (s + (Q)) * span; \
        _tile_zero(C); \
        _tile_loadd(A, xq + k0_, K); \
        _tile_loadd(B, v + k0_ / 32 * 512 + (k0_ % 32) * 16, 64); \
        if (bits == 8) _tile_dpbssd(C, A, B); \
        else _tile_dpbsud(C, A, B); \
        _tile_stored(C, dots[Q], 64); \
    } while (0)

static inline __attribute__((always_inline)) void amx_span_dots(const int8_t *xq, const uint8_t *v, int64_t K,
                                                                int64_t span, int64_t s, int n, int bits,
                                                                int32_t (*dots)[AMX_ROWS * 16]) {
    AMX_SPAN(0, 4, 6, 0);
    if (n == 1) return;
    AMX_SPAN(1, 5, 7, 1);
    AMX_SPAN(2, 4, 6, 2);
    AMX_SPAN(3, 5, 7, 3);
}
#undef AMX_SPAN

/* Rows r..r + 16 of y, outputs of tiles t and u (u == t: only t's are stored), from v: expand_pair's bytes. The
 * float operations per row, output and span are int_tile_pair's, in its order (`blocked` its: int_tiles.h,
 * dots_into); blocked, a[i] lives across a block's spans, and acc[i], touched once a block, may sit in memory. */
static inline __attribute__((always_inline)) void amx_pair_tile(const IntJob *j, int64_t t, int64_t u,
                                                                const uint8_t *v, GroupValues sa, GroupValues sb,
                                                                GroupValues ma, GroupValues mb, int64_t r, int bits,
                                                                int blocked) {
    int64_t K = j->K, group = j->group, G = K / group, blocks = K / 32, span = span_of(group), spans = K / span;
    int64_t per_group = group / span;
    const float *dx = j->dx + r * blocks, *xsum = j->xsum ? j->xsum + r * G : NULL;
    const int32_t *xoff = j->xoff ? j->xoff + r * spans : NULL;
    int32_t dots[4][AMX_ROWS * 16] __attribute__((aligned(64)));
    __m512 acc[AMX_ROWS], a[AMX_ROWS];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < AMX_ROWS; i++) acc[i] = a[i] = _mm512_setzero_ps();
    for (int64_t s = 0; s < spans;) {
        int n = spans - s >= 4 ? 4 : 1;
        amx_span_dots(j->xq + r * K, v, K, span, s, n, bits, dots);
        for (int q = 0; q < n; q++, s++) {
            int64_t g = s / per_group, b = s * span / 32;
            if (blocked && ma.v && s % per_group == 0) minima_pair_into(a, ma, mb, g, G, xsum, AMX_ROWS);
            __m512 sg = halves_ps(values8(sa, g * TILE), values8(sb, g * TILE));
            _Pragma("GCC unroll 16")
            for (int i = 0; i < AMX_ROWS; i++) {
                __m512i dot = _mm512_load_si512((const void *)(dots[q] + 16 * i));
                if (xoff) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(xoff[i * spans + s]));
                if (blocked) a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sg, a[i]);
                else acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                              _mm512_mul_ps(sg, _mm512_set1_ps(dx[i * blocks + b])), acc[i]);
            }
            if (blocked && block_ends((s + 1) * span, j->xblock)) {
                _Pragma("GCC unroll 16")
                for (int i = 0; i < AMX_ROWS; i++) {
                    acc[i] = _mm512_fmadd_ps(a[i], _mm512_set1_ps(dx[i * blocks + b]), acc[i]);
                    a[i] = _mm512_setzero_ps();
                }
            }
            if (!blocked && ma.v && (s + 1) % per_group == 0) minima_pair_into(acc, ma, mb, g, G, xsum, AMX_ROWS);
        }
    }
    __m256 lo[AMX_ROWS], hi[AMX_ROWS];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < AMX_ROWS; i++) {
        lo[i] = _mm512_castps512_ps256(acc[i]);
        hi[i] = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(acc[i]), 1));
    }
    store_tile(j->y + r * j->N, j->N, t, lo, AMX_ROWS, j->bias, j->accumulate);
    if (u != t) store_tile(j->y + r * j->N, j->N, u, hi, AMX_ROWS, j->bias, j->accumulate);
}

/* Rows m0..m1 (a multiple of 16 of them) of one pair, from expand_pair's bytes v */
static __attribute__((noinline)) void amx_pair_rows(const IntJob *j, int64_t t, int64_t u, const uint8_t *v,
                                                    int64_t m0, int64_t m1, int bits) {
    int64_t G = j->K / j->group;
    GroupValues sa = values_from(j->scale, t * G * TILE), sb = values_from(j->scale, u * G * TILE);
    GroupValues ma = values_from(j->min, t * G * TILE), mb = values_from(j->min, u * G * TILE);
    int blocked = j->xblock > 32;
    for (int64_t r = m0; r < m1; r += AMX_ROWS) {
        if (bits == 8 && blocked) amx_pair_tile(j, t, u, v, sa, sb, ma, mb, r, 8, 1);
        else if (bits == 8) amx_pair_tile(j, t, u, v, sa, sb, ma, mb, r, 8, 0);
        else if (blocked) amx_pair_tile(j, t, u, v, sa, sb, ma, mb, r, 4, 1);
        else amx_pair_tile(j, t, u, v, sa, sb, ma, mb, r, 4, 0);
    }
}
