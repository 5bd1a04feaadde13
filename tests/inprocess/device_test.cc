// Collectives and sends on device memory, through the staging path of comm/device.h (allreduce
// between this process's ranks also over device links, RINGREDUCE_DEVICE_LINKS=auto), on an
// emulated device: "device memory" is address space the host cannot touch (PROT_NONE; a host
// access to it crashes the test), backed by host memory only the emulated streams' copies reach,
// and a stream is a worker thread running its tasks in order. So these tests check, on machines
// without a GPU, what the staging does: which bytes it copies in and out and where, that a call
// returns before its stream has reached it, that the op waits for its input and releases the
// stream when it finishes (done, failed or timed out), and that staging memory is reused. What
// they cannot check is CUDA itself: scripts/gpu-check runs the same calls on a GPU.
#include <sys/socket.h>

#include "comm/device.h"
#include "core/fd_passing.h"
#include "emulated_device.h"
#include "harness.h"
#include "reduce/cuda/runtime.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/ringreduce.h"

namespace rrtest {
namespace {

using ringreduce::CallOptions;
using ringreduce::Communicator;
using ringreduce::Memory;
using ringreduce::detail::DeviceRuntime;

class Device : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = std::make_shared<EmulatedDevice>();
    ringreduce::detail::set_device_runtime(dev_);
  }
  void TearDown() override { ringreduce::detail::set_device_runtime(nullptr); }
  std::shared_ptr<EmulatedDevice> dev_;
};

// A float sum on call.stream, blocking or async; either way the stream has passed it on return.
void sum_on_stream(Communicator& comm, const float* send, float* recv, size_t count,
                   const CallOptions& call, bool async) {
  if (async) {
    auto w = comm.allreduce_async(send, recv, count, DataType::f32, ReduceOp::sum, call);
    w.wait();
    static_cast<Stream*>(call.stream)->synchronize();
  } else {
    comm.allreduce(send, recv, count, DataType::f32, ReduceOp::sum, call);
  }
}

// Staging only: the emulated device is in use, so RINGREDUCE_DEVICE_LINKS=auto would otherwise
// run allreduce between this process's ranks over device links (device_links_test.cc).
const std::map<std::string, std::string> kStaged = {{"RINGREDUCE_DEVICE_LINKS", "0"}};

// allreduce in and out of place, blocking and async, detected and stated: every element right,
// staged and over device links.
TEST_F(Device, AllreduceEveryPlacementAndForm) {
  for (const char* links : {"0", "auto"})
    for (int n : {1, 2, 3})
      run_ranks(n,
                [&](Communicator& comm) {
                  Stream stream;
                  const int me = comm.rank();
                  for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}})
                    for (int form = 0; form < 4; ++form) {
                      const bool in_place = form & 1, async = form & 2;
                      float* send = dev_->alloc_of<float>(count);
                      float* recv = in_place ? send : dev_->alloc_of<float>(count);
                      for (size_t i = 0; i < count; ++i)
                        dev_->view(send)[i] = float(me + 1) * float(i % 97);
                      CallOptions call;
                      call.stream = &stream;
                      call.memory = form == 3 ? Memory::device : Memory::automatic;
                      sum_on_stream(comm, send, recv, count, call, async);
                      const float ranks = float(n * (n + 1) / 2);
                      for (size_t i = 0; i < count; ++i)
                        ASSERT_EQ(dev_->view(recv)[i], ranks * float(i % 97))
                            << "n=" << n << " count " << count << " form " << form << " element "
                            << i;
                    }
                },
                {{"RINGREDUCE_DEVICE_LINKS", links}});
}

