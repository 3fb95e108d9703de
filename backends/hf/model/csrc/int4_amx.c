/* Projections with weight-only int4 weights on AMX tiles, for any number of rows
 * (linears.Int4Tiles, where llmso_int4_amx_ready() says yes). PyTorch's kernel
 * (_weight_int4pack_mm_for_cpu) multiplies on AVX512 FMAs after dequantizing the weights
 * again for every few rows: at 16 decode rows SmolLM2's int4 step took 1.3x bf16's.
 *
 * Weights: q in 0..15 per output and input; per group of inputs (a multiple of 32) and
 * output a scale s and a zero z (bf16), w = (q - 8) s + z (linears.int4_values).
 * Layout, per unit of 32 outputs (outputs a multiple of 32), chunk of 32 inputs, tile t
 * (the unit's outputs 16t..16t+15) and vector v (0..3): 32 16-bit lanes, lane 2j + e
 * holding in its nibble i the q of output j, input 8v + 2i + e of the chunk. So nibble i
 * of vector v, or-ed into 0x4300 (bf16 128.0), is row 4v + i of the tile TDPBF16PS takes
 * for the weights (rows: input pairs; lanes: the (even, odd) pair of each output), with
 * the bf16 value 128 + q: a shift and one logic op a row, no shuffles (a lookup from
 * PyTorch's layout took three shuffles a row and was port-bound). Scales and zeros per
 * unit too, group after group ([out / 32][in / group][32][2]), so that a unit reads two
 * sequential streams, each prefetched 2 KB ahead: a step of few rows waits on these
 * reads (PyTorch's [in / group][out][2] strides a unit's over the whole array).
 *
 * Per unit, the calling thread's OpenMP team unpacks two groups' tiles while the two
 * before multiply (each group in tiles of its own), then per group and row adds
 *   s * (sum_i x_i (128 + q_i) - 136 X) + z * X,   X = sum_i x_i over the group,
 * the inner sums fp32 in the tiles. A row's sums run in the same order whatever the
 * other rows of the call, so a sequence's bits never depend on its batch; they differ
 * from PyTorch's kernel's in the last bits. Stateless; safe from any thread once
 * llmso_int4_amx_ready() has said yes (it asks Linux for the tile state). */
#define _GNU_SOURCE /* syscall */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define UNIT 32  /* outputs */
#define CHUNK 32 /* inputs in one tile multiply */
#define ROWS 16  /* rows in one tile multiply */
#define TILE 512 /* uint16 in a weight tile: 16 rows of 32 */
#define PREFETCH_BYTES 2048

/* 1 where this CPU has AMX-BF16 and AVX512-BF16 and Linux lets this process use the
 * tiles (the request is for the whole process; asking again is harmless). */
int llmso_int4_amx_ready(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  const int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  const int avx512bw = (b >> 30) & 1;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
  const int avx512_bf16 = (a >> 5) & 1;
  if (!(amx_bf16 && amx_tile && avx512bw && avx512_bf16)) return 0;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")

/* GCC's tile intrinsics do not tell the compiler which memory a tile load or ldtilecfg
 * reads (nor what sttilecfg writes): a barrier before them keeps the stores they read
 * (the unpacked weights, the configuration), and after sttilecfg, the reads of it. */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} TileConfig;

/* Results tmm0..3 and rows tmm4, 5 of `rows` rows; weights tmm6, 7 of 16: rows of 64
 * bytes. Returns the thread's configuration before, for restore_tiles: PyTorch's brgemm
 * keeps a configuration per thread across its calls (CPUBlas's current kernel), so a
 * call here leaves the thread's tiles configured as it found them. */
static TileConfig configure_tiles(int rows) {
  TileConfig before, cfg;
  _tile_storeconfig(&before);
  MEMORY_BARRIER();
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = (uint8_t)(i < 6 ? rows : ROWS);
  }
  MEMORY_BARRIER();
  _tile_loadconfig(&cfg);
  return before;
}

/* The configuration configure_tiles found (none: the tiles released). */
static void restore_tiles(const TileConfig* before) {
  MEMORY_BARRIER();
  if (before->palette)
    _tile_loadconfig(before);
  else
    _tile_release();
}

