/* The packed runner's element-wise glue between projections, for bf16 on CPU: RMSNorm,
 * residual add + RMSNorm, RoPE with the KV-cache write and SiLU(gate) * up, each one pass
 * over its rows instead of a chain of framework ops, and a per-row decode attention
 * (batch-invariant; on AVX512 also a candidate the runner times against SDPA at load;
 * backends/hf/model/glue.py explains why and how the library is loaded).
 *
 * Every row is computed alone, in a fixed order that does not depend on how many rows a
 * call has, so a sequence gets the same bits alone and in any batch. Built with
 * -ffp-contract=off, so every ISA clone below rounds exactly like the scalar code (the
 * attention's AVX512 path is written apart, in an order of its own).
 * bf16 values travel as uint16_t; rounding to bf16 is round-to-nearest-even, NaN to
 * 0x7FC0, as PyTorch rounds. Stateless; safe from any thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define GLUE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GLUE_CLONES
#endif

#define LANES 16

/* From this many values a call, the element-wise kernels split their rows over the
 * calling thread's OpenMP team (each row is still computed alone, so the bits do not
 * change): a 512-row SiLU * up of SmolLM2 took 0.70 ms on one thread against the
 * framework's 0.30 on two. Below it one thread: a one-row step's calls are a few
 * microseconds, less than waking the team. 8,192 puts SmolLM2's 16-row decode step's
 * SiLU * up, norms and RoPE on both threads (at 32,768 none of them were): 40-47 µs a
 * call on one thread; with the attention's THREADED_KEYS below, that step went from 26.2
 * to 23.0 ms (bf16, 64 positions; 18.1 to 14.8 at int4; two threads, scratch A/B). */
#define THREADED_VALUES 8192

/* Sum of squares in LANES fixed accumulators, folded pairwise: the same order for any
 * vector width the compiler picks. */
static inline float sum_squares(const uint16_t* x, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; ++j) {
      float v = from_bf16(x[i + j]);
      acc[j] += v * v;
    }
  for (int j = 0; i < n; ++i, ++j) {
    float v = from_bf16(x[i]);
    acc[j] += v * v;
  }
  for (int width = LANES / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

/* transformers' LlamaRMSNorm: normalise in fp32, round to bf16, then times the weight. */
static inline void norm_row(const uint16_t* x, const uint16_t* w, uint16_t* out, int64_t n,
                            float eps) {
  float inv = 1.0f / sqrtf(sum_squares(x, n) / (float)n + eps);
  for (int64_t i = 0; i < n; ++i)
    out[i] = to_bf16(from_bf16(to_bf16(from_bf16(x[i]) * inv)) * from_bf16(w[i]));
}

GLUE_CLONES
void llmso_rms_norm(const uint16_t* x, int64_t x_stride, const uint16_t* w, uint16_t* out,
                    int64_t rows, int64_t n, float eps) {
#pragma omp parallel for schedule(static) if (rows * n >= THREADED_VALUES)
  for (int64_t r = 0; r < rows; ++r) norm_row(x + r * x_stride, w, out + r * n, n, eps);
}

/* sum = x + residual (rounded to bf16, the new residual stream); out = RMSNorm(sum). */
GLUE_CLONES
void llmso_add_rms_norm(const uint16_t* x, const uint16_t* residual, const uint16_t* w,
                        uint16_t* sum, uint16_t* out, int64_t rows, int64_t n, float eps) {
#pragma omp parallel for schedule(static) if (rows * n >= THREADED_VALUES)
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* xr = x + r * n;
    const uint16_t* rr = residual + r * n;
    uint16_t* sr = sum + r * n;
    for (int64_t i = 0; i < n; ++i) sr[i] = to_bf16(from_bf16(xr[i]) + from_bf16(rr[i]));
    norm_row(sr, w, out + r * n, n, eps);
  }
}

/* RoPE of one head's first `rotary` features (the rest copied):
 * dst = src * cos + flip_halves(src) * sin_signed, each product rounded to bf16 and then
 * the sum, as the framework ops round. */