// A large allreduce is staged in pieces (at least 4 MiB each, at most 8: one wait on the stream
// per piece), each piece reduced as its input arrives and copied out while the next one runs;
// every element right in and out of place, blocking and async, with a count that is not a whole
// number of pieces. Smaller calls stay whole (one wait).
TEST_F(Device, LargeAllreduceIsStagedInPieces) {
  run_ranks(
      2,
      [&](Communicator& comm) {
        Stream stream;
        const int me = comm.rank();
        for (size_t count : {size_t{2} << 20, (size_t{5} << 20) + 3}) {
          // Filled and checked a whole buffer at a time (element loops cost most of the test under
          // TSan); the larger count in two of the four forms.
          std::vector<float> input(count), want(count);
          for (size_t i = 0; i < count; ++i) {
            input[i] = float(me + 1) * float(i % 89);
            want[i] = 3.0f * float(i % 89);
          }
          for (int form :
               count == (size_t{2} << 20) ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 3}) {
            const bool in_place = form & 1, async = form & 2;
            float* send = dev_->alloc_of<float>(count);
            float* recv = in_place ? send : dev_->alloc_of<float>(count);
            std::memcpy(dev_->view(send), input.data(), count * sizeof(float));
            CallOptions call;
            call.stream = &stream;
            // Between the barriers both ranks (one emulated device) issue this call and no other.
            const size_t waits = dev_->value_waits();
            comm.barrier();
            sum_on_stream(comm, send, recv, count, call, async);
            comm.barrier();
            // 8 MiB: 2 pieces of 4 MiB; 20 MiB + 12 B: 5 pieces (the last 308 B short of the
            // others).
            EXPECT_EQ(dev_->value_waits() - waits, 2 * (count == (size_t{2} << 20) ? 2u : 5u));
            EXPECT_EQ(std::memcmp(dev_->view(recv), want.data(), count * sizeof(float)), 0)
                << "count " << count << " form " << form;
          }
        }
      },
      kStaged);
}

// The call returns while its stream is still busy with earlier work; the op runs once the
// stream gets there, and the stream's later work sees the result.
TEST_F(Device, StreamOrderedCallReturnsAtOnce) {
  run_ranks(2, [&](Communicator& comm) {
    Stream stream;
    const size_t count = 4096;
    int* buf = dev_->alloc_of<int>(count);
    int* after = dev_->alloc_of<int>(count);  // the stream's next work copies the result here
    stream.gate();                            // "the kernels that compute the gradients"
    for (size_t i = 0; i < count; ++i) dev_->view(buf)[i] = comm.rank() + 1;
    CallOptions call;
    call.stream = &stream;
    auto w = comm.allreduce_async(buf, buf, count, DataType::i32, ReduceOp::sum, call);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(w.test()) << "the op ran before its stream reached it";
    dev_->copy(after, buf, count * sizeof(int), &stream);
    stream.open();
    w.wait();
    stream.synchronize();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(dev_->view(after)[i], 3) << i;
  });
}

// side_stream: the call runs on the communicator's stream; the caller's stream goes on at once
// (its later work does not wait for the communication), and wait_output() gives the result.
TEST_F(Device, SideStreamLeavesCallerStreamFree) {
  run_ranks(2, [&](Communicator& comm) {
    Stream stream;
    const size_t count = 50000;
    float* buf = dev_->alloc_of<float>(count);
    std::fill(dev_->view(buf), dev_->view(buf) + count, float(comm.rank() + 1));
    CallOptions call;
    call.stream = &stream;
    call.side_stream = true;
    // Rank 1 comes late: until then rank 0's op cannot finish.
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto w = comm.allreduce_async(buf, buf, count, DataType::f32, ReduceOp::sum, call);
    std::atomic<bool> later_ran{false};
    stream.enqueue([&] { later_ran = true; });  // "the next layer's backward kernels"
    if (comm.rank() == 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!later_ran && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(later_ran.load()) << "the caller's stream waited for the communication";
      EXPECT_FALSE(w.test()) << "rank 0 finished before rank 1 called";
    }
    w.wait_output();
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(dev_->view(buf)[i], 3.0f) << i;
    stream.synchronize();
  });
}

