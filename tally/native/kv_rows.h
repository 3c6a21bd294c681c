/* The KV cache's value formats as the kernels read and write them (included by kernels.c before the attention
 * headers). Arithmetic is fp32 whatever the cache holds: a 16-bit cache halves the bytes a long context's
 * attention reads (the step is bound by them: docs/benchmarks.md#kv-cache) and widens as it loads, one instruction
 * for fp16 (F16C) and two for bf16. int8 values carry a scale per (slot, kv head) beside them, which
 * the callers apply (kernels.c: store_q8). The numbers match tally/native/ops.py's KV_KINDS. */
enum { KV_F32 = 0, KV_I8 = 1, KV_F16 = 2, KV_BF16 = 3 };

static inline int64_t kv_bytes(int kind) { return kind == KV_F32 ? 4 : kind == KV_I8 ? 1 : 2; }

/* 8 values of a row from element i, as fp32; `kind` a constant where it is called in a loop, so each caller's
 * loops are compiled once per format (see the dispatching switches in decode_attention.h) */
static inline __attribute__((always_inline)) __m256 load8(const void *row, int64_t i, int kind) {
    switch (kind) {
        case KV_I8:
            return _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
        case KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
        case KV_BF16:
            return _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
        default: return _mm256_loadu_ps((const float *)row + i);
    }
}

/* 8 floats -> 8 bf16, rounded to nearest even, as torch's .to(torch.bfloat16) (NaN aside) */
static inline void store_bf16x8(uint16_t *dst, __m256 v) {
    __m256i u = _mm256_castps_si256(v);
    u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
                                             _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    u = _mm256_srli_epi32(u, 16);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0x08);
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(packed));
}

/* dst[0..n) of a float cache (fp32, fp16, bf16) = x[0..n), n a multiple of 8; rounded to nearest even as torch's
 * casts round, so the native and the PyTorch writes of a token leave the same bits */
static void store_row(void *dst, const float *x, int64_t n, int kind) {
    if (kind == KV_F16)
        for (int64_t i = 0; i < n; i += 8)
            _mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else if (kind == KV_BF16)
        for (int64_t i = 0; i < n; i += 8) store_bf16x8((uint16_t *)dst + i, _mm256_loadu_ps(x + i));
    else
        memcpy(dst, x, sizeof(float) * n);
}

/* out[0..n) = a 16-bit or int8 row's values as fp32, n a multiple of 8 */
static inline void widen_row(const void *src, float *out, int64_t n, int kind) {
    if (kind == KV_F16)
        for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, load8(src, i, KV_F16));
    else if (kind == KV_I8)
        for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, load8(src, i, KV_I8));
    else
        for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, load8(src, i, KV_BF16));
}