static inline void rope_head(const uint16_t* src, const uint16_t* c, const uint16_t* s,
                             uint16_t* dst, int64_t rotary, int64_t head_dim) {
  const int64_t half = rotary / 2;
  for (int64_t i = 0; i < half; ++i) {
    float a = from_bf16(to_bf16(from_bf16(src[i]) * from_bf16(c[i])));
    float b = from_bf16(to_bf16(from_bf16(src[i + half]) * from_bf16(s[i])));
    dst[i] = to_bf16(a + b);
  }
  for (int64_t i = half; i < rotary; ++i) {
    float a = from_bf16(to_bf16(from_bf16(src[i]) * from_bf16(c[i])));
    float b = from_bf16(to_bf16(from_bf16(src[i - half]) * from_bf16(s[i])));
    dst[i] = to_bf16(a + b);
  }
  for (int64_t i = rotary; i < head_dim; ++i) dst[i] = src[i];
}

/* A layer's RoPE and KV-cache write in one pass (what a RoPE call and two index copies
 * did): row r's `heads` query heads (qk's first) rotated into q_out [rows, heads,
 * head_dim]; its `kv_heads` keys (qk's next) rotated and its values (v) copied into row
 * write_rows[r * kv_heads + h] of the flat caches [*, head_dim]. The same bits as the
 * separate calls. A step's rows write distinct cache rows, so rows may run in parallel. */
GLUE_CLONES
void llmso_rope_store(const uint16_t* qk, int64_t qk_stride, const uint16_t* v,
                      int64_t v_stride, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      int64_t rotary, const uint16_t* cos, const uint16_t* sin,
                      uint16_t* q_out, uint16_t* k_cache, uint16_t* v_cache,
                      const int64_t* write_rows, int64_t rows) {
#pragma omp parallel for schedule(static) \
    if (rows * (heads + kv_heads) * head_dim >= THREADED_VALUES)
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* c = cos + r * rotary;
    const uint16_t* s = sin + r * rotary;
    const uint16_t* src = qk + r * qk_stride;
    for (int64_t h = 0; h < heads; ++h)
      rope_head(src + h * head_dim, c, s, q_out + (r * heads + h) * head_dim, rotary,
                head_dim);
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t at = write_rows[r * kv_heads + h] * head_dim;
      rope_head(src + (heads + h) * head_dim, c, s, k_cache + at, rotary, head_dim);
      memcpy(v_cache + at, v + r * v_stride + h * head_dim, (size_t)head_dim * sizeof(uint16_t));
    }
  }
}

/* e^x to ~1 ulp where a float holds it, +inf above (as expf overflows: SiLU of x < -88 is
 * then -0, as PyTorch's); below, 2^-126 times the polynomial instead of a subnormal or 0
 * (1 + e^x is 1 either way).
 * Cephes' expf polynomial, written so that every ISA clone vectorizes it: rounding by the
 * 1.5 * 2^23 trick, the clamp on the integer exponent (a float select kept GCC 12 scalar),
 * no libm call. */
static inline float exp_poly(float x) {
  const float magic = 12582912.0f;
  float n = (x * 1.44269504088896341f + magic) - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t e = (int32_t)n + 127;
  e = e < 1 ? 1 : e;
  e = e > 255 ? 255 : e; /* 255: the bits of +inf */
  uint32_t bits = (uint32_t)e << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* Each row holds [gate | up], `inter` values each: out = SiLU(gate) * up, the SiLU rounded
 * to bf16 before the product as the framework's two ops round. */
static inline void silu_mul_row(const uint16_t* restrict g, const uint16_t* restrict u,
                                uint16_t* restrict o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float x = from_bf16(g[i]);
    float silu = from_bf16(to_bf16(x / (1.0f + exp_poly(-x))));
    o[i] = to_bf16(silu * from_bf16(u[i]));
  }
}

GLUE_CLONES
void llmso_silu_mul(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= THREADED_VALUES)
  for (int64_t r = 0; r < rows; ++r)
    silu_mul_row(gate_up + r * 2 * inter, gate_up + r * 2 * inter + inter, out + r * inter,
                 inter);
}

