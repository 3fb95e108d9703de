/* Projections with integer weights and integer activations: exact integer dot products
 * (backends/hf/model/linears.py's IntDot packs the weights and calls this).
 *
 * Weights, per output and group of 32 inputs, with fp16 scales:
 *   4 bits: w = q * s + m, q in 0..15 (GGUF's Q4_1 grid);
 *   8 bits: w = q * s, q in -127..127 (GGUF's Q8_0 grid), stored as q + 128.
 * Each call rounds its activations per row and group of 32 to integers, x ~= d * a:
 *   8 bits: a in -127..127, d = max|x| / 127 (GGUF's Q8_1);
 *   16 bits ("wide"): a = 256 hi + lo with hi, lo signed bytes, |a| <= 32639 (so that hi
 *   fits), finer than bf16 for any value above 1/128 of its group's largest.
 * Then, with A_g = sum_i a_i and X_g = sum_i x_i (as given),
 *   4 bits: y = sum_g (s_g d_g) * sum_i q_i a_i + m_g * X_g
 *   8 bits: y = sum_g (s_g d_g) * (sum_i (q_i + 128) a_i - 128 A_g)
 * The inner sums are exact int32 (VPDPBUSD multiplies unsigned by signed bytes; wide
 * activations take one per byte, 256 * hi-sum + lo-sum). Only the outer sum rounds, in
 * the same order for every row whatever the number of rows or threads, so a sequence's
 * bits never depend on its batch.
 *
 * Layout, per tile of 16 outputs and group g (a tile's groups one after another, so a
 * tile is one sequential stream); a step is one VPDPBUSD, lane j summing 4 inputs of
 * output j against the row's 4 activations broadcast:
 *   4 bits (320 bytes): 4 x 64 bytes of nibbles, then s[16], then m[16]. Byte 4j + e of
 *     chunk u holds q[j][4u + e] (low nibble, step u) and q[j][4u + 16 + e] (high, step
 *     u + 4).
 *   8 bits (544 bytes): 8 x 64 bytes, byte 4j + e of step t holding q[j][4t + e] + 128;
 *     then s[16].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define GROUP 32
#define TILE 16
#define ROWS 4 /* rows sharing one load of a tile's group (8 measured slower) */
#define NARROW_MAX 127.0f
#define WIDE_MAX 32639.0f /* (32639 + 128) >> 8 = 127: the high byte fits */

static int64_t tile_bytes(int bits) { return bits == 4 ? 320 : 544; }

/* Rows of activations as integers: a[k] (wide: the high bytes, lo[k] the low ones), per
 * group d, X, and the integer sums of a and lo (for 8-bit weights' offset). */
typedef struct {
  int8_t *a, *lo;
  float *d, *xs;
  int32_t *sum, *sum_lo;
} Acts;

/* X_g, in the order of quantize_row_vnni's vector halvings: i + 16, then i + 8, 4, 2, 1. */
static float group_sum(const float* v) {
  float s[16];
  for (int i = 0; i < 16; ++i) s[i] = v[i] + v[i + 16];
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) s[i] = s[i] + s[i + w];
  return s[0];
}