/* `count` chunks of one unit's packed weights (`src`: the first's) as weight tiles
 * (dst: chunk after chunk, tile 0 then 1). */
static void unpack_chunks(const uint16_t* src, int64_t count, uint16_t* dst) {
  const __m512i nibble = _mm512_set1_epi16(0x000F), base = _mm512_set1_epi16(0x4300);
  for (int64_t v = 0; v < count * 2 * 4; ++v) { /* chunk, tile, vector */
    const __m512i q = _mm512_loadu_si512(src + v * 32);
    _mm_prefetch((const char*)(src + v * 32) + PREFETCH_BYTES, _MM_HINT_T0);
    uint16_t* row = dst + v * 4 * 32;
    /* (q >> 4i) & 0xF | 0x4300: ternary logic 0xEA is (a & b) | c */
    _mm512_storeu_si512(row, _mm512_ternarylogic_epi32(q, nibble, base, 0xEA));
    _mm512_storeu_si512(row + 32, _mm512_ternarylogic_epi32(_mm512_srli_epi16(q, 4), nibble,
                                                            base, 0xEA));
    _mm512_storeu_si512(row + 64, _mm512_ternarylogic_epi32(_mm512_srli_epi16(q, 8), nibble,
                                                            base, 0xEA));
    _mm512_storeu_si512(row + 96, _mm512_srli_epi16(q, 12) | base);
  }
}

/* sums[r][g] = the sum of row r's inputs in group g, in fp32, in one fixed order. */
static void group_sums(const uint16_t* x, int64_t x_stride, int64_t m, int64_t k, int64_t group,
                       float* sums) {
  const int64_t groups = k / group;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = g * group; i < (g + 1) * group; i += 16) {
        const __m256i h = _mm256_loadu_si256((const void*)(x + r * x_stride + i));
        const __m512i widened = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
        acc = _mm512_add_ps(acc, _mm512_castsi512_ps(widened));
      }
      sums[r * groups + g] = _mm512_reduce_add_ps(acc);
    }
}

typedef struct {
  const uint16_t* x; /* rows, zeros past the last to a whole tile where over 16 */
  int64_t x_stride, m, k, group, n;
  const uint16_t* packed;
  const uint16_t* scales_zeros;
  const float* x_sums; /* [m][k / group] */
} Call;

/* acc[r][32] += s * (sums[r] - 136 X) + z * X for one group's results of a tile of rows
 * (r0 up, `rows` of them; acc: the first row's). */
static void add_group(const Call* call, const float* sums, int64_t r0, int64_t rows, int64_t g,
                      int64_t first, float* acc) {
  const int64_t groups = call->k / call->group;
  const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512 offset = _mm512_set1_ps(-136.0f);
  for (int t = 0; t < 2; ++t) {
    const uint16_t* at = call->scales_zeros + ((first / UNIT * groups + g) * UNIT + 16 * t) * 2;
    const __m512i sz = _mm512_loadu_si512(at);
    _mm_prefetch((const char*)at + PREFETCH_BYTES, _MM_HINT_T0);
    const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(sz, 16));
    const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(sz, high));
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 x_sum = _mm512_set1_ps(call->x_sums[(r0 + r) * groups + g]);
      float* a = acc + r * UNIT + 16 * t;
      const __m512 dot = _mm512_fmadd_ps(offset, x_sum, _mm512_loadu_ps(sums + r * UNIT + 16 * t));
      _mm512_storeu_ps(a, _mm512_fmadd_ps(z, x_sum, _mm512_fmadd_ps(dot, s, _mm512_loadu_ps(a))));
    }
  }
}

/* One tile of rows (r0 up) times groups g and g + 1 (`two`; else g alone), whose weight
 * tiles start at `tiles`, into the result tiles 0, 1 (g) and 2, 3 (g + 1). */
