/* Small vector helpers the kernels share: a horizontal sum, e^x on 8 floats (AVX-512: 16) and tanh(x) on 8.
 * Included by kernels.c first, before every kernel that uses them. */

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x, |relative error| < 2e-7 (Cephes' polynomial, as in the usual SIMD math libraries); x is clamped to
 * [-87.3, 88.4], so very negative scores give ~0, never NaN. One body for 8 lanes (exp256) and 16 (exp512, the
 * AVX-512 builds): the same operations lane by lane, so the same bits. */
#define DEFINE_EXP(NAME, V, VI, P, ROUND, INT_AS_FLOAT)                                                      \
    static inline V NAME(V x) {                                                                           \
        x = P##_min_ps(P##_max_ps(x, P##_set1_ps(-87.3f)), P##_set1_ps(88.3762626647949f));               \
        V n = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)));                                    \
        x = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                                \
        x = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), x);                                             \
        V y = P##_set1_ps(1.9875691500e-4f);                                                               \
        y = P##_fmadd_ps(y, x, P##_set1_ps(1.3981999507e-3f));                                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(8.3334519073e-3f));                                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(4.1665795894e-2f));                                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(1.6666665459e-1f));                                             \
        y = P##_fmadd_ps(y, x, P##_set1_ps(5.0000001201e-1f));                                             \
        y = P##_fmadd_ps(y, P##_mul_ps(x, x), P##_add_ps(x, P##_set1_ps(1.0f)));                          \
        VI e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23);                \
        return P##_mul_ps(y, INT_AS_FLOAT(e));                                                             \
    }
#define ROUND_NEAREST256(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
DEFINE_EXP(exp256, __m256, __m256i, _mm256, ROUND_NEAREST256, _mm256_castsi256_ps)
#ifdef __AVX512F__
#define ROUND_NEAREST512(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
DEFINE_EXP(exp512, __m512, __m512i, _mm512, ROUND_NEAREST512, _mm512_castsi512_ps)
#endif

/* tanh(x), |error| < 2e-7: Cephes' odd polynomial below 0.625, 1 - 2 / (e^2|x| + 1) above (no cancellation there) */
static inline __m256 tanh256(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 ax = _mm256_andnot_ps(sign, x), s = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, s), x, x);
    __m256 e = exp256(_mm256_add_ps(ax, ax));
    __m256 large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    large = _mm256_or_ps(large, _mm256_and_ps(x, sign));
    return _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}