// Every collective and a send/receive on device memory give what they give on host memory,
// including the in-place conventions and the buffers only some ranks pass.
TEST_F(Device, EveryCollectiveAsOnHost) {
  const int n = 3;
  run_ranks(n, [&](Communicator& comm) {
    Stream stream;
    CallOptions call;
    call.stream = &stream;
    const int me = comm.rank();
    const size_t c = 1001;
    const size_t N = size_t(n);
    auto dev_copy = [&](const std::vector<int64_t>& v) {
      int64_t* d = dev_->alloc_of<int64_t>(v.size());
      std::copy(v.begin(), v.end(), dev_->view(d));
      return d;
    };
    auto host_of = [&](int64_t* d, size_t len) {
      return std::vector<int64_t>(dev_->view(d), dev_->view(d) + len);
    };
    std::vector<int64_t> one(c), many(c * N);
    for (size_t i = 0; i < c; ++i) one[i] = me * 100000 + int64_t(i);
    for (size_t i = 0; i < c * N; ++i) many[i] = me * 10000000 + int64_t(i);
    const auto T = DataType::i64;

    // reduce_scatter, in place: recv is block `rank` of send.
    {
      std::vector<int64_t> want(c);
      comm.reduce_scatter(many.data(), want.data(), c, T, ReduceOp::sum);
      int64_t* d = dev_copy(many);
      comm.reduce_scatter(d, d + c * size_t(me), c, T, ReduceOp::sum, call);
      EXPECT_EQ(host_of(d + c * size_t(me), c), want) << "reduce_scatter in place";
    }
    // allgather, in place (send is block `rank` of recv) and out of place.
    {
      std::vector<int64_t> want(c * N);
      comm.allgather(one.data(), want.data(), c, T);
      std::vector<int64_t> init(c * N, -1);
      std::copy(one.begin(), one.end(), init.begin() + long(c * size_t(me)));
      int64_t* d = dev_copy(init);
      comm.allgather(d + c * size_t(me), d, c, T, call);
      EXPECT_EQ(host_of(d, c * N), want) << "allgather in place";
      int64_t* s = dev_copy(one);
      int64_t* r = dev_copy(std::vector<int64_t>(c * N, -1));
      comm.allgather(s, r, c, T, call);
      EXPECT_EQ(host_of(r, c * N), want) << "allgather";
    }
    // broadcast out of place (send read on the root only), reduce (recv on the root only).
    for (int root : {0, n - 1}) {
      std::vector<int64_t> want(c);
      comm.broadcast(one.data(), want.data(), c, T, root);
      int64_t* s = me == root ? dev_copy(one) : nullptr;
      int64_t* r = dev_copy(std::vector<int64_t>(c, -1));
      comm.broadcast(s, r, c, T, root, call);
      EXPECT_EQ(host_of(r, c), want) << "broadcast root " << root;

      std::vector<int64_t> red(c, -1);
      comm.reduce(one.data(), me == root ? red.data() : nullptr, c, T, ReduceOp::max, root);
      int64_t* rr = me == root ? dev_copy(std::vector<int64_t>(c, -1)) : nullptr;
      comm.reduce(dev_copy(one), rr, c, T, ReduceOp::max, root, call);
      if (me == root) {
        EXPECT_EQ(host_of(rr, c), red) << "reduce root " << root;
      }
    }
    // gather and scatter at the last rank, alltoall.
    {
      const int root = n - 1;
      std::vector<int64_t> want(c * N, -1);
      comm.gather(one.data(), me == root ? want.data() : nullptr, c, T, root);
      int64_t* r = me == root ? dev_copy(std::vector<int64_t>(c * N, -1)) : nullptr;
      comm.gather(dev_copy(one), r, c, T, root, call);
      if (me == root) {
        EXPECT_EQ(host_of(r, c * N), want) << "gather";
      }

      std::vector<int64_t> got(c);
      comm.scatter(me == root ? many.data() : nullptr, got.data(), c, T, root);
      int64_t* d = dev_copy(std::vector<int64_t>(c, -1));
      comm.scatter(me == root ? dev_copy(many) : nullptr, d, c, T, root, call);
      EXPECT_EQ(host_of(d, c), got) << "scatter";

      std::vector<int64_t> a2a(c * N);
      comm.alltoall(many.data(), a2a.data(), c, T);
      int64_t* ar = dev_copy(std::vector<int64_t>(c * N, -1));
      comm.alltoall(dev_copy(many), ar, c, T, call);
      EXPECT_EQ(host_of(ar, c * N), a2a) << "alltoall";
    }
    // The v-collectives: blocks of their own sizes.
    {
      const std::vector<size_t> counts = {3, 0, 70001};
      const size_t total = 70004;
      std::vector<int64_t> mine(counts[size_t(me)], me), all(total);
      comm.allgatherv(mine.data(), all.data(), counts, T);
      int64_t* r = dev_copy(std::vector<int64_t>(total, -1));
      comm.allgatherv(dev_copy(mine), r, counts, T, call);
      EXPECT_EQ(host_of(r, total), all) << "allgatherv";

      std::vector<int64_t> src(total, me + 1), part(counts[size_t(me)]);
      comm.reduce_scatterv(src.data(), part.data(), counts, T, ReduceOp::sum);
      int64_t* p = dev_copy(std::vector<int64_t>(counts[size_t(me)], -1));
      comm.reduce_scatterv(dev_copy(src), p, counts, T, ReduceOp::sum, call);
      EXPECT_EQ(host_of(p, counts[size_t(me)]), part) << "reduce_scatterv";

      // alltoallv: rank i sends (i + j + 1) * 5 elements to rank j.
      std::vector<size_t> sc(N), rc(N);
      size_t st = 0, rt = 0;
      for (int j = 0; j < n; ++j) {
        sc[size_t(j)] = size_t(me + j + 1) * 5;
        rc[size_t(j)] = size_t(j + me + 1) * 5;
        st += sc[size_t(j)];
        rt += rc[size_t(j)];
      }
      std::vector<int64_t> s(st), want(rt);
      for (size_t i = 0; i < st; ++i) s[i] = me * 1000 + int64_t(i);
      comm.alltoallv(s.data(), sc, want.data(), rc, T);
      int64_t* vr = dev_copy(std::vector<int64_t>(rt, -1));
      comm.alltoallv(dev_copy(s), sc, vr, rc, T, call);
      EXPECT_EQ(host_of(vr, rt), want) << "alltoallv";
    }
    // send and receive around the ring, small (eager) and large.
    for (size_t count : {size_t{3}, size_t{300000}}) {
      std::vector<int64_t> msg(count, me * 7 + 1);
      int64_t* d = dev_copy(msg);
      int64_t* r = dev_copy(std::vector<int64_t>(count, -1));
      const int right = (me + 1) % n, left = (me + n - 1) % n;
      // The send first: it waits in this thread for the stream to copy its data out, and a
      // receive queued on the stream before it would hold the stream until it arrived.
      auto sw = comm.send_async(d, count, T, right, 5, call);
      EXPECT_EQ(comm.recv(r, count, T, left, 5, call), left);
      sw.wait();
      EXPECT_EQ(host_of(r, count), std::vector<int64_t>(count, left * 7 + 1)) << "recv " << count;
    }
  });
}