static void quantize_row(const void* x, int f32, int64_t k, Acts out) {
  const float top = out.lo ? WIDE_MAX : NARROW_MAX;
  for (int64_t g = 0; g < k / GROUP; ++g) {
    float v[GROUP], amax = 0.0f;
    for (int i = 0; i < GROUP; ++i) {
      const int64_t at = g * GROUP + i;
      v[i] = f32 ? ((const float*)x)[at] : from_bf16(((const uint16_t*)x)[at]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    const float sum = group_sum(v);
    const float inv = amax > 0.0f ? top / amax : 0.0f;
    int32_t sum_a = 0, sum_lo = 0;
    for (int i = 0; i < GROUP; ++i) {
      const int32_t a = (int32_t)nearbyintf(fminf(fmaxf(v[i] * inv, -top), top));
      if (out.lo) {
        const int32_t hi = (a + 128) >> 8; /* arithmetic shift: floor */
        out.a[g * GROUP + i] = (int8_t)hi;
        out.lo[g * GROUP + i] = (int8_t)(a - 256 * hi);
        sum_a += hi;
        sum_lo += a - 256 * hi;
      } else {
        out.a[g * GROUP + i] = (int8_t)a;
        sum_a += a;
      }
    }
    out.d[g] = amax / top;
    out.xs[g] = sum;
    out.sum[g] = sum_a;
    out.sum_lo[g] = sum_lo;
  }
}

static Acts acts_at(Acts all, int64_t row, int64_t k) {
  const int64_t groups = k / GROUP;
  Acts one = {all.a + row * k,        all.lo ? all.lo + row * k : NULL,
              all.d + row * groups,   all.xs + row * groups,
              all.sum + row * groups, all.sum_lo + row * groups};
  return one;
}

typedef void (*RoundFn)(const void*, int, int64_t, Acts);

/* Row r of x (row stride x_stride, in elements) rounded into its place in `all`. */
static void round_row(RoundFn round, const void* x, int64_t x_stride, int f32, int64_t k,
                      Acts all, int64_t r) {
  const int64_t elem = f32 ? 4 : 2;
  round((const char*)x + r * x_stride * elem, f32, k, acts_at(all, r, k));
}

/* One row's outputs of a tile, plus bias, in the output dtype. */
static void store_portable(const float* out, const float* bias, int f32, void* y) {
  for (int j = 0; j < TILE; ++j) {
    const float v = out[j] + (bias ? bias[j] : 0.0f);
    if (f32)
      ((float*)y)[j] = v;
    else
      ((uint16_t*)y)[j] = to_bf16(v);
  }
}

typedef void (*StoreFn)(const float*, const float*, int, void*);

#if defined(__x86_64__)
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define ALWAYS_INLINE __attribute__((always_inline)) static inline

/* quantize_row with vectors, the same values: a 512-row prefill's rounding was most of a
 * call's time as scalar code. */
VNNI static void quantize_row_vnni(const void* x, int f32, int64_t k, Acts out) {
  const __m512 top = _mm512_set1_ps(out.lo ? WIDE_MAX : NARROW_MAX);
  const __m512 bottom = _mm512_sub_ps(_mm512_setzero_ps(), top);
  for (int64_t g = 0; g < k / GROUP; ++g) {
    __m512 v[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t at = g * GROUP + 16 * h;
      v[h] = f32 ? _mm512_loadu_ps((const float*)x + at)
                 : _mm512_castsi512_ps(_mm512_slli_epi32(
                       _mm512_cvtepu16_epi32(
                           _mm256_loadu_si256((const __m256i*)((const uint16_t*)x + at))),
                       16));
    }
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const __m512 s16 = _mm512_add_ps(v[0], v[1]);
    const __m256 s8 = _mm256_add_ps(
        _mm512_castps512_ps256(s16),
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1)));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    const float sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
    const float inv = amax > 0.0f ? _mm512_cvtss_f32(top) / amax : 0.0f;
    __m512i sum_a = _mm512_setzero_si512(), sum_lo = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512 scaled = _mm512_min_ps(
          _mm512_max_ps(_mm512_mul_ps(v[h], _mm512_set1_ps(inv)), bottom), top);
      const __m512i a = _mm512_cvtps_epi32(
          _mm512_roundscale_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      const int64_t at = g * GROUP + 16 * h;
      if (out.lo) {
        const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(128)), 8);
        const __m512i lo = _mm512_sub_epi32(a, _mm512_slli_epi32(hi, 8));
        _mm_storeu_si128((__m128i*)(out.a + at), _mm512_cvtepi32_epi8(hi));
        _mm_storeu_si128((__m128i*)(out.lo + at), _mm512_cvtepi32_epi8(lo));
        sum_a = _mm512_add_epi32(sum_a, hi);
        sum_lo = _mm512_add_epi32(sum_lo, lo);
      } else {
        _mm_storeu_si128((__m128i*)(out.a + at), _mm512_cvtepi32_epi8(a));
        sum_a = _mm512_add_epi32(sum_a, a);
      }
    }
    out.d[g] = amax / _mm512_cvtss_f32(top);
    out.xs[g] = sum;
    out.sum[g] = _mm512_reduce_add_epi32(sum_a);
    out.sum_lo[g] = _mm512_reduce_add_epi32(sum_lo);
  }
}