/* One decode row's attention for one kv head: `group` query heads (fp32, scaled) over
 * keys first..last of that head's cache rows, in order; writes bf16 outputs. Reads only
 * the row's own keys, in one fixed order, so the result is the same whatever the batch
 * and however far other rows' spans reach. */
static inline void attend_head(const float* q, int64_t group, int64_t hd, const uint16_t* k,
                               const uint16_t* v, int64_t pos_stride, int64_t first,
                               int64_t last, float* scores, float* acc, uint16_t* out) {
  const int64_t span = last - first + 1;
  for (int64_t g = 0; g < group; ++g) {
    const float* qg = q + g * hd;
    float* sg = scores + g * span;
    float top = -INFINITY;
    for (int64_t j = 0; j < span; ++j) {
      const uint16_t* kj = k + (first + j) * pos_stride;
      float lanes[LANES] = {0};
      int64_t i = 0;
      for (; i + LANES <= hd; i += LANES)
        for (int l = 0; l < LANES; ++l) lanes[l] += qg[i + l] * from_bf16(kj[i + l]);
      for (int l = 0; i < hd; ++i, ++l) lanes[l] += qg[i] * from_bf16(kj[i]);
      for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
      sg[j] = lanes[0];
      top = lanes[0] > top ? lanes[0] : top;
    }
    float total = 0.0f;
    for (int64_t j = 0; j < span; ++j) {
      sg[j] = exp_poly(sg[j] - top);
      total += sg[j];
    }
    float* ag = acc + g * hd;
    for (int64_t i = 0; i < hd; ++i) ag[i] = 0.0f;
    for (int64_t j = 0; j < span; ++j) {
      const uint16_t* vj = v + (first + j) * pos_stride;
      const float p = sg[j];
      for (int64_t i = 0; i < hd; ++i) ag[i] += p * from_bf16(vj[i]);
    }
    const float inv = 1.0f / total;
    for (int64_t i = 0; i < hd; ++i) out[g * hd + i] = to_bf16(ag[i] * inv);
  }
}

/* The loops above for every row, one thread: the path of CPUs without AVX512 (and of
 * head sizes the vector path does not take). */
GLUE_CLONES
static void decode_attention_portable(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                      int64_t slot_stride, int64_t head_stride,
                                      int64_t pos_stride, const int64_t* bounds, int64_t rows,
                                      int64_t heads, int64_t kv_heads, int64_t hd, float scale,
                                      float* scratch, uint16_t* out) {
  const int64_t group = heads / kv_heads;
  float* qf = scratch;
  float* acc = qf + heads * hd;
  float* scores = acc + group * hd;
  for (int64_t d = 0; d < rows; ++d) {
    for (int64_t i = 0; i < heads * hd; ++i) qf[i] = from_bf16(q[d * heads * hd + i]) * scale;
    const int64_t first = bounds[2 * d], last = bounds[2 * d + 1];
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t base = d * slot_stride + h * head_stride;
      attend_head(qf + h * group * hd, group, hd, k + base, v + base, pos_stride, first, last,
                  scores, acc, out + (d * heads + h * group) * hd);
    }
  }
}

/* The longest row's span of `bounds` (first, last per row), and all rows' spans summed. */
static int64_t longest_span(const int64_t* bounds, int64_t rows, int64_t* total) {
  int64_t longest = 0;
  *total = 0;
  for (int64_t d = 0; d < rows; ++d) {
    const int64_t span = bounds[2 * d + 1] - bounds[2 * d] + 1;
    longest = span > longest ? span : longest;
    *total += span;
  }
  return longest;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define ALWAYS_INLINE __attribute__((always_inline)) static inline
#define MAX_GROUP 16 /* query heads per kv head */
#define MAX_CHUNKS 16 /* head_dim / 16 */

/* 32 bf16 values as two fp32 vectors, the even-indexed ones and the odd: one load and
 * two bit operations, no widening shuffle. A dot product's terms then come in another
 * order, the same for every key. */
AVX512 static inline void load_bf16_pairs(const uint16_t* p, __m512* even, __m512* odd) {
  const __m512i x = _mm512_loadu_si512(p);
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* load_bf16_pairs undone: 32 bf16 values stored in order */
AVX512 static inline void store_bf16_pairs(uint16_t* p, __m512 even, __m512 odd) {
  const __m512i both =
      _mm512_or_si512(round_bf16x16(even), _mm512_slli_epi32(round_bf16x16(odd), 16));
  _mm512_storeu_si512(p, both);
}

/* exp_poly on 16 lanes, the same operations (so the same values) */
AVX512 static inline __m512 exp_poly16(__m512 x) {
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(
      _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), magic), magic);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  static const float coef[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                               1.6666665459e-1f, 5.0000001201e-1f};
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (int i = 0; i < 5; ++i) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(coef[i]));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
                    _mm512_set1_ps(1.0f));
  __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127));
  e = _mm512_min_epi32(_mm512_max_epi32(e, _mm512_set1_epi32(1)), _mm512_set1_epi32(255));
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
}

