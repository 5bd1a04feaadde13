// Communicator behaviour beyond the numbers: async Work, deadlines that name the rank waited on,
// mismatches, abort, bad arguments, IPv6 and interface choice, strangers at start-up, the C ABI.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <numeric>
#include <thread>

#include "comm/comm_impl.h"
#include "core/config.h"
#include "harness.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/ringreduce.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace rrtest {
namespace {

using namespace std::chrono_literals;
using ringreduce::Communicator;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(Comm, AsyncOpsCompleteInIssueOrderAndOverlapTheCaller) {
  run_ranks(3, [](Communicator& comm) {
    std::vector<std::vector<float>> bufs(8, std::vector<float>(100000));
    std::vector<ringreduce::Work> works;
    for (size_t i = 0; i < bufs.size(); ++i) {
      std::fill(bufs[i].begin(), bufs[i].end(), float(i + comm.rank()));
      works.push_back(comm.allreduce_async(std::span<float>(bufs[i]), ReduceOp::sum));
    }
    // test() never blocks; wait(timeout) returns once done.
    (void)works.back().test();
    ASSERT_TRUE(works.back().wait(30s));
    for (size_t i = 0; i < bufs.size(); ++i) {
      EXPECT_TRUE(works[i].test());  // issue order: the last one done means all are
      EXPECT_EQ(bufs[i][12345], float(3 * i + 0 + 1 + 2));
    }
    // The plan the tuner chose is reported: "<algorithm> seg=<bytes> ch=<channels>".
    EXPECT_NE(works[0].algorithm().find(" seg="), std::string::npos) << works[0].algorithm();
  });
}

TEST(Comm, BlockingAndAsyncCallsMix) {
  run_ranks(2, [](Communicator& comm) {
    std::vector<int32_t> a(1000, comm.rank() + 1), b(1000, 10);
    auto w = comm.allreduce_async(std::span<int32_t>(a), ReduceOp::sum);
    comm.allreduce(std::span<int32_t>(b), ReduceOp::max);  // runs after w, in issue order
    w.wait();
    EXPECT_EQ(a[0], 3);
    EXPECT_EQ(b[999], 10);
    comm.barrier();
  });
}

TEST(Comm, TimeoutNamesTheRankWaitedOnOpAndSequence) {
  // Rank 2 never calls the second allreduce. Rank 3 receives from rank 2 in the ring: it times
  // out naming rank 2, and its notice fails ranks 0 and 1; all name the op and its sequence.
  std::vector<std::string> messages(4);
  run_ranks(
      4,
      [&](Communicator& comm) {
        std::vector<float> buf(1024, 1.0f);
        comm.allreduce(std::span<float>(buf), ReduceOp::sum);
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(2500ms);  // outlive the others' deadline, then leave
          return;
        }
        auto start = Clock::now();
        try {
          // Rank 3 has the shortest deadline, so it is the one that reports first.
          comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum,
                         {.timeout = comm.rank() == 3 ? 500ms : 1500ms});
          ADD_FAILURE() << "no timeout on rank " << comm.rank();
        } catch (const ringreduce::TimeoutError& e) {
          EXPECT_LT(seconds_since(start), 1.0);
          messages[static_cast<size_t>(comm.rank())] = e.what();
        } catch (const ringreduce::Error& e) {
          // A rank whose neighbour timed out first may get that rank's notice instead.
          messages[static_cast<size_t>(comm.rank())] = e.what();
        }
        // After a failure every later op fails fast with the same cause.
        auto t = Clock::now();
        EXPECT_THROW(comm.barrier(), ringreduce::Error);
        EXPECT_LT(seconds_since(t), 0.5);
      },
      {}, 30s);
  EXPECT_NE(
      messages[3].find("rank 3: allreduce #2 (float x 1024, sum): timed out waiting for rank 2"),
      std::string::npos)
      << messages[3];
  for (int r : {0, 1})
    EXPECT_NE(messages[static_cast<size_t>(r)].find("allreduce #2"), std::string::npos)
        << messages[static_cast<size_t>(r)];
}