/* store_portable with vectors, the same values. */
VNNI static void store_vnni(const float* out, const float* bias, int f32, void* y) {
  const __m512 v = _mm512_add_ps(_mm512_loadu_ps(out),
                                 bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps());
  if (f32) {
    _mm512_storeu_ps(y, v);
    return;
  }
  _mm256_storeu_si256((__m256i*)y, _mm512_cvtepi32_epi16(round_bf16x16(v)));
}

/* sum over 8 steps of w[step] x row's activation bytes (as 4-byte groups) */
VNNI ALWAYS_INLINE __m512i dot8(const __m512i* w, const int8_t* bytes) {
  const int32_t* quads = (const int32_t*)bytes;
  /* two chains (a VPDPBUSD waits on the one before it in its chain): 5-15 % faster at
   * 4-16 rows than one; the sum is exact either way */
  __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
  for (int step = 0; step < 8; step += 2) {
    even = _mm512_dpbusd_epi32(even, w[step], _mm512_set1_epi32(quads[step]));
    odd = _mm512_dpbusd_epi32(odd, w[step + 1], _mm512_set1_epi32(quads[step + 1]));
  }
  return _mm512_add_epi32(even, odd);
}

/* Rows 0..R-1 of `acts` times one tile: 16 outputs each, as floats. */
VNNI ALWAYS_INLINE void tile_rows_vnni(const int R, const int BITS, const int WIDE,
                                       const uint8_t* tile, int64_t groups, Acts acts,
                                       int64_t k, float* out /* [R][16] */) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[ROWS];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = tile + g * tile_bytes(BITS);
    __m512i w[8];
    __m512 m = _mm512_setzero_ps();
    if (BITS == 4) {
      for (int u = 0; u < 4; ++u) {
        const __m512i v = _mm512_loadu_si512(p + 64 * u);
        w[u] = _mm512_and_si512(v, low);
        w[u + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 288)));
    } else {
      for (int t = 0; t < 8; ++t) w[t] = _mm512_loadu_si512(p + 64 * t);
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 32 * BITS * 2)));
    for (int r = 0; r < R; ++r) {
      const int64_t at = r * groups + g;
      __m512i dot = dot8(w, acts.a + r * k + g * GROUP);
      if (BITS == 8) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * acts.sum[at]));
      if (WIDE) {
        __m512i dot_lo = dot8(w, acts.lo + r * k + g * GROUP);
        if (BITS == 8)
          dot_lo = _mm512_sub_epi32(dot_lo, _mm512_set1_epi32(128 * acts.sum_lo[at]));
        dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), dot_lo);
      }
      const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(acts.d[at]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sd, acc[r]);
      if (BITS == 4) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(acts.xs[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * TILE, acc[r]);
}

#define ROWS_CASES(BITS, WIDE, base)                                              \
  case base + 1: tile_rows_vnni(1, BITS, WIDE, tile, groups, acts, k, out); break; \
  case base + 2: tile_rows_vnni(2, BITS, WIDE, tile, groups, acts, k, out); break; \
  case base + 3: tile_rows_vnni(3, BITS, WIDE, tile, groups, acts, k, out); break; \
  case base + 4: tile_rows_vnni(4, BITS, WIDE, tile, groups, acts, k, out); break;

