// The ring schedule: its arithmetic, and the example's output against tables written out below
// (as the project's founding notes, seeds 000 and 001, drew them; those notes are not in this
// repository, docs/ARCHITECTURE.md does not reproduce them, and these tests are their record).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "algorithms/ring_schedule.h"

namespace ringreduce::algorithms {
namespace {

std::string run_example(int n) {
  std::string cmd = std::string(RING_SCHEDULE_BIN) + " " + std::to_string(n);
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  EXPECT_TRUE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t got;
  while ((got = fread(buf.data(), 1, buf.size(), p.get())) > 0) out.append(buf.data(), got);
  return out;
}

TEST(RingSchedule, SplitCoversEveryElementOnceFirstChunksLonger) {
  for (size_t count : {0u, 1u, 4u, 7u, 1000003u})
    for (size_t parts : {1u, 2u, 3u, 5u, 9u}) {
      size_t next = 0;
      for (size_t i = 0; i < parts; ++i) {
        Range r = split(count, parts, i);
        EXPECT_EQ(r.offset, next);
        EXPECT_EQ(r.count, count / parts + (i < count % parts ? 1 : 0));
        next += r.count;
      }
      EXPECT_EQ(next, count);
    }
}

TEST(RingSchedule, EveryChunkVisitsEveryRankAndEndsOwned) {
  for (int n = 2; n <= 9; ++n)
    for (int shift : {0, -1}) {
      for (int r = 0; r < n; ++r) {
        // What r sends at step t+1 is what it received (and reduced) at step t.
        for (int t = 0; t + 1 < n - 1; ++t)
          EXPECT_EQ(reduce_scatter_step(r, n, t + 1, shift).send_chunk,
                    reduce_scatter_step(r, n, t, shift).recv_chunk);
        // The right neighbour receives what r sends.
        for (int t = 0; t < n - 1; ++t)
          EXPECT_EQ(reduce_scatter_step((r + 1) % n, n, t, shift).recv_chunk,
                    reduce_scatter_step(r, n, t, shift).send_chunk);
        EXPECT_EQ(reduce_scatter_step(r, n, n - 2, shift).recv_chunk, owned_chunk(r, n, shift));
        EXPECT_EQ(allgather_step(r, n, 0, shift).send_chunk, owned_chunk(r, n, shift));
        std::set<int> got{owned_chunk(r, n, shift)};
        for (int t = 0; t < n - 1; ++t) got.insert(allgather_step(r, n, t, shift).recv_chunk);
        EXPECT_EQ(got.size(), static_cast<size_t>(n));
      }
    }
  EXPECT_EQ(owned_chunk(3, 4, -1), 3);  // the reduce_scatter collective: rank r owns chunk r
}

TEST(RingSchedule, ExampleReproducesSeed001TablesForFiveRanks) {
  const std::string out = run_example(5);
  EXPECT_NE(out.find("Scatter-reduce, iteration 1\nGPU Send Receive\n"
                     "0 Chunk 0 Chunk 4\n1 Chunk 1 Chunk 0\n2 Chunk 2 Chunk 1\n"
                     "3 Chunk 3 Chunk 2\n4 Chunk 4 Chunk 3\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("Allgather, iteration 1\nGPU Send Receive\n"
                     "0 Chunk 1 Chunk 0\n1 Chunk 2 Chunk 1\n2 Chunk 3 Chunk 2\n"
                     "3 Chunk 4 Chunk 3\n4 Chunk 0 Chunk 4\n"),
            std::string::npos)
      << out;
}

TEST(RingSchedule, ExampleFourRanksMatchesSeed000AndEndsFullyReduced) {
  const std::string out = run_example(4);
  // The state after the first scatter-reduce step (seed 000's table).
  EXPECT_NE(out.find("rank 0: a0       b0       c0       d0d3"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1: a1a0     b1       c1       d1"), std::string::npos) << out;
  // Final state: the last "State" block; every cell holds its chunk from all four ranks.
  const size_t last = out.rfind("State");
  ASSERT_NE(last, std::string::npos);
  std::istringstream in(out.substr(last));
  std::string line;
  std::getline(in, line);
  int rows = 0;
  while (std::getline(in, line) && line.find("rank") != std::string::npos) {
    ++rows;
    std::istringstream cells(line.substr(line.find(':') + 1));
    std::string cell;
    int col = 0;
    while (cells >> cell) {
      ASSERT_EQ(cell.size(), 8u) << line;
      std::set<char> letters, ranks;
      for (size_t i = 0; i < cell.size(); i += 2)
        letters.insert(cell[i]), ranks.insert(cell[i + 1]);
      EXPECT_EQ(letters, std::set<char>{static_cast<char>('a' + col)}) << line;
      EXPECT_EQ(ranks, (std::set<char>{'0', '1', '2', '3'})) << line;
      ++col;
    }
    EXPECT_EQ(col, 4);
  }
  EXPECT_EQ(rows, 4);
}

}  // namespace
}  // namespace ringreduce::algorithms