// Host and device buffers mixed in one call: only the device one is staged.
TEST_F(Device, HostInputDeviceOutput) {
  run_ranks(2, [&](Communicator& comm) {
    Stream stream;
    CallOptions call;
    call.stream = &stream;
    std::vector<double> in(777, comm.rank() + 0.5);
    double* out = dev_->alloc_of<double>(777);
    comm.allreduce(in.data(), out, in.size(), DataType::f64, ReduceOp::sum, call);
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(dev_->view(out)[i], 2.0) << i;
  });
}

// Staging memory is allocated by the first call of a size and reused by the next ones.
TEST_F(Device, StagingIsPooled) {
  run_ranks(2, [&](Communicator& comm) {
    Stream stream;
    CallOptions call;
    call.stream = &stream;
    float* buf = dev_->alloc_of<float>(100000);
    std::fill(dev_->view(buf), dev_->view(buf) + 100000, 1.0f);
    for (int k = 0; k < 20; ++k)
      comm.allreduce(buf, buf, 100000, DataType::f32, ReduceOp::avg, call);
    EXPECT_EQ(dev_->view(buf)[99999], 1.0f);
  });
  // One slot per rank, whatever the number of calls.
  EXPECT_EQ(dev_->host_allocations(), 2u);
}

// A stream that never reaches the call: the op fails with a timeout naming the rank and the call
// (and the peers learn it), and the stream is released rather than left waiting.
TEST_F(Device, StreamThatNeverArrivesTimesOut) {
  std::atomic<int> timeouts{0};
  run_ranks(
      2,
      [&](Communicator& comm) {
        Stream stream;
        float* buf = dev_->alloc_of<float>(64);
        CallOptions call;
        call.stream = &stream;
        if (comm.rank() == 1) stream.gate();  // never opened before the deadline
        try {
          comm.allreduce(buf, buf, 64, DataType::f32, ReduceOp::sum, call);
          ADD_FAILURE() << "rank " << comm.rank() << ": the allreduce did not fail";
        } catch (const ringreduce::Error& e) {
          const std::string what = e.what();
          if (comm.rank() == 1) {
            EXPECT_EQ(e.code(), ringreduce::ErrorCode::timeout) << what;
            EXPECT_NE(what.find("rank 1: allreduce"), std::string::npos) << what;
            EXPECT_NE(what.find("CUDA stream"), std::string::npos) << what;
            ++timeouts;
          }
        }
        stream.open();
        stream.synchronize();  // returns: the failed op released the stream
      },
      {}, std::chrono::milliseconds(1500));
  EXPECT_EQ(timeouts.load(), 1);
}

}  // namespace
}  // namespace rrtest