/* Lane j: the sum of d[j]'s 16 lanes, by halving (256-bit halves, 128-bit quarters, then
 * within quarters), the same order for every j; the last step leaves key k + 4m in lane
 * 4k + m, which the permute undoes. */
AVX512 static inline __m512 sum16(const __m512* d) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(d[2 * i], d[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  const __m512 mixed = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88),
                                     _mm512_shuffle_ps(c[0], c[1], 0xDD));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, mixed);
}

/* Sums per head and 16-lane chunk that fit in registers beside a value row's chunks */
#define FUSED_SUMS 16

/* The weighted sum of value rows for all `group` heads at once, each value row converted
 * once: every head's sums add the same terms in the same order as head by head, so the
 * same bits (SmolLM2: 3 heads of 64 per kv head, 12 sums). */
AVX512 ALWAYS_INLINE void values_all_heads(const int64_t chunks, const int64_t group,
                                           const uint16_t* v, int64_t pos_stride,
                                           int64_t first, int64_t span, const float* scores,
                                           const float* total, uint16_t* out) {
  __m512 acc[FUSED_SUMS], row[MAX_CHUNKS];
  for (int64_t a = 0; a < group * chunks; ++a) acc[a] = _mm512_setzero_ps();
  for (int64_t j = 0; j < span; ++j) {
    const uint16_t* vj = v + (first + j) * pos_stride;
    for (int64_t c = 0; c < chunks; c += 2) load_bf16_pairs(vj + 16 * c, row + c, row + c + 1);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * span + j]);
      for (int64_t c = 0; c < chunks; ++c)
        acc[g * chunks + c] = _mm512_fmadd_ps(p, row[c], acc[g * chunks + c]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const __m512 inv = _mm512_set1_ps(1.0f / total[g]);
    for (int64_t c = 0; c < chunks; c += 2)
      store_bf16_pairs(out + g * 16 * chunks + 16 * c, _mm512_mul_ps(acc[g * chunks + c], inv),
                       _mm512_mul_ps(acc[g * chunks + c + 1], inv));
  }
}

/* attend_head with vectors: each key converted once for the group's query heads (the
 * scalar loop converts it per head), a key's dot products reduced in one vector sum, the
 * exponentials 16 at a time. Still one row alone, in one fixed order: batch-invariant. */