VNNI static void tile_vnni(int R, int bits, const uint8_t* tile, int64_t groups, Acts acts,
                           int64_t k, float* out) {
  switch (R + 4 * (acts.lo != NULL) + 8 * (bits == 8)) {
    ROWS_CASES(4, 0, 0)
    ROWS_CASES(4, 1, 4)
    ROWS_CASES(8, 0, 8)
    ROWS_CASES(8, 1, 12)
    default: break;
  }
}

#endif

static float half_to_f32(uint16_t h) {
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = ldexpf((float)man, -24);
  } else if (exp == 31) {
    f = man ? NAN : INFINITY;
  } else {
    const uint32_t u = ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, sizeof f);
  }
  return h >> 15 ? -f : f;
}

/* Weight q (as the kernel multiplies it: 0..15, or q + 128) of output j, input i of a
 * group's tile bytes. */
static int32_t weight_at(const uint8_t* p, int bits, int j, int i) {
  if (bits == 8) return p[64 * (i / 4) + 4 * j + i % 4];
  const uint8_t b = p[64 * ((i % 16) / 4) + 4 * j + i % 4];
  return i < 16 ? (b & 0x0F) : (b >> 4);
}

/* The same sums without vector instructions, in the same order per (row, output): the
 * two paths give the same bits (tests/hf/test_hf_int_dot.py). */
static void tile_portable(int R, int bits, const uint8_t* tile, int64_t groups, Acts acts,
                          int64_t k, float* out) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < TILE; ++j) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* p = tile + g * tile_bytes(bits);
        const int64_t at = r * groups + g;
        int32_t dot = 0, dot_lo = 0;
        for (int i = 0; i < GROUP; ++i) {
          const int32_t q = weight_at(p, bits, j, i);
          dot += q * acts.a[r * k + g * GROUP + i];
          if (acts.lo) dot_lo += q * acts.lo[r * k + g * GROUP + i];
        }
        if (bits == 8) {
          dot -= 128 * acts.sum[at];
          dot_lo -= 128 * acts.sum_lo[at];
        }
        if (acts.lo) dot = dot * 256 + dot_lo;
        uint16_t sh;
        memcpy(&sh, p + 32 * bits * 2 + 2 * j, 2);
        acc = fmaf((float)dot, half_to_f32(sh) * acts.d[at], acc);
        if (bits == 4) {
          uint16_t mh;
          memcpy(&mh, p + 288 + 2 * j, 2);
          acc = fmaf(half_to_f32(mh), acts.xs[at], acc);
        }
      }
      out[r * TILE + j] = acc;
    }
}

typedef void (*TileFn)(int, int, const uint8_t*, int64_t, Acts, int64_t, float*);

/* 2 with AVX512-VNNI (and F16C, FMA), 0 otherwise (the portable loop then). */
int llmso_int_dot_isa(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("fma"))
    return 2;
#endif
  return 0;
}

/* y[rows, n] = x[rows, k] (row stride x_stride; bf16, or fp32 when f32) by the packed
 * weight [n / 16 tiles][k / 32 groups][tile bytes] of `bits` (4 or 8), plus bias (fp32
 * [n] or NULL); y in x's dtype, contiguous. wide: 16-bit activations, else 8. k: a
 * multiple of 32; n of 16. isa: llmso_int_dot_isa()'s answer, or 0 for the portable
 * loop. Threads: the calling thread's OpenMP team (PyTorch's intra-op count). Returns 0,
 * or -1 when out of memory (y untouched then). */
