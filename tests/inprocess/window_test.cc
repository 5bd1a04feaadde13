// The shared window's algorithms over many calls (the flat barrier, flat and direct allreduces
// among rooted ops reusing its areas), and what chooses algorithms besides the measured model:
// RINGREDUCE_ALGO forcing a window algorithm without shared memory, RINGREDUCE_TUNING_FILE.
// (Split from comm_test.cc; the tests keep the suite name Comm.)
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "harness.h"

namespace rrtest {
namespace {

using namespace std::chrono_literals;
using ringreduce::Communicator;
using Clock = std::chrono::steady_clock;

TEST(Comm, FlatBarrierHoldsEveryRankUntilAllArrive) {
  // Many barriers in a row reuse each rank's two window areas in turn; ranks arrive in a
  // different order each time. Nobody may leave a barrier before everyone has entered it.
  for (int n : {2, 3, 5}) {
    std::atomic<int> arrived{0};
    run_ranks(n, [&](Communicator& comm) {
      for (int i = 0; i < 300; ++i) {
        if ((i + comm.rank()) % n == 0) std::this_thread::sleep_for(50us);
        arrived.fetch_add(1);
        comm.barrier();
        ASSERT_GE(arrived.load(), (i + 1) * n) << "rank " << comm.rank() << " barrier " << i;
        comm.barrier();  // nobody starts the next round before everyone checked this one
      }
    });
  }
}

TEST(Comm, FlatAllreduceAfterRootedOpsKeepsItsInputs) {
  // A broadcast's root finishes without hearing from anyone, so it can start the next flat
  // allreduce, whose window area is the one of the allreduce before the broadcast, while a slower
  // rank still reads that one: the window's reuse guard must hold it. Large flat buffers (slow to
  // read), more threads than cores (readers get preempted) and many rounds make the race likely.
  run_ranks(4,
            [](Communicator& comm) {
              const int n = comm.size(), r = comm.rank();
              const size_t count = (16 << 10) - 8;  // just under the flat algorithm's limit
              std::vector<int32_t> a(count), b(count);
              for (int i = 0; i < 3000; ++i) {
                const size_t k = static_cast<size_t>(i * 131) % count;
                std::fill(a.begin(), a.end(), r + i);
                comm.allreduce(std::span<int32_t>(a), ReduceOp::sum);
                ASSERT_EQ(a[k], n * i + n * (n - 1) / 2) << "round " << i << " element " << k;
                ASSERT_EQ(a[count - 1 - k], n * i + n * (n - 1) / 2) << "round " << i;
                b[0] = b[1] = i;
                comm.broadcast(b.data(), 2, DataType::i32, i % n);
                ASSERT_EQ(b[1], i) << "round " << i;
              }
            },
            {{"RINGREDUCE_ALGO", "allreduce:flat"}});
}

TEST(Comm, DirectAllreduceBetweenFlatAndRootedOpsKeepsItsBuffers) {
  // Direct allreduces (several rounds each for the large counts, fewer elements than ranks for
  // the small ones) reuse each rank's two staging buffers round after round and op after op. A
  // broadcast's root finishes without hearing from anyone and starts the next direct op while a
  // slower rank still gathers from the last one; flat barriers and allreduces in between use the
  // window's flat areas and its reuse floor. More threads than cores (readers get preempted) and
  // many rounds make a missing guard show. Two passes: every allreduce direct (so that small
  // counts are direct too), then flat allreduces up to flat's limit and direct above.
  for (const bool with_flat : {false, true}) {
    run_ranks(
        4,
        [&](Communicator& comm) {
          const int n = comm.size(), r = comm.rank();
          // Direct rounds at N=4 carry 236 KiB (60416 int32) per slice: 700001 elements take three.
          // With flat allreduces, counts up to 16380 int32 go flat.
          const std::vector<size_t> counts =
              with_flat ? std::vector<size_t>{16381, 700001, 40001, 131072}
                        : std::vector<size_t>{1, 3, 700001, 4, 1000, 40001, 131072, 2};
          const size_t flat_count = (16 << 10) - 8;  // just under the flat algorithm's limit
          std::vector<int32_t> a(700001), b(700001), f(flat_count);
          for (int i = 0; i < 600; ++i) {
            const size_t count = counts[static_cast<size_t>(i) % counts.size()];
            const std::span<int32_t> in(a.data(), count), out(b.data(), count);
            for (size_t e = 0; e < count; ++e) in[e] = r + i + static_cast<int32_t>(e % 7);
            const bool in_place = i % 3 != 1;
            if (in_place)
              comm.allreduce(in, ReduceOp::sum);
            else
              comm.allreduce(std::span<const int32_t>(in), out, ReduceOp::sum);
            const std::span<int32_t> res = in_place ? in : out;
            for (size_t e = 0; e < count; ++e)
              ASSERT_EQ(res[e], n * (i + static_cast<int32_t>(e % 7)) + n * (n - 1) / 2)
                  << "round " << i << " count " << count << " element " << e;
            if (!in_place) {
              for (size_t e = 0; e < count; ++e)
                ASSERT_EQ(in[e], r + i + static_cast<int32_t>(e % 7)) << "round " << i;
            }

            b[0] = b[1] = i;
            comm.broadcast(b.data(), 2, DataType::i32, i % n);
            ASSERT_EQ(b[1], i) << "round " << i;

            if (i % 2 == 0) {
              std::fill(f.begin(), f.end(), r - i);
              comm.allreduce(std::span<int32_t>(f), ReduceOp::sum);
              const int32_t want = -n * i + n * (n - 1) / 2;
              ASSERT_EQ(f[static_cast<size_t>(i * 131) % flat_count], want) << "round " << i;
              ASSERT_EQ(f[flat_count - 1], want) << "round " << i;
            } else {
              comm.barrier();
            }
            // The root of a second broadcast runs straight into the next direct op.
            comm.broadcast(b.data(), 2, DataType::i32, (i + 1) % n);
          }
        },
        {{"RINGREDUCE_ALGO", with_flat ? "allreduce:flat,allreduce:direct" : "allreduce:direct"}});
  }
}

TEST(Comm, ForcingAWindowAlgorithmWithoutSharedMemoryIsAnError) {
  try {
    run_ranks(2, [](Communicator&) {}, {{"RINGREDUCE_SHM", "0"}, {"RINGREDUCE_ALGO", "flat"}});
    ADD_FAILURE() << "no error";
  } catch (const ringreduce::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce:flat"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("one host"), std::string::npos) << e.what();
  }
}

// RINGREDUCE_TUNING_FILE replaces the start-up measurement. With a message step of a whole
// second the model must pick the fewest steps: recursive doubling's one exchange at N=2 over TCP,
// where with measured costs the ring takes 1 MiB.
// A file under /tmp holding `text`, removed when the test ends, however it ends.
struct TempFile {
  explicit TempFile(const std::string& text) {
    const int fd = mkstemp(path);
    EXPECT_GE(fd, 0) << "mkstemp";
    if (fd < 0) return;
    EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
  }
  ~TempFile() { unlink(path); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  char path[32] = "/tmp/rr_tuning_XXXXXX";
};

TEST(Comm, TuningFileReplacesTheMeasuredCosts) {
  TempFile file("# test\nlink shm 2 1e-6 1e-9 0\nlink tcp 2 1 1e-12 0\ngamma 1e-12\n");
  const char* path = file.path;
  run_ranks(2,
            [](Communicator& comm) {
              std::vector<float> buf(1 << 18, 1.0f);
              auto w = comm.allreduce_async(buf.data(), buf.data(), buf.size(), DataType::f32,
                                            ReduceOp::sum);
              w.wait();
              EXPECT_EQ(w.algorithm().rfind("rd ", 0), 0u) << w.algorithm();
              EXPECT_EQ(buf[7], 2.0f);
              EXPECT_NE(comm.tuning().find("link tcp 2 1 1e-12"), std::string::npos)
                  << comm.tuning();
            },
            {{"RINGREDUCE_TUNING_FILE", path}, {"RINGREDUCE_SHM", "0"}});
}

TEST(Comm, AMalformedTuningFileFailsEveryRankNamingTheLine) {
  TempFile file("link shm 2 fast\n");
  const char* path = file.path;
  // Rank 0 reads the file; rank 1 must not wait for it in vain either.
  std::atomic<int> failed{0};
  std::vector<std::thread> ranks;
  auto store = ringreduce::make_memory_store();
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        ringreduce::Options o;
        o.rank = r;
        o.world_size = 2;
        o.store = store;
        o.store_prefix = "tuning_file";
        o.timeout = std::chrono::seconds(20);
        o.settings["RINGREDUCE_TUNING_FILE"] = path;
        Communicator comm(o);
        ADD_FAILURE() << "rank " << r << ": no error";
      } catch (const ringreduce::InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("rank " + std::to_string(r)), std::string::npos) << what;
        EXPECT_NE(what.find(path), std::string::npos) << what;
        if (r == 0) {
          EXPECT_NE(what.find("line 1"), std::string::npos) << what;
        }
        ++failed;
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(failed.load(), 2);
}

}  // namespace
}  // namespace rrtest
