extern "C" void k0_sum(int64_t arg0_addr, int64_t buf0_addr) {
  auto arg0 = reinterpret_cast<const float*>(arg0_addr);
  auto buf0 = reinterpret_cast<float*>(buf0_addr);
  constexpr int64_t block_max = std::max<int64_t>(coil::OUTER_BLOCK, std::min<int64_t>(coil::OUTER_BLOCK_MAX, 8192));
  const int64_t x0_step = coil::outer_block(256, block_max);
  for (int64_t x0_block = 0; x0_block < 256; x0_block += x0_step) {
    int64_t width = std::min<int64_t>(x0_step, 256 - x0_block);
    float acc_buf0[block_max];
    #pragma omp simd
    for (int64_t lane = 0; lane < width; lane++) {
      int64_t x0 = x0_block + lane;
      acc_buf0[lane] = float(0);
    }
    for (int64_t r0 = 0; r0 < 64; r0++) {
      #pragma omp simd
      for (int64_t lane = 0; lane < width; lane++) {
        int64_t x0 = x0_block + lane;
        float t1 = arg0[(256*r0 + x0)];
        coil::sum_update<float>(acc_buf0[lane], t1);
      }
    }
    #pragma omp simd
    for (int64_t lane = 0; lane < width; lane++) {
      int64_t x0 = x0_block + lane;
      buf0[x0] = coil::cast<float>(acc_buf0[lane]);
    }
  }
}