static void issue_pair(const Call* call, const uint16_t* tiles, int64_t g, int two, int64_t r0) {
  const int64_t per_group = call->group / CHUNK, stride = call->x_stride * 2;
  const uint16_t* x = call->x + r0 * call->x_stride + g * call->group;
  const uint16_t* next = tiles + per_group * 2 * TILE;
  MEMORY_BARRIER(); /* the weight tiles unpacked */
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t j = 0; j < per_group; ++j) {
    _tile_loadd(4, x + j * CHUNK, stride);
    _tile_loadd(6, tiles + j * 2 * TILE, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, tiles + j * 2 * TILE + TILE, 64);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, x + call->group + j * CHUNK, stride);
      _tile_loadd(6, next + j * 2 * TILE, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(7, next + j * 2 * TILE + TILE, 64);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
}

/* The result tiles of issue_pair, scaled and added to acc (the tile of rows' first). */
static void finish_pair(const Call* call, int64_t g, int two, int64_t r0, int64_t rows,
                        int64_t first, float* acc) {
  float sums[2][ROWS * UNIT];
  _tile_stored(0, sums[0], UNIT * 4);
  _tile_stored(1, sums[0] + 16, UNIT * 4);
  if (two) {
    _tile_stored(2, sums[1], UNIT * 4);
    _tile_stored(3, sums[1] + 16, UNIT * 4);
  }
  add_group(call, sums[0], r0, rows, g, first, acc);
  if (two) add_group(call, sums[1], r0, rows, g + 1, first, acc);
}

/* y[m][unit u's 32 outputs]. tiles: room for four groups' weight tiles (two pairs);
 * acc: m rows of 32 floats. The next pair of groups unpacks while the last tile of rows
 * multiplies. */
static void multiply_unit(const Call* call, int64_t u, uint16_t* tiles, float* acc, uint16_t* y) {
  const int64_t first = u * UNIT;
  const uint16_t* src = call->packed + u * call->k * UNIT / 4; /* 4 nibbles a uint16 */
  const int64_t groups = call->k / call->group, per_group = call->group / CHUNK;
  const int64_t pairs = (groups + 1) / 2, pair_size = 2 * per_group * 2 * TILE;
  const int64_t group_packed = per_group * CHUNK * UNIT / 4;
  memset(acc, 0, (size_t)(call->m * UNIT) * sizeof(float));
  unpack_chunks(src, (groups < 2 ? 1 : 2) * per_group, tiles);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t g = 2 * p;
    const int two = g + 1 < groups;
    const uint16_t* current = tiles + (p % 2) * pair_size;
    for (int64_t r0 = 0; r0 < call->m; r0 += ROWS) {
      const int64_t rows = call->m - r0 < ROWS ? call->m - r0 : ROWS;
      issue_pair(call, current, g, two, r0);
      if (r0 + ROWS >= call->m && p + 1 < pairs) { /* the last tile of rows: unpack ahead */
        const int64_t ahead = groups - g - 2 < 2 ? groups - g - 2 : 2;
        unpack_chunks(src + (g + 2) * group_packed, ahead * per_group,
                      tiles + ((p + 1) % 2) * pair_size);
      }
      finish_pair(call, g, two, r0, rows, first, acc + r0 * UNIT);
    }
  }
  for (int64_t r = 0; r < call->m; ++r)
    for (int t = 0; t < 2; ++t) {
      const __m256i out = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(acc + r * UNIT + 16 * t));
      _mm256_storeu_si256((void*)(y + r * call->n + first + 16 * t), out);
    }
}

/* y [m][n] (bf16) = x [m][k] (bf16, row stride x_stride) times the int4 weight in this
 * file's layout (n a multiple of 32, k of the group, the group of 32). Returns 0, or -1
 * where memory ran out. */