TEST(Comm, MismatchedDtypeOpRootAndKindAreNamedOnEveryRank) {
  struct Case {
    const char* name;
    std::function<void(Communicator&)> call;
    std::map<std::string, std::string> settings = {};
  };
  std::vector<Case> cases = {
      {"dtype",
       [](Communicator& c) {
         std::vector<double> d(64);
         c.allreduce(d.data(), d.data(), 64, c.rank() == 1 ? DataType::f32 : DataType::f64,
                     ReduceOp::sum);
       }},
      {"op",
       [](Communicator& c) {
         std::vector<float> d(64);
         c.allreduce(d.data(), d.data(), 64, DataType::f32,
                     c.rank() == 0 ? ReduceOp::max : ReduceOp::sum);
       }},
      {"root",
       [](Communicator& c) {
         std::vector<float> d(64);
         c.broadcast(d.data(), 64, DataType::f32, c.rank() == 2 ? 1 : 0);
       }},
      {"count, flat against ring",
       [](Communicator& c) {
         // Rank 2's call is large enough for the ring; the others' take the flat algorithm on
         // shared memory (or recursive doubling on TCP): different algorithms, one op.
         std::vector<float> d(1 << 20);
         c.allreduce(d.data(), d.data(), c.rank() == 2 ? d.size() : 64, DataType::f32,
                     ReduceOp::sum);
       }},
      {"count, both flat",
       [](Communicator& c) {
         std::vector<float> d(64);
         c.allreduce(d.data(), d.data(), c.rank() == 0 ? 63 : 64, DataType::f32, ReduceOp::sum);
       }},
      {"count, both direct",
       [](Communicator& c) {
         // Several rounds on rank 1, one on the others: the first stage stamp's fingerprint.
         std::vector<float> d(1 << 20);
         c.allreduce(d.data(), d.data(), c.rank() == 1 ? d.size() : 1000, DataType::f32,
                     ReduceOp::sum);
       },
       {{"RINGREDUCE_ALGO", "allreduce:direct"}}},
      {"count, striped over 3 TCP connections",
       [](Communicator& c) {
         // Different lengths cut into different stripes: whatever frame meets whatever receive,
         // every rank must hear of the mismatch, not hang on a stripe that never comes.
         std::vector<float> d(1 << 20);
         c.allreduce(d.data(), d.data(), c.rank() == 0 ? d.size() - 1000 : d.size(), DataType::f32,
                     ReduceOp::sum);
       },
       {{"RINGREDUCE_SHM", "0"}, {"RINGREDUCE_NSOCKS", "3"}}},
      {"kind",
       [](Communicator& c) {
         std::vector<float> d(64 * 3);
         if (c.rank() == 1)
           c.allgather(d.data(), d.data(), 64, DataType::f32);
         else
           c.allreduce(d.data(), d.data(), 64 * 3, DataType::f32, ReduceOp::sum);
       }},
  };
  for (auto& cs : cases) {
    std::atomic<int> mismatches{0};
    run_ranks(
        3,
        [&](Communicator& comm) {
          auto start = Clock::now();
          try {
            cs.call(comm);
            // A rank that only sends in this op cannot see the mismatch without an extra round
            // trip; it learns of it, from the rank that did, on its next call.
            comm.barrier();
            ADD_FAILURE() << cs.name << ": rank " << comm.rank() << " saw no error";
          } catch (const ringreduce::MismatchError& e) {
            EXPECT_LT(seconds_since(start), 5.0);
            EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(comm.rank()) + ": "),
                      std::string::npos);
            ++mismatches;
          }
        },
        cs.settings, 20s);
    EXPECT_EQ(mismatches.load(), 3) << cs.name;
  }
}

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

// Every algorithm the tuner can pick, forced, on each transport it runs on: rank 1 issues a call
// that differs in count, dtype, op or root. Every rank must raise a MismatchError naming itself
// (a rank that only sends in the op hears of it on its next call, from the rank that saw it),
// within seconds, never a hang or a wrong result. The fingerprint rides on each op's first
// message (the frame header or the FIFO slot's tag), so there is no extra round trip to time.
struct ForcedMismatch {
  std::string algo;  // RINGREDUCE_ALGO
  std::string how;   // which field differs
  std::map<std::string, std::string> where;
};

void call_with_mismatch(Communicator& c, const ForcedMismatch& m) {
  const bool odd = c.rank() == 1;
  const size_t n = m.how == "count" && odd ? 3001 : 3000;
  const DataType t = m.how == "dtype" && odd ? DataType::i32 : DataType::f32;
  const ReduceOp op = m.how == "op" && odd ? ReduceOp::max : ReduceOp::sum;
  const int root = m.how == "root" && odd ? 2 : 0;
  const size_t blocks = static_cast<size_t>(c.size());
  std::vector<float> a(3001 * blocks, 1.0f), b(3001 * blocks, 0.0f);
  const std::string coll = m.algo.substr(0, m.algo.find(':'));
  if (coll == "allreduce")
    c.allreduce(a.data(), b.data(), n, t, op);
  else if (coll == "broadcast")
    c.broadcast(a.data(), n, t, root);
  else if (coll == "reduce")
    c.reduce(a.data(), b.data(), n, t, op, root);
  else if (coll == "reduce_scatter")
    c.reduce_scatter(a.data(), b.data(), n, t, op);
  else if (coll == "allgather")
    c.allgather(a.data(), b.data(), n, t);
  else if (coll == "alltoall")
    c.alltoall(a.data(), b.data(), n, t);
}

