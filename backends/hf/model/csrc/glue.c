/* The packed runner's element-wise glue between projections, for bf16 on CPU: RMSNorm,
 * residual add + RMSNorm, RoPE and SiLU(gate) * up, each one pass over its rows instead of
 * a chain of framework ops, and a per-row decode attention for batch invariance
 * (backends/hf/model/glue.py explains why and how it is loaded).
 *
 * Every row is computed alone, in a fixed order that does not depend on how many rows a
 * call has, so a sequence gets the same bits alone and in any batch. Built with
 * -ffp-contract=off, so every ISA clone below rounds exactly like the scalar code.
 * bf16 values travel as uint16_t; rounding to bf16 is round-to-nearest-even, NaN to
 * 0x7FC0, as PyTorch rounds. Stateless; safe from any thread.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define GLUE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GLUE_CLONES
#endif

#define LANES 16

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
  for (int64_t r = 0; r < rows; ++r) norm_row(x + r * x_stride, w, out + r * n, n, eps);
}

/* sum = x + residual (rounded to bf16, the new residual stream); out = RMSNorm(sum). */
GLUE_CLONES
void llmso_add_rms_norm(const uint16_t* x, const uint16_t* residual, const uint16_t* w,
                        uint16_t* sum, uint16_t* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* xr = x + r * n;
    const uint16_t* rr = residual + r * n;
    uint16_t* sr = sum + r * n;
    for (int64_t i = 0; i < n; ++i) sr[i] = to_bf16(from_bf16(xr[i]) + from_bf16(rr[i]));
    norm_row(sr, w, out + r * n, n, eps);
  }
}

/* RoPE over the first `rotary` features of each of `heads` heads per row (the rest copied):
 * out = x * cos + flip_halves(x) * sin_signed, each product rounded to bf16 and then the
 * sum, as the framework ops round. cos/sin: one row of `rotary` values per token row. */
GLUE_CLONES
void llmso_rope(const uint16_t* x, int64_t x_stride, int64_t heads, int64_t head_dim,
                int64_t rotary, const uint16_t* cos, const uint16_t* sin, uint16_t* out,
                int64_t rows) {
  const int64_t half = rotary / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* c = cos + r * rotary;
    const uint16_t* s = sin + r * rotary;
    for (int64_t h = 0; h < heads; ++h) {
      const uint16_t* src = x + r * x_stride + h * head_dim;
      uint16_t* dst = out + (r * heads + h) * head_dim;
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

/* Decode attention over the slot cache: row d (slot d) has its query q[d] ([heads, hd]
 * bf16) and attends to positions bounds[2d]..bounds[2d+1] of its slot (its window and
 * causal limit). k/v: one layer's cache, strides in elements (slot, kv head, position;
 * features contiguous). scratch: heads * hd + group * (hd + the longest row's span)
 * floats. */
GLUE_CLONES
void llmso_decode_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                            int64_t slot_stride, int64_t head_stride, int64_t pos_stride,
                            const int64_t* bounds, int64_t rows, int64_t heads,
                            int64_t kv_heads, int64_t hd, float scale, float* scratch,
                            uint16_t* out) {
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