int llmso_int_dot_linear(const void* x, int64_t rows, int64_t x_stride, int f32,
                         const uint8_t* packed, int64_t k, int64_t n, const float* bias,
                         void* y, int bits, int wide, int isa) {
  const int64_t groups = k / GROUP, tiles = n / TILE;
  TileFn fn = tile_portable;
  RoundFn round = quantize_row;
  StoreFn store = store_portable;
#if defined(__x86_64__)
  if (isa >= 2) {
    fn = tile_vnni;
    round = quantize_row_vnni;
    store = store_vnni;
  }
#endif
  const size_t planes = wide ? 2 : 1, per_group = (size_t)(rows * groups);
  int8_t* bytes = malloc(planes * (size_t)(rows * k) + per_group * 16);
  if (bytes == NULL) return -1;
  /* rows * k is a multiple of 32, so what follows the bytes is aligned */
  float* d = (float*)(bytes + planes * (size_t)(rows * k));
  int32_t* sums = (int32_t*)(d + 2 * per_group);
  const Acts all = {bytes, wide ? bytes + rows * k : NULL, d, d + per_group, sums,
                    sums + per_group};
  /* A few rows are rounded before the team starts, which saves the barrier after them:
   * at one row 0.5-1.4 us a call of ~3-12 (measured on SmolLM2's shapes). */
  const int serial = rows <= ROWS;
  for (int64_t r = 0; serial && r < rows; ++r) round_row(round, x, x_stride, f32, k, all, r);
#pragma omp parallel
  {
    if (!serial) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) round_row(round, x, x_stride, f32, k, all, r);
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      float out[ROWS * TILE];
      for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int R = rows - r0 < ROWS ? (int)(rows - r0) : ROWS;
        fn(R, bits, packed + t * groups * tile_bytes(bits), groups, acts_at(all, r0, k), k,
           out);
        const int64_t elem = f32 ? 4 : 2;
        for (int r = 0; r < R; ++r)
          store(out + r * TILE, bias ? bias + t * TILE : NULL, f32,
                (char*)y + ((r0 + r) * n + t * TILE) * elem);
      }
    }
  }
  free(bytes);
  return 0;
}

/* Weights of tiles [first, first + count) as bf16 rows y[count * 16][k]: w = q * s + m
 * (4 bits) or (q - 128) * s (8 bits; q as stored), in fp32 with one fused multiply-add
 * (4 bits) or one multiply, rounded to nearest even. For a long prompt's rows: unpacked
 * once per call and block, a GEMM then takes them (linears.IntDot says why). */
static void dequantize_tile_portable(int bits, const uint8_t* tile, int64_t groups,
                                     int64_t k, uint16_t* y) {
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = tile + g * tile_bytes(bits);
    for (int j = 0; j < TILE; ++j) {
      uint16_t sh, mh = 0;
      memcpy(&sh, p + 32 * bits * 2 + 2 * j, 2);
      if (bits == 4) memcpy(&mh, p + 288 + 2 * j, 2);
      const float s = half_to_f32(sh), m = half_to_f32(mh);
      for (int i = 0; i < GROUP; ++i) {
        const int32_t q = weight_at(p, bits, j, i);
        const float w = bits == 4 ? fmaf((float)q, s, m) : (float)(q - 128) * s;
        y[j * k + g * GROUP + i] = to_bf16(w);
      }
    }
  }
}

#if defined(__x86_64__)
/* Four 64-byte chunks at p as 4 x 16 dwords c[u][j], transposed: lane L of t[r] holds
 * (c[0][j], c[1][j], c[2][j], c[3][j]) for output j = 4L + r, i.e. that output's 16
 * bytes of the four chunks in chunk order. */
VNNI ALWAYS_INLINE void transpose4(const uint8_t* p, __m512i t[4]) {
  const __m512i c0 = _mm512_loadu_si512(p), c1 = _mm512_loadu_si512(p + 64);
  const __m512i c2 = _mm512_loadu_si512(p + 128), c3 = _mm512_loadu_si512(p + 192);
  const __m512i a = _mm512_unpacklo_epi32(c0, c1), b = _mm512_unpackhi_epi32(c0, c1);
  const __m512i c = _mm512_unpacklo_epi32(c2, c3), d = _mm512_unpackhi_epi32(c2, c3);
  t[0] = _mm512_unpacklo_epi64(a, c);
  t[1] = _mm512_unpackhi_epi64(a, c);
  t[2] = _mm512_unpacklo_epi64(b, d);
  t[3] = _mm512_unpackhi_epi64(b, d);
}