AVX512 ALWAYS_INLINE void attend_head16(const int64_t chunks, const uint16_t* q, float scale,
                                        int64_t group, const uint16_t* k, const uint16_t* v,
                                        int64_t pos_stride, int64_t first, int64_t last,
                                        float* scores, uint16_t* out) {
  const int64_t span = last - first + 1, hd = 16 * chunks;
  __m512 qv[MAX_GROUP * MAX_CHUNKS], part[MAX_CHUNKS];
  __m512 dots[MAX_GROUP * 16];
  float top[MAX_GROUP], total[MAX_GROUP];
  for (int64_t g = 0; g < group; ++g) {
    __m512* qg = qv + g * chunks;
    for (int64_t c = 0; c < chunks; c += 2) {
      load_bf16_pairs(q + g * hd + 16 * c, qg + c, qg + c + 1);
      qg[c] = _mm512_mul_ps(qg[c], _mm512_set1_ps(scale));
      qg[c + 1] = _mm512_mul_ps(qg[c + 1], _mm512_set1_ps(scale));
    }
  }
  /* scores 16 keys at a time: per key and head a vector of partial sums, then the 16
   * vectors summed across lanes together (sum16) */
  __m512 top16[MAX_GROUP];
  for (int64_t g = 0; g < group; ++g) top16[g] = _mm512_set1_ps(-INFINITY);
  for (int64_t j0 = 0; j0 < span; j0 += 16) {
    const int n = span - j0 >= 16 ? 16 : (int)(span - j0);
    const __mmask16 live = n == 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
    for (int i = 0; i < 16; ++i) {
      if (i >= n) {
        for (int64_t g = 0; g < group; ++g) dots[g * 16 + i] = _mm512_setzero_ps();
        continue;
      }
      const uint16_t* kj = k + (first + j0 + i) * pos_stride;
      for (int64_t c = 0; c < chunks; c += 2)
        load_bf16_pairs(kj + 16 * c, part + c, part + c + 1);
      for (int64_t g = 0; g < group; ++g) {
        __m512 dot = _mm512_mul_ps(qv[g * chunks], part[0]);
        for (int64_t c = 1; c < chunks; ++c)
          dot = _mm512_fmadd_ps(qv[g * chunks + c], part[c], dot);
        dots[g * 16 + i] = dot;
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const __m512 s16 = sum16(dots + g * 16);
      _mm512_mask_storeu_ps(scores + g * span + j0, live, s16);
      top16[g] = _mm512_mask_max_ps(top16[g], live, top16[g], s16);
    }
  }
  for (int64_t g = 0; g < group; ++g) top[g] = _mm512_reduce_max_ps(top16[g]);
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * span;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < span; j += 16) {
      const __mmask16 live = span - j >= 16 ? 0xFFFF : (__mmask16)((1u << (span - j)) - 1);
      const __m512 e =
          exp_poly16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, sg + j), _mm512_set1_ps(top[g])));
      _mm512_mask_storeu_ps(sg + j, live, e);
      sum = _mm512_mask_add_ps(sum, live, sum, e);
    }
    total[g] = _mm512_reduce_add_ps(sum);
  }
  /* a constant head count keeps every head's sums in registers; the bound is checked
   * per case, where the compiler sees it, so no case indexes past acc[FUSED_SUMS] */
#define ALL_HEADS(G)                                                                  \
  case G:                                                                             \
    if ((G) * chunks > FUSED_SUMS) break;                                             \
    values_all_heads(chunks, G, v, pos_stride, first, span, scores, total, out);      \
    return;
  switch (group) {
    ALL_HEADS(1)
    ALL_HEADS(2)
    ALL_HEADS(3)
    ALL_HEADS(4)
    default:
      break;
  }
#undef ALL_HEADS
  /* head by head, so that its accumulators stay in registers (each value row is
   * converted once per head: cheaper than keeping all heads' sums in memory) */
  for (int64_t g = 0; g < group; ++g) {
    __m512 acc[MAX_CHUNKS];
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
    const float* sg = scores + g * span;
    for (int64_t j = 0; j < span; ++j) {
      const uint16_t* vj = v + (first + j) * pos_stride;
      const __m512 p = _mm512_set1_ps(sg[j]);
      for (int64_t c = 0; c < chunks; c += 2) {
        __m512 even, odd;
        load_bf16_pairs(vj + 16 * c, &even, &odd);
        acc[c] = _mm512_fmadd_ps(p, even, acc[c]);
        acc[c + 1] = _mm512_fmadd_ps(p, odd, acc[c + 1]);
      }
    }
    const __m512 inv = _mm512_set1_ps(1.0f / total[g]);
    for (int64_t c = 0; c < chunks; c += 2)
      store_bf16_pairs(out + g * hd + 16 * c, _mm512_mul_ps(acc[c], inv),
                       _mm512_mul_ps(acc[c + 1], inv));
  }
}

/* attend_head16 compiled per head size (a constant count of 16-lane chunks lets the
 * compiler keep a key's chunks and a head's sums in registers) */
