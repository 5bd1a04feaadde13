// The tuner's choice between recursive doubling and the ring on several hosts, from the network
// measured at start-up (Tuner::set_network), against the forced-algorithm measurements it was
// fitted to (docs/PERFORMANCE.md, the emulated cluster, 4 hosts).
#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
#include "tuner/tuner.h"

namespace {

using ringreduce::DataType;
using ringreduce::algorithms::Args;
using ringreduce::algorithms::Collective;

std::string pick(const ringreduce::tuner::Tuner& t, size_t bytes) {
  Args a;
  a.kind = Collective::allreduce;
  a.count = bytes / 4;
  a.dtype = DataType::f32;
  return t.choose(a).algorithm->name;
}

ringreduce::tuner::Tuner multi_host(int n) {
  return ringreduce::tuner::Tuner(ringreduce::core::Config{}, n, 1, /*shared_memory=*/false);
}

TEST(Tuner, WithoutANetworkMeasurementRdTakesUpTo512KiB) {
  auto t = multi_host(4);
  EXPECT_EQ(pick(t, 4), "rd");
  EXPECT_EQ(pick(t, 512 << 10), "rd");
  EXPECT_EQ(pick(t, 1 << 20), "ring");
}

TEST(Tuner, OneGigabitMovesTheRingDownToTensOfKiB) {
  // 4 hosts at 1 Gbit/s: forced rd 277 us against the ring's 425 us at 16 KiB, 1097 against 830
  // at 64 KiB.
  auto t = multi_host(4);
  t.set_network(70e-6, 0.119e9);
  EXPECT_EQ(pick(t, 4), "rd");
  EXPECT_EQ(pick(t, 16 << 10), "rd");
  EXPECT_EQ(pick(t, 64 << 10), "ring");
  EXPECT_EQ(pick(t, 256 << 10), "ring");
}

TEST(Tuner, TenGigabitKeepsRdUpToHundredsOfKiB) {
  // 4 hosts at 10 Gbit/s: forced rd 287 us against the ring's 524 us at 128 KiB; the ring from
  // 1 MiB.
  auto t = multi_host(4);
  t.set_network(80e-6, 1.18e9);
  EXPECT_EQ(pick(t, 128 << 10), "rd");
  EXPECT_EQ(pick(t, 1 << 20), "ring");
}

TEST(Tuner, FoldingStepsCountWhenTheWorldIsNotAPowerOfTwo) {
  // N=5: rd takes 2 + 2 whole-buffer steps, the ring 8 steps of a fifth. At 24 KiB and 1 Gbit/s:
  // rd 4 x 207 us against the ring's 8 x 70 us: the ring, where N=4 (rd 2 x 207 us against the
  // ring's 6 x 70) keeps rd.
  auto five = multi_host(5), four = multi_host(4);
  five.set_network(70e-6, 0.119e9);
  four.set_network(70e-6, 0.119e9);
  EXPECT_EQ(pick(five, 24 << 10), "ring");
  EXPECT_EQ(pick(four, 24 << 10), "rd");
  EXPECT_EQ(pick(five, 4 << 10), "rd");
}

}  // namespace
