// How the GEMV cuts W into parallel chunks: about 1 MiB of weight rows each (every chunk restarts
// the read streams), at least 4 chunks per thread of the budget, never under 32 rows.
#include "common.hpp"

namespace {

using microscale::cpu::gemv_rows_per_chunk;

// The thread budget for one test; the default comes back after it.
class GemvChunks : public ::testing::Test {
 protected:
  void TearDown() override { microscale::set_num_threads(0); }
};

TEST_F(GemvChunks, HoldAboutOneMebibyteOfRows) {
  microscale::set_num_threads(2);
  // 14336 x 4096: nvfp4 rows (2048 code bytes + 256 scale bytes) and mxfp8 rows (4096 + 128).
  EXPECT_EQ(gemv_rows_per_chunk(14336, 2304), 455);
  EXPECT_EQ(gemv_rows_per_chunk(14336, 4224), 248);
}

TEST_F(GemvChunks, KeepFourChunksPerThread) {
  microscale::set_num_threads(16);
  EXPECT_EQ(gemv_rows_per_chunk(14336, 2304), 14336 / 64);
  microscale::set_num_threads(2);
  EXPECT_EQ(gemv_rows_per_chunk(4096, 64), 4096 / 8);
}

TEST_F(GemvChunks, NeverUnderThirtyTwoRows) {
  microscale::set_num_threads(2);
  EXPECT_EQ(gemv_rows_per_chunk(100, 2304), 32);
  EXPECT_EQ(gemv_rows_per_chunk(14336, std::int64_t{1} << 21), 32);
  EXPECT_EQ(gemv_rows_per_chunk(14336, 0), 14336 / 8);
}

}  // namespace