namespace rrtest {
namespace {

// The C ABI's stream-ordered calls: enqueued and returned; the stream's later work sees the
// result; rr_comm_async_error stays RR_OK.
TEST_F(Device, CApiOnStream) {
  ringreduce::rendezvous::TcpStoreServer store("127.0.0.1", 0);
  const std::string addr = "127.0.0.1:" + std::to_string(store.port());
  setenv("RINGREDUCE_STORE_SERVER", "0", 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      rr_comm_t* comm = nullptr;
      ASSERT_EQ(rr_comm_init(&comm, r, 2, addr.c_str(), nullptr, 30), RR_OK)
          << rr_last_error(nullptr);
      Stream stream;
      const size_t count = 100003;
      int32_t* buf = dev_->alloc_of<int32_t>(count);
      int32_t* all = dev_->alloc_of<int32_t>(2 * count);
      int32_t* msg = dev_->alloc_of<int32_t>(10);
      std::fill(dev_->view(buf), dev_->view(buf) + count, r + 1);
      std::fill(dev_->view(msg), dev_->view(msg) + 10, r * 10);
      EXPECT_EQ(rr_allreduce_on_stream(comm, buf, buf, count, RR_I32, RR_SUM, &stream), RR_OK)
          << rr_last_error(comm);
      EXPECT_EQ(rr_allgather_on_stream(comm, buf, all, count, RR_I32, &stream), RR_OK)
          << rr_last_error(comm);
      EXPECT_EQ(rr_send_on_stream(comm, msg, 10, RR_I32, 1 - r, 9, &stream), RR_OK)
          << rr_last_error(comm);
      EXPECT_EQ(rr_recv_on_stream(comm, msg, 10, RR_I32, 1 - r, 9, &stream), RR_OK)
          << rr_last_error(comm);
      // A bad root is refused at once, like the blocking call's.
      EXPECT_EQ(rr_broadcast_on_stream(comm, buf, buf, count, RR_I32, 5, &stream),
                RR_ERR_INVALID_ARGUMENT);
      stream.synchronize();
      EXPECT_EQ(dev_->view(all)[count + 17], 3);
      EXPECT_EQ(dev_->view(msg)[9], (1 - r) * 10);
      EXPECT_EQ(rr_comm_async_error(comm), RR_OK) << rr_last_error(comm);
      rr_comm_destroy(comm);
    });
  for (auto& t : threads) t.join();
  unsetenv("RINGREDUCE_STORE_SERVER");
}

// Sends `fd` over a Unix socket as SCM_RIGHTS (core/fd_passing.h) and returns what arrives: how
// a descriptor of shared device memory reaches the other process.
core::Fd pass_descriptor(int fd) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return {};
  core::Fd a(sv[0]), b(sv[1]);
  const char byte = 'x';
  if (core::send_with_fds(a.get(), &byte, 1, &fd, 1) != 1) return {};
  char got = 0;
  std::vector<core::Fd> fds;
  std::string err;
  if (core::recv_with_fds(b.get(), &got, 1, 1, &fds, &err) != 1 || fds.size() != 1) return {};
  return std::move(fds[0]);
}