/* 16 weights (unsigned bytes q) as bf16 at y: q * s + m (4 bits) or (q - 128) * s. */
VNNI ALWAYS_INLINE void store_weights(const int BITS, __m128i q8, float s, float m,
                                      uint16_t* y) {
  __m512i q = _mm512_cvtepu8_epi32(q8);
  __m512 w;
  if (BITS == 4) {
    w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s), _mm512_set1_ps(m));
  } else {
    q = _mm512_sub_epi32(q, _mm512_set1_epi32(128));
    w = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s));
  }
  _mm256_storeu_si256((__m256i*)y, _mm512_cvtepi32_epi16(round_bf16x16(w)));
}

/* Output j = 4L + r's 32 weights of a group: its first 16 in lane L of `first`, its
 * last 16 in lane L of `last`. */
#define STORE_LANE(L)                                                              \
  do {                                                                             \
    const int j = 4 * (L) + r;                                                     \
    uint16_t* out = y + j * k + g * GROUP;                                         \
    store_weights(BITS, _mm512_extracti32x4_epi32(first, L), s[j], m[j], out);     \
    store_weights(BITS, _mm512_extracti32x4_epi32(last, L), s[j], m[j], out + 16); \
  } while (0)

/* dequantize_tile_portable with vectors, the same values. */
VNNI ALWAYS_INLINE void dequantize_tile_bits(const int BITS, const uint8_t* tile,
                                             int64_t groups, int64_t k, uint16_t* y) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = tile + g * tile_bytes(BITS);
    float s[TILE], m[TILE] = {0};
    const __m256i* scales = (const __m256i*)(p + 32 * BITS * 2);
    _mm512_storeu_ps(s, _mm512_cvtph_ps(_mm256_loadu_si256(scales)));
    if (BITS == 4) _mm512_storeu_ps(m, _mm512_cvtph_ps(_mm256_loadu_si256(scales + 1)));
    __m512i t[4], t2[4];
    transpose4(p, t);
    if (BITS == 8) transpose4(p + 256, t2);
    for (int r = 0; r < 4; ++r) {
      __m512i first, last;
      if (BITS == 4) { /* low nibbles: inputs 0..15; high: 16..31 */
        first = _mm512_and_si512(t[r], low);
        last = _mm512_and_si512(_mm512_srli_epi16(t[r], 4), low);
      } else {
        first = t[r];
        last = t2[r];
      }
      STORE_LANE(0);
      STORE_LANE(1);
      STORE_LANE(2);
      STORE_LANE(3);
    }
  }
}
#undef STORE_LANE

VNNI static void dequantize_tile_vnni(int bits, const uint8_t* tile, int64_t groups,
                                      int64_t k, uint16_t* y) {
  if (bits == 4)
    dequantize_tile_bits(4, tile, groups, k, y);
  else
    dequantize_tile_bits(8, tile, groups, k, y);
}
#endif

/* y[count * 16][k] (bf16) from the packed weight's tiles [first, first + count); isa as
 * for llmso_int_dot_linear. Threads: the calling thread's OpenMP team. */
void llmso_int_dot_dequantize(const uint8_t* packed, int64_t k, int64_t first, int64_t count,
                              int bits, uint16_t* y, int isa) {
  const int64_t groups = k / GROUP;
  void (*fn)(int, const uint8_t*, int64_t, int64_t, uint16_t*) = dequantize_tile_portable;
#if defined(__x86_64__)
  if (isa >= 2) fn = dequantize_tile_vnni;
#endif
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < count; ++t)
    fn(bits, packed + (first + t) * groups * tile_bytes(bits), groups, k, y + t * TILE * k);
}
