// Point to point: sends and receives matched per (peer, tag) in their own space, over shared
// memory, TCP and a mixed communicator: every size class (empty, eager, rendezvous), the order of
// messages with one tag, tags received out of order, receives from any source, the interleavings
// with collectives that would deadlock a design that queued them with the collectives, many
// outstanding requests, concurrency with collectives from another thread, and the errors.
#include <atomic>
#include <chrono>
#include <numeric>
#include <set>
#include <thread>

#include "harness.h"

namespace rrtest {
namespace {

using namespace std::chrono_literals;
using ringreduce::Communicator;
using ringreduce::Work;
constexpr int kAny = Communicator::kAnySource;

// Each test runs over shared memory, TCP and two emulated hosts.
class P2p : public OverEachTransport {};

// The payload of message `k` from rank `from`: every element tells where it came from.
std::vector<int32_t> payload(int from, int to, int k, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<int32_t>(from * 1000003 + to * 10007 + k * 101 + i);
  return v;
}

// Sizes around the eager limit (64 KiB) and well beyond, in int32 elements.
const std::vector<size_t> kSizes = {
    0, 1, 7, (64 << 10) / 4 - 1, (64 << 10) / 4, (64 << 10) / 4 + 1, (1 << 20) + 3};

TEST_P(P2p, EveryPairEverySizeBlockingAndAsync) {
  for (int n : {2, 3, 4}) {
    run_ranks(
        n,
        [&](Communicator& comm) {
          const int me = comm.rank();
          for (size_t k = 0; k < kSizes.size(); ++k) {
            const size_t count = kSizes[k];
            std::vector<std::vector<int32_t>> out(static_cast<size_t>(n)), in(out.size());
            std::vector<Work> works;
            for (int q = 0; q < n; ++q) {
              if (q == me) continue;
              out[static_cast<size_t>(q)] = payload(me, q, static_cast<int>(k), count);
              in[static_cast<size_t>(q)].assign(count, -1);
              works.push_back(
                  comm.recv_async(in[static_cast<size_t>(q)].data(), count, DataType::i32, q, k));
              works.push_back(
                  comm.send_async(out[static_cast<size_t>(q)].data(), count, DataType::i32, q, k));
            }
            for (auto& w : works) w.wait();
            for (int q = 0; q < n; ++q) {
              if (q == me) continue;
              ASSERT_EQ(in[static_cast<size_t>(q)], payload(q, me, static_cast<int>(k), count))
                  << "n=" << n << " count=" << count << " from " << q;
            }
          }
          // Blocking, around the ring: even ranks send first, odd ranks receive first.
          const int right = (me + 1) % n, left = (me + n - 1) % n;
          for (size_t count : {size_t{5}, size_t{300000}}) {
            auto mine = payload(me, right, 99, count);
            std::vector<int32_t> got(count);
            if (me % 2 == 0) {
              comm.send(std::span<const int32_t>(mine), right, 7);
              EXPECT_EQ(comm.recv(std::span<int32_t>(got), left, 7), left);
            } else {
              EXPECT_EQ(comm.recv(std::span<int32_t>(got), left, 7), left);
              comm.send(std::span<const int32_t>(mine), right, 7);
            }
            EXPECT_EQ(got, payload(left, me, 99, count));
          }
        },
        transport());
  }
}

TEST_P(P2p, OneTagKeepsItsOrderOtherTagsMayBeReceivedFirst) {
  run_ranks(
      2,
      [&](Communicator& comm) {
        // Same tag: eager and rendezvous sizes interleaved arrive in the order sent.
        const std::vector<size_t> sizes = {3, 200000, 0, 17, 100000, 1};
        if (comm.rank() == 0) {
          std::vector<std::vector<int32_t>> msgs;
          for (size_t k = 0; k < sizes.size(); ++k) msgs.push_back(payload(0, 1, int(k), sizes[k]));
          std::vector<Work> works;
          for (auto& m : msgs)
            works.push_back(comm.send_async(m.data(), m.size(), DataType::i32, 1, 4));
          // Tags 1 then 2, received 2 then 1 (rendezvous-sized, so the receiver's order decides).
          auto t1 = payload(0, 1, 100, 50000), t2 = payload(0, 1, 200, 50001);
          works.push_back(comm.send_async(t1.data(), t1.size(), DataType::i32, 1, 1));
          works.push_back(comm.send_async(t2.data(), t2.size(), DataType::i32, 1, 2));
          for (auto& w : works) w.wait();
        } else {
          std::this_thread::sleep_for(50ms);  // let the messages arrive before the receives
          for (size_t k = 0; k < sizes.size(); ++k) {
            std::vector<int32_t> got(sizes[k]);
            comm.recv(std::span<int32_t>(got), 0, 4);
            ASSERT_EQ(got, payload(0, 1, int(k), sizes[k])) << k;
          }
          std::vector<int32_t> a(50001), b(50000);
          comm.recv(std::span<int32_t>(a), 0, 2);
          comm.recv(std::span<int32_t>(b), 0, 1);
          EXPECT_EQ(a, payload(0, 1, 200, 50001));
          EXPECT_EQ(b, payload(0, 1, 100, 50000));
        }
      },
      transport());
}

TEST_P(P2p, AnySourceReportsTheSender) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        const size_t count = comm.rank() == 2 ? 100000 : 10;  // rank 2 rendezvous, 1 and 3 eager
        if (comm.rank() != 0) {
          // Everyone sends the same size so that any receive can take any message.
          auto m = payload(comm.rank(), 0, 0, 100000);
          (void)count;
          comm.send(std::span<const int32_t>(m), 0, 9);
          return;
        }
        std::set<int> seen;
        std::vector<Work> works;
        std::vector<std::vector<int32_t>> got(3, std::vector<int32_t>(100000));
        for (auto& g : got)
          works.push_back(comm.recv_async(g.data(), g.size(), DataType::i32, kAny, 9));
        for (size_t i = 0; i < works.size(); ++i) {
          works[i].wait();
          const int from = works[i].source();
          ASSERT_GE(from, 1);
          ASSERT_LE(from, 3);
          seen.insert(from);
          EXPECT_EQ(got[i], payload(from, 0, 0, 100000));
        }
        EXPECT_EQ(seen.size(), 3u);
      },
      transport());
}

