/* The gated MLP's activation: act(gate) * up, tally_gated_mul. Included by kernels.c after vec_math.h (exp256) and
 * pool.h. */

/* ---- act(gate) * up: gate_up [M, 2I] (gate, up) -> y [M, I], act SiLU, GELU-tanh (Gemma) or clamped SwiGLU -----
 * GELU-tanh as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 x (1 + tanh u) exactly, without 1 + tanh's
 * cancellation where u is very negative. Clamped SwiGLU (GPT-OSS's experts): the gate clamped above at `limit`, up
 * at +-limit, then (up + 1) * gate * sigmoid(alpha gate). Rows over the kernels' threads where there are many, an
 * element's exp and divide counted as 16 multiply-adds (PAR_MIN); each row's values are the same on any thread
 * count. At prompt sizes it is memory-bound. */
enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_CLAMPED_SWIGLU = 2 };
typedef struct { const float *gate_up; float *y; int64_t I; int act; float alpha, limit; } GatedJob;

static inline float gelu_arg(float g) { return -2.0f * 0.7978845608028654f * (g + 0.044715f * g * g * g); }

static void gated_rows(const void *job, int64_t r0, int64_t r1) {
    const GatedJob *j = job;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 k0 = _mm256_set1_ps(-2.0f * 0.7978845608028654f), k1 = _mm256_set1_ps(0.044715f);
    const __m256 limit = _mm256_set1_ps(j->limit), low = _mm256_set1_ps(-j->limit);
    const __m256 minus_alpha = _mm256_set1_ps(-j->alpha);
    const int clamped = j->act == ACT_CLAMPED_SWIGLU;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = j->gate_up + r * 2 * j->I, *u = g + j->I;
        float *yr = j->y + r * j->I;
        int64_t i = 0;
        for (; i + 8 <= j->I; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
            if (clamped) {
                gv = _mm256_min_ps(gv, limit);
                uv = _mm256_add_ps(_mm256_max_ps(_mm256_min_ps(uv, limit), low), one);
            }
            __m256 arg = j->act == ACT_SILU ? _mm256_sub_ps(zero, gv)
                : clamped ? _mm256_mul_ps(minus_alpha, gv)
                : _mm256_mul_ps(k0, _mm256_fmadd_ps(_mm256_mul_ps(k1, gv), _mm256_mul_ps(gv, gv), gv));
            __m256 a = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(arg)));
            _mm256_storeu_ps(yr + i, _mm256_mul_ps(a, uv));
        }
        for (; i < j->I; i++) {
            float gi = clamped ? fminf(g[i], j->limit) : g[i];
            float ui = clamped ? fmaxf(fminf(u[i], j->limit), -j->limit) + 1.0f : u[i];
            float arg = j->act == ACT_SILU ? -gi : clamped ? -j->alpha * gi : gelu_arg(gi);
            yr[i] = gi / (1.0f + expf(arg)) * ui;
        }
    }
}

/* alpha and limit: clamped SwiGLU's (unused by the others) */
void tally_gated_mul(const float *gate_up, float *y, int64_t M, int64_t I, int act, float alpha, float limit) {
    GatedJob job = {gate_up, y, I, act, alpha, limit};
    parallel_for(M, M * I * 16, gated_rows, &job);
}
