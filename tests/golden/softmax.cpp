extern "C" void k0_amax_sub_exp_sum_reciprocal_mul(int64_t arg0_addr, int64_t buf2_addr) {
  auto arg0 = reinterpret_cast<const float*>(arg0_addr);
  auto buf2 = reinterpret_cast<float*>(buf2_addr);
  #pragma omp parallel for collapse(1) if(parallel: 49152 > 16384)
  for (int64_t x0 = 0; x0 < 64; x0++) {
    float acc_buf0 = coil::lowest<float>();
    float lane_buf0[64];
    #pragma omp simd
    for (int64_t lane = 0; lane < 64; lane++) {
      lane_buf0[lane] = coil::lowest<float>();
    }
    for (int64_t r0_chunk = 0; r0_chunk < 256; r0_chunk += 64) {
      #pragma omp simd
      for (int64_t lane = 0; lane < 64; lane++) {
        int64_t r0 = r0_chunk + lane;
        float t1 = arg0[(r0 + 256*x0)];
        coil::max_update<float>(lane_buf0[lane], t1);
      }
    }
    #pragma GCC unroll 8
    for (int64_t half = 32; half > 0; half /= 2) {
      #pragma omp simd
      for (int64_t lane = 0; lane < half; lane++) {
        coil::max_combine<float>(lane_buf0[lane], lane_buf0[lane + half]);
      }
    }
    coil::max_combine<float>(acc_buf0, lane_buf0[0]);
    float v_buf0 = coil::cast<float>(acc_buf0);
    float acc_buf1 = float(0);
    float lane_buf1[64];
    #pragma omp simd
    for (int64_t lane = 0; lane < 64; lane++) {
      lane_buf1[lane] = float(0);
    }
    for (int64_t r0_chunk = 0; r0_chunk < 256; r0_chunk += 64) {
      if (x0 + 1 < 64) {
        for (int64_t ahead = 0; ahead < 64; ahead += 16) {
          int64_t r0 = r0_chunk + ahead;
          __builtin_prefetch(&arg0[(256 + r0 + 256*x0)]);
        }
      }
      #pragma omp simd
      for (int64_t lane = 0; lane < 64; lane++) {
        int64_t r0 = r0_chunk + lane;
        float t2 = arg0[(r0 + 256*x0)];
        float t3 = (t2 - v_buf0);
        float t4 = coil::exp_<float>(t3);
        coil::sum_update<float>(lane_buf1[lane], t4);
        buf2[(r0 + 256*x0)] = t4;
      }
    }
    #pragma GCC unroll 8
    for (int64_t half = 32; half > 0; half /= 2) {
      #pragma omp simd
      for (int64_t lane = 0; lane < half; lane++) {
        coil::sum_combine<float>(lane_buf1[lane], lane_buf1[lane + half]);
      }
    }
    coil::sum_combine<float>(acc_buf1, lane_buf1[0]);
    float v_buf1 = coil::cast<float>(acc_buf1);
    float t5 = (float(1) / v_buf1);
    #pragma omp simd
    for (int64_t r0 = 0; r0 < 256; r0++) {
      float t6 = buf2[(r0 + 256*x0)];
      float t7 = (t6 * t5);
      buf2[(r0 + 256*x0)] = coil::cast<float>(t7);
    }
  }
}
