// Coil C++ plugin: tiles of a tensor read across its rows, transposed through registers.
//
// A tiled transpose (tiling.py) loops over square tiles of two dims; a tensor read along the
// outer of the two is strided along the loop's vector lanes, which the compiler turns into a
// gather per vector. transpose_tile copies the tile into a local array in the loop's order
// instead: dst[i * ldd + j] = src[i + j * ld] for i < rows, j < cols. Blocks of 4-byte
// elements go through registers, 16x16 with AVX-512 and 8x8 with AVX2 (the classic unpack /
// shuffle / lane-permute sequences); the tile's ragged edges and other element sizes go element
// by element. Included only by libraries whose kernels use it: <immintrin.h> alone adds about
// 0.3 s to a library's compile (see coil_cpu.h's stream_line).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace coil {

#if defined(__AVX512F__)
constexpr int64_t TRANSPOSE_BLOCK = 16;
inline void transpose_block(const float* src, int64_t ld, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_ps(src + k * ld);
  for (int k = 0; k < 8; k++) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; k++)
    for (int m = 0; m < 2; m++) {
      __m512d a = _mm512_castps_pd(t[4 * k + m]), b = _mm512_castps_pd(t[4 * k + m + 2]);
      r[4 * k + 2 * m] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      r[4 * k + 2 * m + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  for (int k = 0; k < 2; k++)
    for (int m = 0; m < 4; m++) {
      t[8 * k + m] = _mm512_shuffle_f32x4(r[8 * k + m], r[8 * k + m + 4], 0x88);
      t[8 * k + m + 4] = _mm512_shuffle_f32x4(r[8 * k + m], r[8 * k + m + 4], 0xdd);
    }
  for (int m = 0; m < 8; m++) {
    r[m] = _mm512_shuffle_f32x4(t[m], t[m + 8], 0x88);
    r[m + 8] = _mm512_shuffle_f32x4(t[m], t[m + 8], 0xdd);
  }
  for (int k = 0; k < 16; k++) _mm512_storeu_ps(dst + k * ldd, r[k]);
}
#elif defined(__AVX2__)
constexpr int64_t TRANSPOSE_BLOCK = 8;
inline void transpose_block(const float* src, int64_t ld, float* dst, int64_t ldd) {
  __m256 r[8], t[8], u[8];
  for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(src + k * ld);
  for (int k = 0; k < 4; k++) {
    t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 2; k++)
    for (int m = 0; m < 2; m++) {
      u[4 * k + 2 * m] = _mm256_shuffle_ps(t[4 * k + m], t[4 * k + m + 2], 0x44);
      u[4 * k + 2 * m + 1] = _mm256_shuffle_ps(t[4 * k + m], t[4 * k + m + 2], 0xee);
    }
  for (int m = 0; m < 4; m++) {
    r[m] = _mm256_permute2f128_ps(u[m], u[m + 4], 0x20);
    r[m + 4] = _mm256_permute2f128_ps(u[m], u[m + 4], 0x31);
  }
  for (int k = 0; k < 8; k++) _mm256_storeu_ps(dst + k * ldd, r[k]);
}
#else
constexpr int64_t TRANSPOSE_BLOCK = 0;
#endif

template <typename T>
inline void transpose_tile(const T* src, int64_t ld, T* dst, int64_t ldd, int64_t rows, int64_t cols) {
  int64_t full_rows = 0, full_cols = 0;
  if constexpr (sizeof(T) == 4 && TRANSPOSE_BLOCK > 0) {
    full_rows = rows / TRANSPOSE_BLOCK * TRANSPOSE_BLOCK;
    full_cols = cols / TRANSPOSE_BLOCK * TRANSPOSE_BLOCK;
    for (int64_t jb = 0; jb < full_cols; jb += TRANSPOSE_BLOCK)
      for (int64_t ib = 0; ib < full_rows; ib += TRANSPOSE_BLOCK)
        transpose_block(reinterpret_cast<const float*>(src + ib + jb * ld), ld,
                        reinterpret_cast<float*>(dst + ib * ldd + jb), ldd);
  }
  for (int64_t j = 0; j < cols; j++)
    for (int64_t i = j < full_cols ? full_rows : 0; i < rows; i++) dst[i * ldd + j] = src[i + j * ld];
}

}  // namespace coil