TEST_P(P2p, InterleavingsWithCollectivesDoNotDeadlock) {
  run_ranks(
      2,
      [&](Communicator& comm) {
        // The case: rank 0 isend -> allreduce -> recv, rank 1 allreduce -> irecv -> send.
        // Both sizes: eager, and a rendezvous whose clear-to-send comes while rank 0 is in the
        // allreduce.
        for (size_t count : {size_t{100}, size_t{1} << 20}) {
          std::vector<float> grad(1 << 16, float(comm.rank() + 1));
          auto a = payload(0, 1, 1, count), b = payload(1, 0, 2, count);
          std::vector<int32_t> got(count);
          if (comm.rank() == 0) {
            Work s = comm.send_async(a.data(), count, DataType::i32, 1, 11);
            comm.allreduce(std::span<float>(grad), ReduceOp::sum);
            comm.recv(std::span<int32_t>(got), 1, 12);
            s.wait();
            EXPECT_EQ(got, b);
          } else {
            comm.allreduce(std::span<float>(grad), ReduceOp::sum);
            Work r = comm.recv_async(got.data(), count, DataType::i32, 0, 11);
            comm.send(std::span<const int32_t>(b), 0, 12);
            r.wait();
            EXPECT_EQ(got, a);
          }
          EXPECT_EQ(grad[0], 3.0f);
        }
        // A receive posted long before its send, with collectives in between on both sides.
        std::vector<int32_t> late(5000);
        Work r;
        if (comm.rank() == 1) r = comm.recv_async(late.data(), late.size(), DataType::i32, 0, 13);
        for (int i = 0; i < 20; ++i) {
          std::vector<int32_t> x(1000, 1);
          comm.allreduce(std::span<int32_t>(x), ReduceOp::sum);
          ASSERT_EQ(x[999], 2);
        }
        if (comm.rank() == 0) {
          std::this_thread::sleep_for(100ms);
          auto m = payload(0, 1, 13, late.size());
          comm.send(std::span<const int32_t>(m), 1, 13);
        } else {
          r.wait();
          EXPECT_EQ(late, payload(0, 1, 13, late.size()));
        }
      },
      transport());
}

TEST_P(P2p, ManyOutstandingRequestsToSeveralPeers) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        const int me = comm.rank(), n = comm.size();
        constexpr int kPerPeer = 40;
        std::vector<std::vector<int32_t>> out, in;
        std::vector<Work> works;
        out.reserve(size_t(n * kPerPeer));
        in.reserve(size_t(n * kPerPeer));
        // Sends first, everywhere: nothing is received until every rank has posted all its sends.
        for (int k = 0; k < kPerPeer; ++k)
          for (int q = 0; q < n; ++q) {
            if (q == me) continue;
            const size_t count = size_t(1 + (k * 977) % 30000);
            out.push_back(payload(me, q, k, count));
            works.push_back(
                comm.send_async(out.back().data(), count, DataType::i32, q, uint64_t(k)));
          }
        for (int k = kPerPeer - 1; k >= 0; --k)  // receive the tags backwards
          for (int q = 0; q < n; ++q) {
            if (q == me) continue;
            const size_t count = size_t(1 + (k * 977) % 30000);
            in.emplace_back(count, -1);
            works.push_back(
                comm.recv_async(in.back().data(), count, DataType::i32, q, uint64_t(k)));
          }
        for (auto& w : works) w.wait();
        size_t i = 0;
        for (int k = kPerPeer - 1; k >= 0; --k)
          for (int q = 0; q < n; ++q) {
            if (q == me) continue;
            ASSERT_EQ(in[i++], payload(q, me, k, size_t(1 + (k * 977) % 30000)));
          }
        comm.barrier();
      },
      transport());
}

