"""GCC 12.2 drops a Welford sum from a C++ plugin kernel (found 2026-12-02).

A batch norm's statistics kernel whose last loop reads the sum of squares back from a
per-lane array, takes ``1 / std::sqrt`` of it and updates the running statistics, built with
the plugin's flags (``-O3 -march=native -fopenmp -fno-math-errno ...``) on this machine's GCC
12.2, never accumulates the sum of squares: every variance comes out 0 (rsqrt 31.62 for
eps 1e-3). Without ``-fno-math-errno``, at ``-O0``, without the last loop's ``#pragma omp
simd``, or with any one statement of that loop removed, the same source is right. Coil hit it
once, when a graph lowering change stored a MobileNetV3 batch norm's ``rsqrt`` as its own
output (not shipped: see ``GraphLowering._stored_by_a_user``). Prints the kernel's variance
against numpy's."""
import ctypes

import numpy as np

from coil_cpu_cpp import toolchain

SOURCE = '''#include "coil_cpu.h"
extern "C" void k23_var_mean_add_rsqrt_mul_copy(int64_t buf45_addr, int64_t arg61_addr, int64_t arg62_addr, int64_t buf46_addr, int64_t buf48_addr, int64_t buf321_addr) {
  auto buf45 = reinterpret_cast<const float*>(buf45_addr);
  auto arg61 = reinterpret_cast<float*>(arg61_addr);
  auto arg62 = reinterpret_cast<float*>(arg62_addr);
  auto buf46 = reinterpret_cast<float*>(buf46_addr);
  auto buf48 = reinterpret_cast<float*>(buf48_addr);
  auto buf321 = reinterpret_cast<float*>(buf321_addr);
  for (int64_t x0_block = 0; x0_block < 96; x0_block += 256) {
    int64_t width = std::min<int64_t>(256, 96 - x0_block);
    float v_buf47[256];
    float acc_buf46_mean[256];
    float acc_buf46_m2[256];
    float acc_buf46_n[256];
    #pragma omp simd
    for (int64_t lane = 0; lane < width; lane++) {
      int64_t x0 = x0_block + lane;
      acc_buf46_mean[lane] = float(0);
      acc_buf46_m2[lane] = float(0);
      acc_buf46_n[lane] = float(0);
    }
    for (int64_t r0 = 0; r0 < 2; r0++) {
      for (int64_t r1 = 0; r1 < 8; r1++) {
        for (int64_t r2 = 0; r2 < 8; r2++) {
          #pragma omp simd
          for (int64_t lane = 0; lane < width; lane++) {
            int64_t x0 = x0_block + lane;
            float t1 = buf45[(6144*r0 + 768*r1 + 96*r2 + x0)];
            coil::welford_update<float>(acc_buf46_mean[lane], acc_buf46_m2[lane], acc_buf46_n[lane], t1);
          }
        }
      }
    }
    #pragma omp simd
    for (int64_t lane = 0; lane < width; lane++) {
      int64_t x0 = x0_block + lane;
      buf46[x0] = coil::cast<float>(acc_buf46_mean[lane]);
      v_buf47[lane] = coil::cast<float>(acc_buf46_m2[lane]);
    }
    #pragma omp simd
    for (int64_t lane = 0; lane < width; lane++) {
      int64_t x0 = x0_block + lane;
      int64_t t2 = static_cast<int64_t>(128);
      float t3 = coil::cast<float>(t2);
      float t4 = (t3 - coil::cast<float>(0.0));
      float t5 = coil::max_nan<float>(t4, coil::cast<float>(0.0));
      float t6 = (v_buf47[lane] / t5);
      float t7 = (t6 + coil::cast<float>(0.001));
      float t8 = (float(1) / std::sqrt(t7));
      buf48[x0] = coil::cast<float>(t8);
      float t9 = buf46[x0];
      float t10 = (t9 * coil::cast<float>(0.01));
      float t11 = arg61[x0];
      float t12 = (t11 * coil::cast<float>(0.99));
      float t13 = (t10 + t12);
      arg61[x0] = coil::cast<float>(t13);
      float t14 = (t6 * coil::cast<float>(1.0078740157480315));
      float t15 = (t14 * coil::cast<float>(0.01));
      float t16 = arg62[x0];
      float t17 = (t16 * coil::cast<float>(0.99));
      float t18 = (t15 + t17);
      arg62[x0] = coil::cast<float>(t18);
      buf321[x0] = coil::cast<float>(t9);
    }
  }
}
'''


def main() -> None:
    # GCC's default 256-bit vectors on this Xeon: with -mprefer-vector-width=512 (the plugin's
    # flags since 2026-12-02) the same source happens to compile right
    lib = ctypes.CDLL(str(toolchain.library_for(SOURCE, extra_flags=("-mprefer-vector-width=256",))))
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 96)).astype(np.float32)  # NHWC
    mean, rsqrt, saved = (np.zeros(96, np.float32) for _ in range(3))
    running_mean, running_var = np.zeros(96, np.float32), np.ones(96, np.float32)
    ptr = lambda a: ctypes.c_int64(a.ctypes.data)  # noqa: E731
    lib.k23_var_mean_add_rsqrt_mul_copy(ptr(x), ptr(running_mean), ptr(running_var), ptr(mean),
                                        ptr(rsqrt), ptr(saved))
    want = 1 / np.sqrt(x.var(axis=(0, 1, 2)) + 1e-3)
    print("rsqrt of the variance, kernel:", rsqrt[:4], "numpy:", want[:4])
    print("WRONG (the compiler bug is here)" if not np.allclose(rsqrt, want, rtol=1e-4) else "right")


if __name__ == "__main__":
    main()