int llmso_int4_amx_linear(const uint16_t* x, int64_t x_stride, int64_t m, const uint16_t* packed,
                          const uint16_t* scales_zeros, int64_t n, int64_t k, int64_t group,
                          uint16_t* y) {
  /* up to 16 rows the tiles take that many rows of x in place; more are copied to whole
   * tiles of 16 with zeros after the last */
  const int64_t tile_rows = m < ROWS ? m : ROWS;
  const int64_t padded = (m + tile_rows - 1) / tile_rows * tile_rows;
  uint16_t* copy = NULL;
  if (padded != m) {
    copy = aligned_alloc(64, (size_t)(padded * k * 2));
    if (!copy) return -1;
    for (int64_t r = 0; r < m; ++r) memcpy(copy + r * k, x + r * x_stride, (size_t)k * 2);
    memset(copy + m * k, 0, (size_t)((padded - m) * k * 2));
  }
  float* x_sums = malloc((size_t)(m * (k / group)) * sizeof(float));
  if (!x_sums) {
    free(copy);
    return -1;
  }
  group_sums(x, x_stride, m, k, group, x_sums);
  const Call call = {copy ? copy : x, copy ? k : x_stride, m, k, group, n, packed, scales_zeros,
                     x_sums};
  int failed = 0;
#pragma omp parallel reduction(| : failed)
  {
    uint16_t* tiles = aligned_alloc(64, (size_t)(4 * (group / CHUNK) * 2 * TILE * 2));
    float* acc = aligned_alloc(64, (size_t)(padded * UNIT) * sizeof(float));
    failed = !tiles || !acc;
    TileConfig before;
    if (!failed) before = configure_tiles((int)tile_rows);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < n / UNIT; ++u)
      if (!failed) /* every thread meets the loop; one without memory fails the call */
        multiply_unit(&call, u, tiles, acc, y);
    if (!failed) restore_tiles(&before);
    free(tiles);
    free(acc);
  }
  free(x_sums);
  free(copy);
  return failed ? -1 : 0;
}

/* wt [k][n] (bf16, the weight transposed: a GEMM takes it as a transposed view) from
 * this file's layout, w = (q - 8) s + z in fp32 (a product, then a sum) rounded once to
 * nearest even: unpack.c's values for the same weight, for a long prompt's rows
 * (linears.Int4Tiles: unpacked once per call, then bf16's fixed-size GEMM calls).
 * A vector of a tile is 16 32-bit lanes, lane j holding output j's even input in its low
 * half, its odd one in the high half. Threads: the calling thread's OpenMP team, over the
 * units. */
void llmso_int4_tiles_weights(const uint16_t* packed, const uint16_t* scales_zeros, int64_t n,
                              int64_t k, int64_t group, uint16_t* wt) {
  const int64_t groups = k / group;
  const __m512i nibble = _mm512_set1_epi32(15), high = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512 eight = _mm512_set1_ps(8.0f);
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < n / UNIT; ++u) {
    const uint16_t* src = packed + u * k * UNIT / 4;
    for (int64_t c = 0; c < k / CHUNK; ++c)
      for (int t = 0; t < 2; ++t) {
        const int64_t first = u * UNIT + 16 * t, g = c * CHUNK / group;
        const __m512i sz =
            _mm512_loadu_si512(scales_zeros + ((u * groups + g) * UNIT + 16 * t) * 2);
        const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(sz, 16));
        const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(sz, high));
        for (int v = 0; v < 4; ++v) {
          const __m512i lanes = _mm512_loadu_si512(src + ((c * 2 + t) * 4 + v) * 32);
          for (int i = 0; i < 4; ++i)
            for (int e = 0; e < 2; ++e) {
              const __m512i q =
                  _mm512_and_si512(_mm512_srl_epi32(lanes, _mm_cvtsi32_si128(16 * e + 4 * i)),
                                   nibble);
              const __m512 w = _mm512_add_ps(
                  _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(q), eight), s), z);
              const int64_t in = c * CHUNK + 8 * v + 2 * i + e;
              _mm256_storeu_si256((void*)(wt + in * n + first),
                                  _mm512_cvtepi32_epi16(round_bf16x16(w)));
            }
        }
      }
  }
}

#pragma GCC pop_options

#else
int llmso_int4_amx_ready(void) { return 0; }
int llmso_int4_amx_linear(const uint16_t* x, int64_t x_stride, int64_t m, const uint16_t* packed,
                          const uint16_t* scales_zeros, int64_t n, int64_t k, int64_t group,
                          uint16_t* y) {
  (void)x, (void)x_stride, (void)m, (void)packed, (void)scales_zeros, (void)n, (void)k;
  (void)group, (void)y;
  return -1;
}
void llmso_int4_tiles_weights(const uint16_t* packed, const uint16_t* scales_zeros, int64_t n,
                              int64_t k, int64_t group, uint16_t* wt) {
  (void)packed, (void)scales_zeros, (void)n, (void)k, (void)group, (void)wt;
}
#endif
