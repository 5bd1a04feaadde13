// Device links (transport/device/) on the emulated device: an allreduce on device buffers between
// the ranks of one host runs device to device, its link copying into the neighbour's exported
// inbox and reducing with the device's kernels, never touching the buffers from the host (the
// emulated device memory is PROT_NONE: a host access crashes the test). What these tests cannot
// check is CUDA itself (VMM across processes, peer access, the kernels' speed): scripts/gpu-check.
#include "emulated_device.h"
#include "harness.h"
#include "ringreduce/ringreduce.h"

namespace rrtest {
namespace {

using ringreduce::CallOptions;
using ringreduce::Communicator;
using ringreduce::Memory;

// Small slots, so that a call crosses many of them and every slot is reused.
const std::map<std::string, std::string> kLinks = {{"RINGREDUCE_DEVICE_LINKS", "1"},
                                                   {"RINGREDUCE_DEVICE_SLOT_BYTES", "4096"}};

class DeviceLinks : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = std::make_shared<EmulatedDevice>();
    ringreduce::detail::set_device_runtime(dev_);
  }
  void TearDown() override { ringreduce::detail::set_device_runtime(nullptr); }
  std::shared_ptr<EmulatedDevice> dev_;
};

// Every element right for sum, avg and max, in and out of place, blocking and async, at sizes
// from one element to many slots; and the kernels ran (a staged call runs none).
TEST_F(DeviceLinks, AllreduceRunsDeviceToDevice) {
  for (int n : {2, 3, 4})
    run_ranks(
        n,
        [&](Communicator& comm) {
          Stream stream;
          const int me = comm.rank();
          for (size_t count : {size_t{1}, size_t{1000}, size_t{100003}})
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
              for (int form = 0; form < 4; ++form) {
                const bool in_place = form & 1, async = form & 2;
                float* send = dev_->alloc_of<float>(count);
                float* recv = in_place ? send : dev_->alloc_of<float>(count);
                for (size_t i = 0; i < count; ++i)
                  dev_->view(send)[i] = float(me + 1) * float(i % 89);
                CallOptions call;
                call.stream = &stream;
                call.memory = form == 3 ? Memory::device : Memory::automatic;
                if (async) {
                  comm.allreduce_async(send, recv, count, DataType::f32, op, call).wait();
                  stream.synchronize();
                } else {
                  comm.allreduce(send, recv, count, DataType::f32, op, call);
                }
                const float ranks = float(n * (n + 1) / 2);
                const float factor = op == ReduceOp::sum   ? ranks
                                     : op == ReduceOp::avg ? ranks / float(n)
                                                           : float(n);
                for (size_t i = 0; i < count; ++i)
                  ASSERT_FLOAT_EQ(dev_->view(recv)[i], factor * float(i % 89))
                      << "n=" << n << " count " << count << " op " << int(op) << " form " << form
                      << " element " << i;
              }
        },
        kLinks);
  EXPECT_GT(dev_->kernels(), 0u) << "no reduction ran on the device: the calls were staged";
}

// The same communicator keeps its host links for host buffers and stages what device links do
// not carry (other collectives, a coded call), all right, in any order.
TEST_F(DeviceLinks, HostCallsAndOtherCollectivesBeside) {
  run_ranks(
      3,
      [&](Communicator& comm) {
        Stream stream;
        CallOptions call;
        call.stream = &stream;
        const int me = comm.rank();
        const size_t c = 5000;
        int64_t* d = dev_->alloc_of<int64_t>(c * 3);
        for (int round = 0; round < 2; ++round) {
          for (size_t i = 0; i < c; ++i) dev_->view(d)[i] = me + int64_t(i);
          comm.allreduce(d, d, c, DataType::i64, ReduceOp::sum, call);
          for (size_t i = 0; i < c; ++i) ASSERT_EQ(dev_->view(d)[i], 3 + 3 * int64_t(i));
          std::vector<int64_t> host(c, me);
          comm.allreduce(host.data(), host.data(), c, DataType::i64, ReduceOp::sum);
          ASSERT_EQ(host[c - 1], 3);
          // allgather on device buffers: staged.
          for (size_t i = 0; i < c; ++i) dev_->view(d)[c * size_t(me) + i] = me * 7 + int64_t(i);
          comm.allgather(d + c * size_t(me), d, c, DataType::i64, call);
          for (int r = 0; r < 3; ++r)
            ASSERT_EQ(dev_->view(d)[c * size_t(r) + 9], r * 7 + 9) << "allgather block " << r;
        }
      },
      kLinks);
}

// Ranks on different hosts have no device link: the call is staged, and right.
TEST_F(DeviceLinks, AcrossHostsStaged) {
  auto s = kLinks;
  s["TEST_HOSTS"] = "2";
  run_ranks(
      4,
      [&](Communicator& comm) {
        Stream stream;
        CallOptions call;
        call.stream = &stream;
        const size_t c = 3001;
        float* d = dev_->alloc_of<float>(c);
        for (size_t i = 0; i < c; ++i) dev_->view(d)[i] = float(comm.rank());
        comm.allreduce(d, d, c, DataType::f32, ReduceOp::sum, call);
        EXPECT_EQ(dev_->view(d)[c - 1], 6.0f);
      },
      s);
  EXPECT_EQ(dev_->kernels(), 0u);
}

// Ranks that issue different calls on device links fail with a MismatchError naming both calls
// on every rank, never reducing one into the other.
TEST_F(DeviceLinks, MismatchedCallsNamed) {
  std::vector<std::string> errors(2);
  run_ranks(
      2,
      [&](Communicator& comm) {
        Stream stream;
        CallOptions call;
        call.stream = &stream;
        const size_t count = comm.rank() == 0 ? 1000 : 2000;
        float* d = dev_->alloc_of<float>(count);
        try {
          comm.allreduce(d, d, count, DataType::f32, ReduceOp::sum, call);
        } catch (const ringreduce::MismatchError& e) {
          errors[size_t(comm.rank())] = e.what();
        }
      },
      kLinks, std::chrono::seconds(20));
  for (int r = 0; r < 2; ++r) {
    const std::string& what = errors[size_t(r)];
    EXPECT_NE(what.find("rank " + std::to_string(r) + ": "), std::string::npos) << what;
    EXPECT_NE(what.find("mismatched call"), std::string::npos) << what;
    EXPECT_NE(what.find("1000"), std::string::npos) << what;
    EXPECT_NE(what.find("2000"), std::string::npos) << what;
  }
}

// RINGREDUCE_DEVICE_LINKS=1 in a process that uses no GPU is refused when the communicator is
// made, saying why.
TEST(DeviceLinksWithoutDevice, InsistingWithoutAGpuIsRefused) {
  if (ringreduce::detail::device_runtime().in_use()) GTEST_SKIP() << "this process uses CUDA";
  try {
    run_ranks(
        2, [](Communicator&) {}, kLinks, std::chrono::seconds(20));
    ADD_FAILURE() << "no error";
  } catch (const ringreduce::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RINGREDUCE_DEVICE_LINKS=1, but this process uses no GPU"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace rrtest