// The contract a device link between processes is built on (DeviceRuntime::SharedMemory, CUDA's
// VMM with POSIX descriptors): memory exported by one process and imported by another through a
// descriptor passed over a Unix socket is the same memory, both ways, at whole granules; an import
// of another size is refused. Two emulated devices stand for the two processes; gpu-check is to
// run the same on a GPU.
TEST(DeviceSharedMemory, ExportedMemoryIsTheImportersBothWays) {
  EmulatedDevice a, b;
  auto mine = a.shared_memory(3 << 20);
  ASSERT_EQ(mine->size(), size_t{4} << 20) << "rounded up to whole granules";
  core::Fd sent = mine->export_fd();
  core::Fd got = pass_descriptor(sent.get());
  ASSERT_TRUE(got.valid());
  EXPECT_THROW(b.import_memory(got.get(), mine->size() / 2), ringreduce::Error);
  auto theirs = b.import_memory(got.get(), mine->size());
  ASSERT_EQ(theirs->size(), mine->size());
  EXPECT_TRUE(b.is_device(theirs->data()));
  // b's stream writes near the end of the range; a's stream reads it back, and the reverse.
  const size_t at = mine->size() - 4096;
  std::vector<uint8_t> in(4096), out(4096, 0), back(4096, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
  b.copy(theirs->data() + at, in.data(), in.size(), nullptr);
  b.default_stream().synchronize();
  a.copy(out.data(), mine->data() + at, out.size(), nullptr);
  a.default_stream().synchronize();
  EXPECT_EQ(out, in);
  a.copy(mine->data(), out.data(), 100, nullptr);
  a.default_stream().synchronize();
  b.copy(back.data(), theirs->data(), 100, nullptr);
  b.default_stream().synchronize();
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + 100, in.begin()));
  // The importer's mapping outlives the exporter's object: the memory goes with the last.
  mine.reset();
  b.copy(back.data(), theirs->data() + at, 16, nullptr);
  b.default_stream().synchronize();
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + 16, in.begin()));
}

// Without a device runtime in use, a call that states device memory is refused on the spot with
// a message that says why, through the C++ API and the C ABI alike.
TEST(DeviceWithoutCuda, DeviceMemoryRefusedClearly) {
  if (ringreduce::reduce::cuda::in_use()) GTEST_SKIP() << "this process uses CUDA";
  run_ranks(2, [&](Communicator& comm) {
    std::vector<float> buf(16, 1.0f);
    CallOptions call;
    call.memory = Memory::device;
    try {
      comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum, call);
      ADD_FAILURE() << "no error";
    } catch (const ringreduce::InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank " + std::to_string(comm.rank()) + ": allreduce"), std::string::npos)
          << what;
      EXPECT_NE(what.find("does not use CUDA"), std::string::npos) << what;
    }
    // The call was not issued: the next one runs normally.
    comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum);
    EXPECT_EQ(buf[3], 2.0f);
  });
}

}  // namespace
}  // namespace rrtest
