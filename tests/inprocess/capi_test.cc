// The C ABI (include/ringreduce/ringreduce.h's rr_* calls): errors as codes and messages, never
// exceptions; destroyed and foreign handles refused. (Split from comm_test.cc; the tests keep the
// suite name Comm.)
#include <stdlib.h>

#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/ringreduce.h"

namespace rrtest {
namespace {

using namespace std::chrono_literals;
using ringreduce::Communicator;
using Clock = std::chrono::steady_clock;

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

}  // namespace
}  // namespace rrtest
