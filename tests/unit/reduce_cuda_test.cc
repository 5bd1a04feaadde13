// The CUDA kernels (src/reduce/cuda) against the CPU kernels: the same arithmetic
// (elementwise.inc), so every dtype x op must give the CPU's bits, NaNs aside (a GPU's
// arithmetic returns the canonical NaN where x86 keeps the first operand's payload). Without a
// device, or in a build without CUDA, the device tests skip saying why.

#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/fd_passing.h"
#include "reduce/cuda/reduce_cuda.h"
#include "reduce/cuda/runtime.h"
#include "reduce/reduce.h"
#include "reduce_reference.h"
#include "ringreduce/error.h"
#include "ringreduce/types.h"

namespace {

namespace cuda = ringreduce::reduce::cuda;
namespace reduce = ringreduce::reduce;
using namespace rr_test;  // reduce_reference.h: kAllTypes, kAllOps, random_elements

#define RR_NEED_DEVICE()                                                                           \
  do {                                                                                             \
    if (!cuda::available()) GTEST_SKIP() << "needs a CUDA device: " << cuda::unavailable_reason(); \
  } while (0)

bool is_nan(const unsigned char* p, DataType t) {
  uint64_t v = 0;
  std::memcpy(&v, p, ringreduce::dtype_size(t));  // little-endian: the low bytes
  switch (t) {
    case DataType::f16:
      return half_is_nan(static_cast<uint16_t>(v));
    case DataType::bf16:
      return bf16_is_nan(static_cast<uint16_t>(v));
    case DataType::f32:
      return std::isnan(bits_as<float>(static_cast<uint32_t>(v)));
    case DataType::f64:
      return std::isnan(bits_as<double>(v));
    default:
      return false;
  }
}

// The first element where got and want differ (both NaN counts as equal), or n.
size_t first_difference(const std::vector<unsigned char>& got,
                        const std::vector<unsigned char>& want, size_t n, DataType t) {
  const size_t s = ringreduce::dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* g = got.data() + i * s;
    const unsigned char* w = want.data() + i * s;
    if (std::memcmp(g, w, s) == 0) continue;
    if (is_nan(g, t) && is_nan(w, t)) continue;
    return i;
  }
  return n;
}

std::string what(DataType t, ReduceOp op, size_t n, size_t offset) {
  return std::string(ringreduce::dtype_name(t)) + " " + ringreduce::op_name(op) + " x " +
         std::to_string(n) + " at element offset " + std::to_string(offset);
}

TEST(CudaReduce, SaysWhyWhenThereIsNoDevice) {
  if (cuda::available()) {
    EXPECT_TRUE(cuda::unavailable_reason().empty());
    EXPECT_FALSE(cuda::device_description().empty());
    return;
  }
  const std::string why = cuda::unavailable_reason();
  EXPECT_FALSE(why.empty());
  // Any call that needs a device fails with an error, never a crash.
  float x = 1;
  EXPECT_THROW(cuda::combine(&x, &x, &x, 1, DataType::f32, ReduceOp::sum, nullptr),
               ringreduce::Error);
  EXPECT_THROW(cuda::DeviceBuffer buffer(64), ringreduce::Error);
}

TEST(CudaReduce, RefusesAnOpThatDoesNotApply) {
  RR_NEED_DEVICE();
  cuda::DeviceBuffer b(64);
  EXPECT_THROW(
      cuda::combine(b.data(), b.data(), b.data(), 4, DataType::f32, ReduceOp::band, nullptr),
      ringreduce::InvalidArgument);
  EXPECT_THROW(cuda::scale(b.data(), b.data(), 4, DataType::i32, 2.0, nullptr),
               ringreduce::InvalidArgument);
}

// Every dtype x op, out of place, in place (dst == a) and fused into two outputs, at counts
// around the 16-byte vector width, on aligned and misaligned pointers.
TEST(CudaReduce, EveryDtypeAndOpGivesTheCpuResult) {
  RR_NEED_DEVICE();
  const size_t counts[] = {1, 3, 17, 1000, 65536 + 5};
  for (DataType t : kAllTypes) {
    const size_t s = ringreduce::dtype_size(t);
    for (ReduceOp op : kAllOps) {
      if (!ringreduce::op_applies(op, t)) continue;
      std::mt19937_64 rng(1000 + static_cast<int>(t) * 16 + static_cast<int>(op));
      for (size_t n : counts) {
        for (size_t offset : {size_t{0}, size_t{1}}) {
          const auto a = random_elements(t, n, rng), b = random_elements(t, n, rng);
          std::vector<unsigned char> want(n * s + 1);
          reduce::combine(want.data(), a.data(), b.data(), n, t, op);
          const size_t bytes = n * s, off = offset * s;
          cuda::DeviceBuffer da(bytes + 16), db(bytes + 16), d0(bytes + 16), d1(bytes + 16);
          da.upload(a.data(), bytes, off);
          db.upload(b.data(), bytes, off);
          auto at = [&](const cuda::DeviceBuffer& d) { return static_cast<char*>(d.data()) + off; };
          std::vector<unsigned char> got(bytes + 1);

          cuda::combine(at(d0), at(da), at(db), n, t, op, nullptr);
          cuda::synchronize(nullptr);
          d0.download(got.data(), bytes, off);
          size_t i = first_difference(got, want, n, t);
          ASSERT_EQ(i, n) << "out of place, " << what(t, op, n, offset) << ": element " << i;

          cuda::combine2(at(d0), at(d1), at(da), at(db), n, t, op, nullptr);
          cuda::synchronize(nullptr);
          for (const cuda::DeviceBuffer* d : {&d0, &d1}) {
            d->download(got.data(), bytes, off);
            i = first_difference(got, want, n, t);
            ASSERT_EQ(i, n) << "combine2, " << what(t, op, n, offset) << ": element " << i;
          }

          cuda::combine(at(da), at(da), at(db), n, t, op, nullptr);  // in place
          cuda::synchronize(nullptr);
          da.download(got.data(), bytes, off);
          i = first_difference(got, want, n, t);
          ASSERT_EQ(i, n) << "in place, " << what(t, op, n, offset) << ": element " << i;
        }
      }
    }
  }
}