TEST_P(P2p, SendsAndReceivesInOneThreadWhileCollectivesRunInAnother) {
  run_ranks(
      3,
      [&](Communicator& comm) {
        const int me = comm.rank(), n = comm.size();
        std::thread ring([&] {
          const int right = (me + 1) % n, left = (me + n - 1) % n;
          for (int k = 0; k < 200; ++k) {
            const size_t count = size_t(k % 2 ? 70000 : 3);
            auto m = payload(me, right, k, count);
            std::vector<int32_t> got(count);
            Work s = comm.send_async(m.data(), count, DataType::i32, right, 1);
            comm.recv(std::span<int32_t>(got), left, 1);
            s.wait();
            ASSERT_EQ(got, payload(left, me, k, count));
          }
        });
        for (int k = 0; k < 200; ++k) {
          std::vector<int64_t> x(size_t(k % 3 ? 10 : 200000), me);
          comm.allreduce(std::span<int64_t>(x), ReduceOp::sum);
          ASSERT_EQ(x.back(), 3);
        }
        ring.join();
      },
      transport());
}

TEST_P(P2p, SizeMismatchNamesBothRanksAndTheTagOnEveryRank) {
  std::vector<std::string> errors(3);
  run_ranks(
      3,
      [&](Communicator& comm) {
        std::vector<int32_t> buf(1000, 1);
        try {
          comm.barrier();  // every rank past start-up before the mismatch fails the communicator
          if (comm.rank() == 0) comm.send(buf.data(), 400, DataType::i32, 1, 21);
          if (comm.rank() == 1) comm.recv(buf.data(), 800, DataType::i32, 0, 21);
          comm.barrier();  // ranks 0 and 2 learn it here
          ADD_FAILURE() << "no error on rank " << comm.rank();
        } catch (const ringreduce::MismatchError& e) {
          errors[size_t(comm.rank())] = e.what();
        }
      },
      transport(), 20s);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("recv from rank 0 (tag 21, 3200 bytes)"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 0 sent 1600 bytes"), std::string::npos) << e;
  }
}

TEST_P(P2p, TimeoutNamesThePeerAndTheTag) {
  std::string error;
  run_ranks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 0) {
          std::vector<int32_t> buf(10);
          const auto start = std::chrono::steady_clock::now();
          try {
            comm.recv(buf.data(), buf.size(), DataType::i32, 1, 5, {.timeout = 700ms});
            ADD_FAILURE() << "no timeout";
          } catch (const ringreduce::TimeoutError& e) {
            error = e.what();
            EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
          }
        } else {
          std::this_thread::sleep_for(1500ms);  // sends nothing; its communicator sees the abort
        }
      },
      transport(), 20s);
  EXPECT_NE(error.find("rank 0: recv from rank 1 (tag 5, 40 bytes): timed out"), std::string::npos)
      << error;
}

TEST_P(P2p, BadArgumentsFailTheCallOnly) {
  run_ranks(
      2,
      [&](Communicator& comm) {
        std::vector<int32_t> buf(4, comm.rank());
        const int other = 1 - comm.rank();
        auto expect_bad = [&](auto&& fn, const std::string& words) {
          try {
            fn();
            ADD_FAILURE() << "accepted: " << words;
          } catch (const ringreduce::InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(comm.rank())),
                      std::string::npos)
                << e.what();
          }
        };
        expect_bad([&] { comm.send(buf.data(), 4, DataType::i32, 2, 0); }, "rank 2 is not a rank");
        expect_bad([&] { comm.send(buf.data(), 4, DataType::i32, kAny, 0); },
                   "needs a destination");
        expect_bad([&] { comm.recv(buf.data(), 4, DataType::i32, comm.rank(), 0); }, "itself");
        expect_bad([&] { comm.recv(nullptr, 4, DataType::i32, other, 0); }, "null");
        // The communicator goes on.
        if (comm.rank() == 0) {
          comm.send(std::span<const int32_t>(buf), 1, 3);
        } else {
          comm.recv(std::span<int32_t>(buf), 0, 3);
          EXPECT_EQ(buf[0], 0);
        }
        comm.barrier();
      },
      transport());
}

INSTANTIATE_TEST_SUITE_P(Transports, P2p, ::testing::ValuesIn(rrtest::transports()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rrtest