TEST(Comm, EveryForcedAlgorithmReportsAMismatchOnEveryRank) {
  const std::map<std::string, std::string> shm = {}, tcp = {{"RINGREDUCE_SHM", "0"}},
                                           hosts = {{"TEST_HOSTS", "2"}};
  std::vector<ForcedMismatch> cases;
  for (const char* a : {"allreduce:ring", "allreduce:rd", "allreduce:rabenseifner",
                        "allreduce:tree", "allreduce:star"})
    for (const char* how : {"count", "dtype", "op"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const char* a : {"allreduce:flat", "allreduce:direct"})
    for (const char* how : {"count", "dtype", "op"}) cases.push_back({a, how, shm});
  for (const char* how : {"count", "dtype", "op"})
    cases.push_back({"allreduce:hierarchical", how, hosts});
  for (const char* a : {"broadcast:chain", "broadcast:binomial"})
    for (const char* how : {"count", "dtype", "root"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const char* a : {"reduce:chain", "reduce:binomial"})
    for (const char* how : {"count", "op", "root"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const char* a : {"reduce_scatter:ring", "allgather:ring", "alltoall:pairwise"})
    for (const char* how : {"count", "dtype"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const auto& m : cases) {
    const std::string name = m.algo + " " + m.how + " " + (m.where.empty() ? "shm" : "tcp/mix");
    auto settings = m.where;
    settings["RINGREDUCE_ALGO"] = m.algo;
    std::atomic<int> mismatches{0};
    auto store = ringreduce::make_memory_store();
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        auto start = Clock::now();
        try {
          const ringreduce::Options o = rank_options(r, 4, store, 10s, settings);
          // Inside the try: a rank still finishing its start-up (rank 0 passes the measured
          // costs around last) may hear of the others' mismatch there, and must report it too.
          Communicator comm(o);
          start = Clock::now();
          call_with_mismatch(comm, m);
          comm.barrier();
          ADD_FAILURE() << name << ": rank " << r << " saw no error";
        } catch (const ringreduce::MismatchError& e) {
          EXPECT_LT(seconds_since(start), 5.0) << name;
          EXPECT_EQ(std::string(e.what()).rfind("rank " + std::to_string(r) + ": ", 0), 0u)
              << name << ": " << e.what();
          EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
          ++mismatches;
        } catch (const std::exception& e) {
          ADD_FAILURE() << name << ": rank " << r << ": " << e.what();
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(mismatches.load(), 4) << name;
  }
}

TEST(Comm, AbortFromAnotherThreadFailsPendingAndLaterOpsQuickly) {
  run_ranks(2, [](Communicator& comm) {
    if (comm.rank() == 1) {
      // Rank 1 never joins the barrier: only abort() can end rank 0's wait.
      std::this_thread::sleep_for(1500ms);
      return;
    }
    std::vector<float> buf(1 << 20);
    std::thread killer([&] {
      std::this_thread::sleep_for(200ms);
      comm.abort("test abort");
    });
    auto start = Clock::now();
    // A barrier rank 1 never joins: only abort() can end it.
    EXPECT_THROW(comm.barrier(), ringreduce::Error);
    const double took = seconds_since(start);
    EXPECT_LT(took, 0.2 + 0.1 + 0.2);  // abort is seen within 100 ms (plus scheduling slack)
    killer.join();
    auto t = Clock::now();
    try {
      comm.allreduce(std::span<float>(buf), ReduceOp::sum);
      ADD_FAILURE() << "op after abort succeeded";
    } catch (const ringreduce::Error& e) {
      EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
    }
    EXPECT_LT(seconds_since(t), 0.1);
  });
}

TEST(Comm, AbortFailsARunningOpQueuedAsyncOpsAndLaterOpsWithItsReasonOnEveryTransport) {
  // Rank 1 never joins: rank 0 is inside a large allreduce with two more queued behind it when
  // another thread calls abort(). All three, and any later call, fail within 100 ms of the abort
  // with its reason; the communicator is then destroyed without hanging.
  for (const auto& settings : std::vector<std::map<std::string, std::string>>{
           {}, {{"RINGREDUCE_SHM", "0"}}, {{"TEST_HOSTS", "2"}}}) {
    std::atomic<bool> checked{false};
    run_ranks(
        2,
        [&checked](Communicator& comm) {
          if (comm.rank() == 1) {
            // Stays in the job until rank 0 is done, so that rank 0's ops fail by the abort, not
            // by this rank's exit. (A fixed 1.5 s was too short under TSan: rank 0's set-up of
            // three 16 MiB buffers alone took longer there.) Bounded: 20 s.
            for (int i = 0; i < 2000 && !checked.load(); ++i) std::this_thread::sleep_for(10ms);
            return;
          }
          std::vector<std::vector<float>> bufs(3, std::vector<float>(1 << 22, 1.0f));
          std::vector<ringreduce::Work> works;
          for (auto& b : bufs)
            works.push_back(comm.allreduce_async(std::span<float>(b), ReduceOp::sum));
          Clock::time_point aborted_at;
          std::thread killer([&] {
            std::this_thread::sleep_for(200ms);
            aborted_at = Clock::now();
            comm.abort("the trainer gave up");
          });
          for (auto& w : works) {
            try {
              w.wait();
              ADD_FAILURE() << "an op survived abort()";
            } catch (const ringreduce::Error& e) {
              EXPECT_NE(std::string(e.what()).find("the trainer gave up"), std::string::npos)
                  << e.what();
            }
          }
          killer.join();
          EXPECT_LT(seconds_since(aborted_at), 0.1);
          const auto t = Clock::now();
          EXPECT_THROW(comm.barrier(), ringreduce::Error);
          EXPECT_LT(seconds_since(t), 0.1);
          checked = true;
        },
        settings, 30s);
  }
}

TEST(Comm, DeadPeerNeverStretchesAWaitPastItsDeadline) {
  // Rank 1 leaves. Rank 0 sends to it (broadcast from 0), which draws a reset, then waits on
  // rank 2, which stays silent for 3 s: every call of rank 0 must end by its 1 s deadline, not
  // spin on the dead link's events.
  run_ranks(
      3,
      [](Communicator& comm) {
        comm.barrier();
        if (comm.rank() == 1) return;
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(3000ms);
          return;
        }
        std::vector<float> buf(1000, 1.0f), out(1000);
        std::this_thread::sleep_for(200ms);  // let rank 1's close arrive
        try {
          // Fails if the close has been seen; otherwise the kernel takes the data and the reset
          // comes back afterwards.
          comm.broadcast(buf.data(), buf.size(), DataType::f32, 0);
        } catch (const ringreduce::PeerError&) {
          return;  // the communicator is aborted now; nothing further to test
        }
        std::this_thread::sleep_for(100ms);  // let the reset arrive
        auto start = Clock::now();
        EXPECT_THROW(comm.reduce(buf.data(), out.data(), buf.size(), DataType::f32, ReduceOp::sum,
                                 0, {.timeout = 1000ms}),
                     ringreduce::Error);
        EXPECT_LT(seconds_since(start), 1.5);
      },
      {}, 30s);
}

// Two ranks; rank 0 runs `issue` and rank 1 never joins what it issues: rank 0's communicator is
// destroyed with those ops still pending.
void with_absent_peer(const std::function<void(Communicator&)>& issue) {
  run_ranks(
      2,
      [&](Communicator& comm) {
        comm.barrier();
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(300ms);
          return;
        }
        issue(comm);
      },
      {}, 30s);
}

TEST(Comm, WorkOutlivesItsCommunicator) {
  // Async ops still queued when the communicator is destroyed fail with a clear error; waiting
  // on their Work afterwards neither hangs nor touches the destroyed communicator.
  std::vector<ringreduce::Work> works(2);
  std::vector<std::vector<float>> bufs(2, std::vector<float>(1024, 1.0f));
  with_absent_peer([&](Communicator& comm) {
    works[0] = comm.allreduce_async(std::span<float>(bufs[0]), ReduceOp::sum);
    works[1] = comm.allreduce_async(std::span<float>(bufs[1]), ReduceOp::sum);
  });
  auto start = Clock::now();
  EXPECT_THROW(works[0].wait(), ringreduce::Error);
  EXPECT_THROW(works[1].wait(), ringreduce::Error);
  EXPECT_THROW(works[1].wait(10ms), ringreduce::Error);
  EXPECT_LT(seconds_since(start), 1.0);
}

TEST(Comm, OpsIssuedWhileTheCommunicatorIsDestroyedFail) {
  // The destructor fails the ops still queued and runs their callbacks; a callback that issues
  // the next op (a torch future's continuation does) gets a Work that has failed, naming why. It
  // used to start the progress thread again after the destructor had joined it, and the process
  // died in std::terminate when the thread was destroyed still joinable.
  ringreduce::Work pending;
  std::vector<ringreduce::Work> issued;
  std::vector<float> buf(1024, 1.0f), next(16, 1.0f);
  with_absent_peer([&](Communicator& comm) {
    pending = comm.allreduce_async(std::span<float>(buf), ReduceOp::sum);
    pending.then([&comm, &issued, &next](std::exception_ptr e) {
      if (!e) return;
      issued.push_back(comm.allreduce_async(std::span<float>(next), ReduceOp::sum));
      issued.push_back(comm.send_async(next.data(), next.size(), DataType::f32, 1, 7));
      issued.push_back(comm.recv_async(next.data(), next.size(), DataType::f32, 1, 7));
    });
  });
  ASSERT_EQ(issued.size(), 3u);
  for (auto& w : issued) {
    try {
      w.wait(1000ms);
      ADD_FAILURE() << "an op issued during destruction succeeded";
    } catch (const ringreduce::Error& e) {
      EXPECT_EQ(e.code(), ringreduce::ErrorCode::aborted) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0: "), std::string::npos) << e.what();
      // "being destroyed" when the destructor had begun; the failure of the interrupted op
      // ("communicator destroyed") when the callback ran as that op failed (seen under TSan).
      EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
    }
  }
}

TEST(Comm, BadArgumentsNameRankAndCallAndDoNotAbort) {
  run_ranks(2, [](Communicator& comm) {
    std::vector<float> buf(16);
    try {
      comm.broadcast(buf.data(), buf.size(), DataType::f32, 5);
      ADD_FAILURE();
    } catch (const ringreduce::InvalidArgument& e) {
      EXPECT_NE(
          std::string(e.what()).find("rank " + std::to_string(comm.rank()) + ": broadcast #1"),
          std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("root 5"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm.allreduce(nullptr, nullptr, 4, DataType::f32, ReduceOp::sum),
                 ringreduce::InvalidArgument);
    EXPECT_THROW(comm.alltoall(buf.data(), buf.data(), 8, DataType::f32),
                 ringreduce::InvalidArgument);
    // The communicator is still good, and sequence numbers stayed aligned.
    comm.allreduce(std::span<float>(buf), ReduceOp::sum);
  });
}

TEST(Comm, WorldOfOneIsACopy) {
  run_ranks(1, [](Communicator& comm) {
    std::vector<float> in(1000, 2.5f), out(1000);
    comm.allreduce(std::span<const float>(in), std::span<float>(out), ReduceOp::avg);
    EXPECT_EQ(out[999], 2.5f);
    comm.barrier();
  });
}

TEST(Comm, Ipv6DataConnections) {
  {
    ringreduce::transport::tcp::SockAddr probe;
    ringreduce::transport::tcp::parse_numeric("::1", 0, &probe);
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&probe.storage), probe.len) == 0;
    if (fd >= 0) close(fd);
    if (!ok) GTEST_SKIP() << "no IPv6 loopback on this machine";
  }
  run_ranks(3,
            [](Communicator& comm) {
              std::vector<int64_t> buf(1000, comm.rank());
              comm.allreduce(std::span<int64_t>(buf), ReduceOp::sum);
              EXPECT_EQ(buf[0], 3);
            },
            {{"RINGREDUCE_SOCKET_FAMILY", "AF_INET6"}, {"RINGREDUCE_SHM", "0"}});
}

TEST(Comm, CongestionControlThatTheKernelLacksKeepsTheDefault) {
  // RINGREDUCE_SOCKET_CC is a preference: a name the kernel does not know is logged, not fatal.
  for (const char* cc : {"nosuchcc", "system", "cubic"})
    run_ranks(2,
              [](Communicator& comm) {
                std::vector<float> buf(1 << 16, 1.0f);
                comm.allreduce(std::span<float>(buf), ReduceOp::sum);
                EXPECT_EQ(buf[0], 2.0f);
              },
              {{"RINGREDUCE_SOCKET_CC", cc}, {"RINGREDUCE_SHM", "0"}});
}

TEST(Comm, InterfaceByName) {
  run_ranks(2,
            [](Communicator& comm) {
              std::vector<float> buf(10, 1.0f);
              comm.allreduce(std::span<float>(buf), ReduceOp::sum);
              EXPECT_EQ(buf[0], 2.0f);
            },
            {{"RINGREDUCE_SOCKET_IFNAME", "=lo"},
             {"RINGREDUCE_SOCKET_FAMILY", "AF_INET"},
             {"RINGREDUCE_SHM", "0"}});
  // Checked at start-up even when there is nobody to connect to.
  EXPECT_THROW(run_ranks(1, [](Communicator&) {}, {{"RINGREDUCE_SOCKET_IFNAME", "=nosuchif0"}}),
               ringreduce::InvalidArgument);
}

TEST(Comm, StrangersAtStartUpAreDroppedAndTheJobConnects) {
  // Rank 0 listens before it joins and publishes its address in its join record; before rank 1
  // starts, strangers connect to it: one sends garbage, one a hello with another communicator id,
  // one says nothing at all, one sends five bytes of a hello and stops; once the table exists,
  // one poses as rank 1 without the token. Rank 0's first op meets them all in its connector.
  auto store = ringreduce::make_memory_store();
  std::vector<std::exception_ptr> errors(2);
  const std::map<std::string, std::string> settings = {
      {"RINGREDUCE_SHM", "0"},
      {"RINGREDUCE_HOST_ID", "strangers-test"},
      {"RINGREDUCE_TOKEN", "strangers-test-token"}};
  std::atomic<bool> strangers_in{false};
  std::thread rank0([&] {
    try {
      ringreduce::Options o;
      o.rank = 0;
      o.world_size = 2;
      o.store = store;
      o.timeout = 30s;
      o.settings = settings;
      Communicator comm(o);
      for (int i = 0; i < 1000 && !strangers_in; ++i) std::this_thread::sleep_for(10ms);
      std::vector<float> buf(100, 1.0f);
      comm.allreduce(std::span<float>(buf), ReduceOp::sum);
      EXPECT_EQ(buf[0], 2.0f);
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  // The last line of rank 0's join record says how to reach it (rendezvous/join.h):
  // "tcp=<host>|<port>|<nonce>".
  auto raw = store->get("rr/join/0", 10s);
  std::string record(raw.begin(), raw.end());
  const size_t at = record.find("tcp=");
  ASSERT_NE(at, std::string::npos) << record;
  const std::string addr = record.substr(at + 4, record.find_first_of(";\n", at) - at - 4);
  auto a = addr.find('|'), b = addr.find('|', a + 1);
  ringreduce::transport::tcp::SockAddr sa;
  ASSERT_TRUE(ringreduce::transport::tcp::parse_numeric(
      addr.substr(0, a), std::stoi(addr.substr(a + 1, b - a - 1)), &sa));
  auto deadline = ringreduce::core::Deadline::after(5s);
  auto garbage = ringreduce::transport::tcp::connect_to(sa, deadline);
  ASSERT_EQ(write(garbage.get(), "GET / HTTP/1.0\r\n\r\n-----------------", 36), 36);
  auto wrong = ringreduce::transport::tcp::connect_to(sa, deadline);
  uint32_t hello[8] = {0x31485252, 2, 12345, 0, 1, 0, 2, 0};  // right magic, wrong communicator
  ASSERT_EQ(write(wrong.get(), hello, sizeof hello), static_cast<ssize_t>(sizeof hello));
  auto silent = ringreduce::transport::tcp::connect_to(sa, deadline);
  // A trickler: the first bytes of a hello, the rest never (its reader waits, the job does not).
  auto trickle = ringreduce::transport::tcp::connect_to(sa, deadline);
  ASSERT_EQ(write(trickle.get(), hello, 5), 5);
  std::thread rank1([&] {
    try {
      ringreduce::Options o;
      o.rank = 1;
      o.world_size = 2;
      o.store = store;
      o.timeout = 30s;
      o.settings = settings;
      Communicator comm(o);
      std::vector<float> buf(100, 1.0f);
      comm.allreduce(std::span<float>(buf), ReduceOp::sum);
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  // One that knows everything but the token: the right communicator, claiming rank 1, with a
  // made-up proof. It must be dropped, and the real rank 1 must still get in.
  auto impostor = ringreduce::transport::tcp::connect_to(sa, deadline);
  {
    auto table = store->get("rr/table", 10s);  // the communicator id is its first line
    ringreduce::transport::tcp::Hello h;
    h.comm_id = std::stoull(std::string(table.begin(), table.end()));
    h.rank = 1;
    h.world_size = 2;
    h.auth = ringreduce::transport::tcp::kHelloAuthHmac;
    std::vector<uint8_t> msg(sizeof h + ringreduce::transport::tcp::kConnectorAuthBytes, 0x5a);
    std::memcpy(msg.data(), &h, sizeof h);
    ASSERT_EQ(write(impostor.get(), msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
  }
  strangers_in = true;
  rank0.join();
  rank1.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(Comm, TokenAuthenticatesSharedMemoryTcpAndMixedLinks) {
  for (const auto& extra : std::vector<std::map<std::string, std::string>>{
           {}, {{"RINGREDUCE_SHM", "0"}}, {{"TEST_HOSTS", "2"}}}) {
    auto settings = extra;
    settings["RINGREDUCE_TOKEN"] = "a shared secret";
    run_ranks(
        4,
        [](Communicator& comm) {
          std::vector<float> buf(100000, 1.0f);
          comm.allreduce(std::span<float>(buf), ReduceOp::sum);
          EXPECT_EQ(buf[0], 4.0f);
          EXPECT_EQ(buf.back(), 4.0f);
        },
        settings, 30s);
  }
}

// Starts `size` ranks, rank r with settings[r]; returns each rank's error message ("" if its
// communicator came up) and how long each took.
std::vector<std::string> start_ranks(
    int size, const std::vector<std::map<std::string, std::string>>& settings,
    std::chrono::milliseconds timeout, std::vector<double>* took) {
  auto store = ringreduce::make_memory_store();
  std::vector<std::string> errors(static_cast<size_t>(size));
  took->assign(static_cast<size_t>(size), 0);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(rank_options(r, size, store, timeout, settings[static_cast<size_t>(r)]));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
      (*took)[static_cast<size_t>(r)] = seconds_since(start);
    });
  for (auto& t : threads) t.join();
  return errors;
}

TEST(Comm, ATokenOnOneRankOnlyIsNamedAtStartUp) {
  for (const std::string shm : {"0", "1"}) {
    std::vector<std::map<std::string, std::string>> s(2, {{"RINGREDUCE_SHM", shm}});
    s[1]["RINGREDUCE_TOKEN"] = "only rank 1 has it";
    std::vector<double> took;
    auto errors = start_ranks(2, s, 2s, &took);
    // Rank 1 reads rank 0's published "no token" and says so at once; rank 0, left waiting,
    // fails at its deadline.
    EXPECT_NE(errors[1].find("RINGREDUCE_TOKEN is set here but not on rank 0"), std::string::npos)
        << errors[1];
    EXPECT_LT(took[1], 1.0);
    EXPECT_FALSE(errors[0].empty());
    EXPECT_LT(took[0], 2.0 + 1.0);
  }
}

TEST(Comm, AWrongTokenIsDroppedLikeAStrangerAndNamedAtTheTimeout) {
  for (const std::string shm : {"0", "1"}) {
    std::vector<std::map<std::string, std::string>> s(
        2, {{"RINGREDUCE_SHM", shm}, {"RINGREDUCE_TOKEN", "right"}});
    s[1]["RINGREDUCE_TOKEN"] = "wrong";
    std::vector<double> took;
    auto errors = start_ranks(2, s, 2s, &took);
    // Rank 0 drops the connection with the bad proof (failing at once would let any stranger
    // fail the job) and names it when its wait ends: at its deadline, or when rank 1, which
    // holds the store's token (a stranger does not), marks the job failed. Over TCP its own
    // connection to rank 1 may be dropped first, by rank 1: that names the token too.
    EXPECT_TRUE(errors[0].find("timed out waiting for") != std::string::npos ||
                errors[0].find("rank 1 failed") != std::string::npos ||
                errors[0].find("rank 1 closed our data connection before answering its hello") !=
                    std::string::npos)
        << errors[0];
    if (shm == "0") {
      EXPECT_TRUE(errors[0].find("wrong proof of the token") != std::string::npos ||
                  errors[0].find("a different RINGREDUCE_TOKEN there?") != std::string::npos)
          << errors[0];
    }
    EXPECT_NE(errors[1].find("RINGREDUCE_TOKEN"), std::string::npos) << errors[1];
    EXPECT_EQ(errors[1].rfind("rank 1: ", 0), 0u) << errors[1];
    for (double t : took) EXPECT_LT(t, 2.0 + 1.0);
  }
}

TEST(Comm, StallWarningNamesTheRanksThatHaveNotReachedTheOpOnceAndAgainAtTheTimeout) {
  // Rank 2 reaches the second allreduce 1.5 s late, and never reaches the third. With
  // RINGREDUCE_STALL_WARN=0.4 the others warn once per op that rank 2 has not reached it, and
  // again when the third times out. Rank 2, never waiting, never warns.
  testing::internal::CaptureStderr();
  run_ranks(
      3,
      [](Communicator& comm) {
        std::vector<float> buf(1024, 1.0f);
        comm.allreduce(std::span<float>(buf), ReduceOp::sum);
        if (comm.rank() == 2) std::this_thread::sleep_for(1500ms);
        comm.allreduce(std::span<float>(buf), ReduceOp::sum);
        EXPECT_EQ(buf[0], 9.0f);
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(2500ms);  // past the others' deadline
          return;
        }
        EXPECT_THROW(comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32,
                                    ReduceOp::sum, {.timeout = 1500ms}),
                     ringreduce::Error);
        std::this_thread::sleep_for(300ms);  // the report at the timeout is made by the monitor
      },
      {{"RINGREDUCE_STALL_WARN", "0.4"}}, 30s);
  const std::string err = testing::internal::GetCapturedStderr();
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t p = err.find(what); p != std::string::npos; p = err.find(what, p + 1)) ++n;
    return n;
  };
  for (int r : {0, 1}) {
    const std::string me = "rank " + std::to_string(r) + "] WARN stall: ";
    EXPECT_EQ(count(me + "allreduce #2 (float x 1024, sum) has waited"), 1u) << err;
    EXPECT_EQ(count(me + "allreduce #3 (float x 1024, sum) has waited"), 1u) << err;
    // Again at the timeout: its own, or a peer's that failed this rank's wait first.
    EXPECT_EQ(count(me + "allreduce #3 (float x 1024, sum) timed out after 1.5 s") +
                  count(me + "allreduce #3 (float x 1024, sum) failed ("),
              1u)
        << err;
  }
  // Rank 2 came last to #2 and so never waited in it: it has never left word in the store.
  EXPECT_EQ(count("not known to have reached it: rank 2 (rank 2 never reported a wait)"), 6u)
      << err;
  EXPECT_EQ(count("rank 2] WARN stall"), 0u) << err;
}

TEST(Comm, CApiRefusesDestroyedAndForeignHandles) {
  ringreduce::rendezvous::TcpStoreServer server("127.0.0.1", 0);
  setenv("RINGREDUCE_STORE_SERVER", "0", 1);
  rr_comm_t* comm = nullptr;
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  ASSERT_EQ(rr_comm_init(&comm, 0, 1, addr.c_str(), nullptr, 10), RR_OK) << rr_last_error(nullptr);
  unsetenv("RINGREDUCE_STORE_SERVER");
  float x = 1;
  rr_work_t* work = nullptr;
  ASSERT_EQ(rr_allreduce_async(comm, &x, &x, 1, RR_F32, RR_SUM, &work), RR_OK);
  EXPECT_EQ(rr_comm_size(comm), 1);
  rr_comm_destroy(comm);
  // The communicator is gone: its calls are errors, not crashes.
  EXPECT_EQ(rr_allreduce(comm, &x, &x, 1, RR_F32, RR_SUM), RR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rr_last_error(comm)).find("is not a live handle"), std::string::npos)
      << rr_last_error(comm);
  EXPECT_EQ(rr_comm_rank(comm), -1);
  rr_comm_destroy(comm);  // a second destroy does nothing
  // Its Work outlives it (the op had completed or was failed by the destruction).
  rr_result_t r = rr_work_wait(work);
  EXPECT_TRUE(r == RR_OK || r == RR_ERR_ABORTED) << rr_last_error(nullptr);
  rr_work_free(work);
  EXPECT_EQ(rr_work_wait(work), RR_ERR_INVALID_ARGUMENT);
  rr_work_free(work);
  // A pointer ringreduce never made.
  int not_a_comm = 0;
  EXPECT_EQ(rr_barrier(reinterpret_cast<rr_comm_t*>(&not_a_comm)), RR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rr_last_error(nullptr)).find("rr_comm_t"), std::string::npos);
}

TEST(Comm, CApiReportsErrorsWithoutExceptions) {
  // Through the C ABI, with the TCP store hosted by rank 0 as in a real job.
  ringreduce::rendezvous::TcpStoreServer probe("127.0.0.1", 0);
  const int port = probe.port();
  // Use the probe server as the job's store: ranks must not host their own.
  setenv("RINGREDUCE_STORE_SERVER", "0", 1);
  std::vector<int> results(3, -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      rr_comm_t* comm = nullptr;
      std::string addr = "127.0.0.1:" + std::to_string(port);
      if (rr_comm_init(&comm, r, 3, addr.c_str(), nullptr, 30) != RR_OK) {
        ADD_FAILURE() << rr_last_error(nullptr);
        return;
      }
      std::vector<int32_t> buf(1000, r);
      int rc = rr_allreduce(comm, buf.data(), buf.data(), buf.size(), RR_I32, RR_SUM);
      EXPECT_EQ(buf[7], 3);
      // Registered memory: allocated, reduced in, refused when foreign, freed.
      void* mem = nullptr;
      rc |= rr_mem_alloc(comm, 1 << 20, &mem);
      auto* m = static_cast<int32_t*>(mem);
      std::fill(m, m + (1 << 18), r);
      rc |= rr_allreduce(comm, m, m, 1 << 18, RR_I32, RR_SUM);
      EXPECT_EQ(m[(1 << 18) - 1], 3);
      EXPECT_EQ(rr_mem_free(comm, r == 2 ? buf.data() : mem), RR_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(rr_last_error(comm)).find("free: "), std::string::npos);
      rc |= rr_mem_free(comm, mem);
      rr_work_t* w = nullptr;
      rc |= rr_allreduce_async(comm, buf.data(), buf.data(), buf.size(), RR_I32, RR_MAX, &w);
      rc |= rr_work_wait(w);
      rr_work_free(w);
      // A bad root is an error code and a message, not an exception.
      EXPECT_EQ(rr_broadcast(comm, buf.data(), 10, RR_I32, 7), RR_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(rr_last_error(comm)).find("root 7"), std::string::npos);
      // Point to point: around the ring, async sends, blocking receives from a given rank and
      // from any rank.
      std::vector<int32_t> mine(10, r), got(10, -1);
      rr_work_t* s = nullptr;
      rc |= rr_send_async(comm, mine.data(), mine.size(), RR_I32, (r + 1) % 3, 5, &s);
      int source = -1;
      rc |= rr_recv(comm, got.data(), got.size(), RR_I32, r == 0 ? RR_ANY_SOURCE : (r + 2) % 3, 5,
                    &source);
      EXPECT_EQ(source, (r + 2) % 3);
      EXPECT_EQ(got[9], (r + 2) % 3);
      rc |= rr_work_wait(s);
      EXPECT_EQ(rr_work_source(s), -1);  // a send has no source
      rr_work_free(s);
      EXPECT_EQ(rr_send(comm, mine.data(), 1, RR_I32, r, 0), RR_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(rr_last_error(comm)).find("itself"), std::string::npos);
      // premul_sum with this rank's factor; bitwise on bool.
      std::vector<float> f(5, 2.0f);
      rc |= rr_allreduce_premul_sum(comm, f.data(), f.data(), f.size(), RR_F32, 0.5 * (r + 1));
      EXPECT_EQ(f[4], 6.0f);  // 2 * (0.5 + 1 + 1.5)
      std::vector<int32_t> flags_int(2, 1);
      // Wire formats: bf16 keeps 2.0 exact; an integer call refused with a message; an unknown
      // format refused before anything is issued.
      std::vector<float> coded(300, 2.0f), gathered(900, 0.0f);
      rc |= rr_allreduce_wire(comm, coded.data(), coded.data(), coded.size(), RR_F32, RR_SUM,
                              RR_WIRE_BF16);
      EXPECT_EQ(coded[299], 6.0f);
      rc |= rr_allgather_wire(comm, coded.data(), gathered.data(), 300, RR_F32, RR_WIRE_FP8E4M3);
      EXPECT_EQ(gathered[899], 6.0f);
      rc |= rr_reduce_scatter_wire(comm, gathered.data(), coded.data(), 300, RR_F32, RR_AVG,
                                   RR_WIRE_DEFAULT);
      EXPECT_EQ(coded[0], 6.0f);
      EXPECT_EQ(rr_allreduce_wire(comm, flags_int.data(), flags_int.data(), 2, RR_I32, RR_SUM,
                                  RR_WIRE_F16),
                RR_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(rr_last_error(comm)).find("wire format f16"), std::string::npos);
      // (7: no format, yet a value the enum can hold; C++ gives other values no meaning.)
      EXPECT_EQ(rr_allreduce_wire(comm, coded.data(), coded.data(), 1, RR_F32, RR_SUM,
                                  static_cast<rr_wire_t>(7)),
                RR_ERR_INVALID_ARGUMENT);
      std::vector<uint8_t> flags = {uint8_t(r == 1), 1};
      rc |= rr_allreduce(comm, flags.data(), flags.data(), 2, RR_BOOL, RR_BXOR);
      EXPECT_EQ(flags[0], 1);
      EXPECT_EQ(flags[1], 1);  // three trues
      // Uneven blocks; a null counts array is an error code.
      const size_t counts[3] = {1, 0, 2};
      std::vector<int32_t> all(3, -1), own(size_t(counts[r]), r);
      rc |= rr_allgatherv(comm, own.data(), all.data(), counts, RR_I32);
      EXPECT_EQ(all, (std::vector<int32_t>{0, 2, 2}));
      EXPECT_EQ(rr_allgatherv(comm, own.data(), all.data(), nullptr, RR_I32),
                RR_ERR_INVALID_ARGUMENT);
      std::vector<int32_t> g(3, -1);
      int32_t one = r * 10;
      rc |= rr_gather(comm, &one, r == 2 ? g.data() : nullptr, 1, RR_I32, 2);
      if (r == 2) {
        EXPECT_EQ(g, (std::vector<int32_t>{0, 10, 20}));
      }
      // A split through the job's TCP store: ranks 0 and 2 together, rank 1 alone; the group
      // outlives its parent.
      rr_comm_t* group = nullptr;
      rc |= rr_comm_split(comm, r % 2, r, &group);
      rc |= rr_barrier(comm);
      results[static_cast<size_t>(r)] = rc;
      rr_comm_destroy(comm);
      if (group == nullptr) {
        ADD_FAILURE() << "rank " << r << ": no group";
        return;
      }
      EXPECT_EQ(rr_comm_size(group), r % 2 == 0 ? 2 : 1);
      EXPECT_EQ(rr_comm_rank(group), r / 2);
      int32_t v = r;
      EXPECT_EQ(rr_allreduce(group, &v, &v, 1, RR_I32, RR_SUM), RR_OK) << rr_last_error(group);
      EXPECT_EQ(v, r % 2 == 0 ? 2 : 1);
      rr_comm_t* none = nullptr;
      EXPECT_EQ(rr_comm_split(group, RR_NO_COLOR, 0, &none), RR_OK);
      EXPECT_EQ(none, nullptr);
      rr_comm_destroy(group);
    });
  }
  for (auto& t : threads) t.join();
  unsetenv("RINGREDUCE_STORE_SERVER");
  for (int rc : results) EXPECT_EQ(rc, RR_OK);
  rr_comm_t* none = nullptr;
  EXPECT_EQ(rr_comm_init(&none, 5, 2, "127.0.0.1:1", nullptr, 1), RR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rr_last_error(nullptr)).find("RINGREDUCE_RANK"), std::string::npos)
      << rr_last_error(nullptr);
}

// Work::then (what the torch backend completes its futures with): called once, with the op's
// result, whether the op completes later in the progress thread, has already completed, or is
// failed by abort() while queued.
TEST(Comm, ThenCallsBackOnceOnSuccessAfterCompletionAndOnAbort) {
  run_ranks(2, [](Communicator& comm) {
    std::vector<float> buf(1 << 16, 1.0f);
    std::atomic<int> calls{0};
    std::promise<bool> ok;
    ringreduce::Work w = comm.allreduce_async(std::span<float>(buf), ReduceOp::sum);
    w.then([&](std::exception_ptr e) {
      ++calls;
      ok.set_value(e == nullptr);
    });
    // Nobody waits on w: the progress thread completes it and calls back.
    auto f = ok.get_future();
    ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(f.get());
    EXPECT_EQ(buf[0], 2.0f);
    w.wait();
    EXPECT_EQ(calls.load(), 1);

    bool ran_here = false;
    w.then([&](std::exception_ptr e) { ran_here = e == nullptr; });  // already complete: at once
    EXPECT_TRUE(ran_here);

    if (comm.rank() == 1) return;  // rank 0's next ops wait for a peer that never comes
    std::atomic<int> failed{0};
    ringreduce::Work b1 = comm.barrier_async();
    ringreduce::Work b2 = comm.barrier_async();
    for (auto* b : {&b1, &b2})
      b->then([&](std::exception_ptr e) {
        if (e) ++failed;
      });
    std::this_thread::sleep_for(100ms);
    comm.abort("then test");
    for (int i = 0; i < 200 && failed.load() < 2; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(failed.load(), 2);
  });
}

}  // namespace
}  // namespace rrtest