TEST(CudaReduce, DivideAndScaleGiveTheCpuResult) {
  RR_NEED_DEVICE();
  for (DataType t : kAllTypes) {
    if (t == DataType::boolean) continue;
    const size_t s = ringreduce::dtype_size(t);
    std::mt19937_64 rng(77 + static_cast<int>(t));
    for (size_t n : {size_t{1}, size_t{9}, size_t{4099}}) {
      const auto x = random_elements(t, n, rng);
      const size_t bytes = n * s;
      cuda::DeviceBuffer dx(bytes), dy(bytes);
      std::vector<unsigned char> want(bytes + 1), got(bytes + 1);
      for (uint64_t divisor : {uint64_t{1}, uint64_t{3}, uint64_t{7}, uint64_t{1} << 63}) {
        reduce::divide(want.data(), x.data(), n, t, divisor);
        dx.upload(x.data(), bytes);
        cuda::divide(dy.data(), dx.data(), n, t, divisor, nullptr);
        cuda::synchronize(nullptr);
        dy.download(got.data(), bytes);
        size_t i = first_difference(got, want, n, t);
        ASSERT_EQ(i, n) << "divide by " << divisor << ", " << ringreduce::dtype_name(t) << " x "
                        << n << ": element " << i;
      }
      if (!ringreduce::is_float(t)) continue;
      for (double factor : {0.5, 1.0 / 3.0, -7.25}) {
        reduce::scale(want.data(), x.data(), n, t, factor);
        dx.upload(x.data(), bytes);
        cuda::scale(dx.data(), dx.data(), n, t, factor, nullptr);  // in place
        cuda::synchronize(nullptr);
        dx.download(got.data(), bytes);
        size_t i = first_difference(got, want, n, t);
        ASSERT_EQ(i, n) << "scale by " << factor << ", " << ringreduce::dtype_name(t) << " x " << n
                        << ": element " << i;
      }
    }
  }
}

// ---- Shared device memory between processes -------------------------------------------------

namespace core = ringreduce::core;

void copy_and_wait(void* dst, const void* src, size_t n) {
  cuda::copy_async(dst, src, n, nullptr);
  cuda::Event e;
  e.record(nullptr);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!e.done() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

uint8_t pattern_at(size_t i) {
  return static_cast<uint8_t>(i * 131 + 7);
}

// What a device link between processes is built on (runtime.h's SharedDeviceBuffer, CUDA's VMM
// with POSIX descriptors): this process creates and exports device memory; a child process (this
// binary again, with RR_SHARED_CHILD_SOCKET naming its end of a Unix socket) imports it from the
// descriptor passed over the socket and writes a pattern into it on its own stream; this process
// then reads the pattern from its own mapping. Skipped without a device; gpu-check runs it.
TEST(CudaShared, ExportedMemoryIsTheImportersInAnotherProcess) {
  RR_NEED_DEVICE();
  if (const char* env = std::getenv("RR_SHARED_CHILD_SOCKET")) {
    const int sock = std::atoi(env);
    ASSERT_TRUE(readable_within(sock, 60000)) << "the exporter sent nothing";
    uint64_t bytes = 0;
    std::vector<core::Fd> fds;
    std::string err;
    ASSERT_EQ(core::recv_with_fds(sock, &bytes, sizeof bytes, 1, &fds, &err),
              static_cast<ssize_t>(sizeof bytes))
        << err;
    ASSERT_EQ(fds.size(), 1u);
    auto imported = cuda::SharedDeviceBuffer::import(fds[0].get(), bytes);
    std::vector<uint8_t> pattern(bytes);
    for (size_t i = 0; i < bytes; ++i) pattern[i] = pattern_at(i);
    copy_and_wait(imported->data(), pattern.data(), bytes);
    const char done = 'd';
    ASSERT_EQ(write(sock, &done, 1), 1);
    return;
  }
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  core::Fd mine(sv[0]), theirs(sv[1]);
  auto buffer = cuda::SharedDeviceBuffer::create(3 << 20);
  const size_t bytes = buffer->size();
  ASSERT_GE(bytes, size_t{3} << 20);
  std::vector<uint8_t> host(bytes, 0);
  copy_and_wait(buffer->data(), host.data(), bytes);
  // The child: this test alone, its end of the socket inherited (the only descriptor that is).
  const std::string env = "RR_SHARED_CHILD_SOCKET=" + std::to_string(theirs.get());
  std::vector<std::string> envs{env};
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=CudaShared.*";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  theirs.reset();
  core::Fd exported(buffer->export_fd());
  const uint64_t size = bytes;
  const int fd = exported.get();
  EXPECT_EQ(core::send_with_fds(mine.get(), &size, sizeof size, &fd, 1),
            static_cast<ssize_t>(sizeof size));
  char done = 0;
  const bool answered = readable_within(mine.get(), 90000) && read(mine.get(), &done, 1) == 1;
  int status = -1;
  if (!answered) kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  ASSERT_TRUE(answered) << "the importing process did not finish (its output is above)";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  copy_and_wait(host.data(), buffer->data(), bytes);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += host[i] != pattern_at(i) ? 1 : 0;
  EXPECT_EQ(wrong, 0u) << "bytes the exporter does not see as the importer wrote them";
}

}  // namespace