AVX512 static void attend_head_avx512(int64_t hd, const uint16_t* q, float scale,
                                      int64_t group, const uint16_t* k, const uint16_t* v,
                                      int64_t pos_stride, int64_t first, int64_t last,
                                      float* scores, uint16_t* out) {
#define HEAD(HD)                                                                        \
  case HD:                                                                              \
    attend_head16(HD / 16, q, scale, group, k, v, pos_stride, first, last, scores, out); \
    break;
  switch (hd) {
    HEAD(64)
    HEAD(96)
    HEAD(128)
    HEAD(256)
    default:
      attend_head16(hd / 16, q, scale, group, k, v, pos_stride, first, last, scores, out);
  }
#undef HEAD
}

/* (row, kv head) pairs split over the calling thread's OpenMP team when there is enough
 * work to pay for waking it: from 512 keys a call (one row from ~170 positions on
 * SmolLM2's 3 kv heads). At 4,096, 16 rows at 64 positions and 4 rows at 256 ran on one
 * thread: the 4-row step at 256 positions went from 22.6 to 20.6 ms with 512 (bf16; 14.3
 * to 11.0 at int4), one row at 256 from 19.2 to 18.7 (scratch A/B, two threads). */
#define THREADED_KEYS 512

AVX512 static int decode_attention_avx512(const uint16_t* q, const uint16_t* k,
                                          const uint16_t* v, int64_t slot_stride,
                                          int64_t head_stride, int64_t pos_stride,
                                          const int64_t* bounds, int64_t rows, int64_t heads,
                                          int64_t kv_heads, int64_t hd, float scale,
                                          uint16_t* out) {
  const int64_t group = heads / kv_heads, pairs = rows * kv_heads;
  int64_t keys;
  const int64_t longest = longest_span(bounds, rows, &keys);
  keys *= kv_heads;
  float* scores = malloc((size_t)(pairs * group * longest) * sizeof(float));
  if (scores == NULL) return -1;
#pragma omp parallel for schedule(static) if (keys >= THREADED_KEYS)
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t d = pair / kv_heads, h = pair % kv_heads;
    const int64_t base = d * slot_stride + h * head_stride;
    attend_head_avx512(hd, q + (d * heads + h * group) * hd, scale, group, k + base, v + base,
                       pos_stride, bounds[2 * d], bounds[2 * d + 1],
                       scores + pair * group * longest, out + (d * heads + h * group) * hd);
  }
  free(scores);
  return 0;
}
#endif

/* Decode attention over the slot cache: row d (slot d) has its query q[d] ([heads, hd]
 * bf16) and attends to positions bounds[2d]..bounds[2d+1] of its slot (its window and
 * causal limit). k/v: one layer's cache, strides in elements (slot, kv head, position;
 * features contiguous). With AVX512 (head_dim a multiple of 32 up to 256, at most 16
 * query heads per kv head) the vector path runs, unless `portable`: its own order, so
 * other bits than the portable loops', but as invariant to the batch. Returns 0, or -1
 * when out of memory. */
int llmso_decode_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                           int64_t slot_stride, int64_t head_stride, int64_t pos_stride,
                           const int64_t* bounds, int64_t rows, int64_t heads, int64_t kv_heads,
                           int64_t hd, float scale, uint16_t* out, int portable) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const int vector = !portable && __builtin_cpu_supports("avx512f") &&
                     __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma") &&
                     hd % 32 == 0 && hd / 16 <= MAX_CHUNKS && heads / kv_heads <= MAX_GROUP;
  if (vector)
    return decode_attention_avx512(q, k, v, slot_stride, head_stride, pos_stride, bounds, rows,
                                   heads, kv_heads, hd, scale, out);
#endif
  (void)portable;
  int64_t keys;
  const int64_t longest = longest_span(bounds, rows, &keys);
  const int64_t group = heads / kv_heads;
  float* scratch = malloc((size_t)(heads * hd + group * (hd + longest)) * sizeof(float));
  if (scratch == NULL) return -1;
  decode_attention_portable(q, k, v, slot_stride, head_stride, pos_stride, bounds, rows, heads,
                            kv_heads, hd, scale, scratch, out);
  free(scratch);
  return 0;
}
