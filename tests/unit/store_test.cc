// The Store conformance suite, run against every implementation (memory, file, TCP over IPv4
// and IPv6 loopback), then the TCP server's robustness against broken and hostile clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/auth.h"
#include "core/fd.h"
#include "rendezvous/file_store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_wire.h"
#include "ringreduce/error.h"
#include "ringreduce/store.h"

namespace ringreduce::rendezvous {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A private directory for a file store, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rr_store_test.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Joins on destruction, so that a failing assertion cannot leave a thread running (and
// std::terminate the test binary).
class JoiningThread {
 public:
  template <typename F>
  explicit JoiningThread(F&& f) : t_(std::forward<F>(f)) {}
  ~JoiningThread() { join(); }
  JoiningThread(const JoiningThread&) = delete;
  JoiningThread& operator=(const JoiningThread&) = delete;
  void join() {
    if (t_.joinable()) t_.join();
  }

 private:
  std::thread t_;
};

bool ipv6_loopback_available() {
  core::Fd fd(::socket(AF_INET6, SOCK_STREAM, 0));
  if (!fd.valid()) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
}

// A port that was free a moment ago (nothing listens on it once this returns).
int free_port() {
  core::Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("cannot find a free port");
  return ntohs(a.sin_port);
}

// ---------------------------------------------------------------------------------------------
// Conformance: the same behaviour from every Store.

class StoreConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& kind = GetParam();
    if (kind == "memory") {
      store_ = make_memory_store();
    } else if (kind == "file") {
      dir_ = std::make_unique<TempDir>();
      store_ = make_file_store(dir_->path());
    } else if (kind == "tcp4") {
      host_ = "127.0.0.1";
      server_ = std::make_unique<TcpStoreServer>(host_, 0);
      store_ = connect_tcp_store(host_, server_->port(), 5s);
    } else if (kind == "tcp4token") {
      // Every operation over connections that proved they hold the token.
      host_ = "127.0.0.1";
      token_ = "conformance token";
      server_ = std::make_unique<TcpStoreServer>(host_, 0, token_);
      store_ = connect_tcp_store(host_, server_->port(), 5s, token_);
    } else if (kind == "tcp6") {
      if (!ipv6_loopback_available()) GTEST_SKIP() << "IPv6 loopback (::1) is not available";
      host_ = "::1";
      server_ = std::make_unique<TcpStoreServer>(host_, 0);
      store_ = connect_tcp_store(host_, server_->port(), 5s);
    }
    ASSERT_NE(store_, nullptr) << "unknown store kind " << kind;
  }

  // Another handle on the same store, as a second process would open it.
  std::shared_ptr<Store> other_handle() {
    if (dir_) return make_file_store(dir_->path());
    if (server_) return connect_tcp_store(host_, server_->port(), 5s, token_);
    return store_;
  }

  // Declared so that the store goes first, then the server, then the directory.
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<TcpStoreServer> server_;
  std::string host_;
  std::string token_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreConformance, SetThenGet) {
  store_->set("a", {1, 2, 3});
  EXPECT_EQ(store_->get("a", 1s), (std::vector<uint8_t>{1, 2, 3}));
  store_->set("a", {4});  // replaces
  EXPECT_EQ(store_->get("a", 1s), (std::vector<uint8_t>{4}));
  store_->set("empty", {});
  EXPECT_TRUE(store_->get("empty", 1s).empty());
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
  store_->set("binary", all);
  EXPECT_EQ(other_handle()->get("binary", 1s), all);
}

TEST_P(StoreConformance, KeysAreArbitraryBytes) {
  // Keys that are awkward as file names or on the wire: separators, spaces, NULs, case-only
  // differences (a case-insensitive filesystem must not merge them), and a long key.
  std::vector<std::string> keys = {
      "a/b", "../escape", "with space",           std::string("nul\0byte", 8), "UPPER", "upper",
      "%41", "\xff\xfe",  std::string(3000, 'k'), std::string(3000, 'k') + "2"};
  for (size_t i = 0; i < keys.size(); ++i) store_->set(keys[i], bytes("v" + std::to_string(i)));
  auto other = other_handle();
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(other->get(keys[i], 1s), bytes("v" + std::to_string(i))) << "key #" << i;
  EXPECT_TRUE(other->check(keys));
}

TEST_P(StoreConformance, GetWaitsForALaterSetFromAnotherThread) {
  auto start = Clock::now();
  // The same handle on both sides: a get parked in one thread must not block a set from another.
  JoiningThread setter([&] {
    std::this_thread::sleep_for(150ms);
    store_->set("late", bytes("here"));
  });
  EXPECT_EQ(store_->get("late", 10s), bytes("here"));
  EXPECT_GE(seconds_since(start), 0.1);
}

TEST_P(StoreConformance, WaitReturnsOnceEveryKeyIsSet) {
  auto other = other_handle();
  JoiningThread setter([&] {
    std::this_thread::sleep_for(50ms);
    other->set("w1", bytes("1"));
    std::this_thread::sleep_for(50ms);
    other->set("w2", bytes("2"));
  });
  auto start = Clock::now();
  store_->wait({"w1", "w2"}, 10s);
  EXPECT_GE(seconds_since(start), 0.08);
  EXPECT_TRUE(store_->check({"w1", "w2"}));
  store_->wait({}, 0ms);  // nothing to wait for
}

TEST_P(StoreConformance, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 1000;
  std::vector<std::vector<int64_t>> seen(kThreads);
  {
    std::vector<std::unique_ptr<JoiningThread>> threads;
    for (int t = 0; t < kThreads; ++t) {
      // Half the threads share the handle, half have their own (as separate processes would).
      auto handle = t % 2 == 0 ? store_ : other_handle();
      threads.push_back(std::make_unique<JoiningThread>([&seen, t, handle] {
        for (int i = 0; i < kAdds; ++i) seen[t].push_back(handle->add("counter", 1));
      }));
    }
  }
  std::vector<int64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  // Atomic increments hand out every value from 1 to N exactly once.
  ASSERT_EQ(all.size(), size_t{kThreads * kAdds});
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int64_t>(i + 1));
  EXPECT_EQ(store_->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(store_->get("counter", 1s), bytes(std::to_string(kThreads * kAdds)));
}

TEST_P(StoreConformance, AddStartsFromZeroAndTakesNegativeDeltas) {
  EXPECT_EQ(store_->add("n", -5), -5);
  EXPECT_EQ(store_->add("n", 7), 2);
  store_->set("preset", bytes("40"));
  EXPECT_EQ(store_->add("preset", 2), 42);
  store_->set("max", bytes(std::to_string(INT64_MAX)));
  EXPECT_THROW(store_->add("max", 1), InvalidArgument);
}

TEST_P(StoreConformance, AddOnANonIntegerValueIsInvalidArgument) {
  store_->set("text", bytes("hello"));
  try {
    store_->add("text", 1);
    FAIL() << "add on a non-integer value did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'text'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store_->get("text", 1s), bytes("hello"));  // untouched, and the store still works
}

// A wait that another key ends: start-up's waits end at once when the job is marked failed.
TEST_P(StoreConformance, GetUnlessEndsWithWhicheverKeyComesFirst) {
  store_->set("here", bytes("v"));
  store_->set("mark", bytes("m"));
  EXPECT_EQ(store_->get_unless("here", "mark", 1s), bytes("v"));  // the key wins a tie
  EXPECT_EQ(store_->get_unless("absent", "mark", 1s), std::nullopt);
  auto other = other_handle();
  {
    JoiningThread setter([&] {
      std::this_thread::sleep_for(100ms);
      other->set("late", bytes("l"));
    });
    EXPECT_EQ(store_->get_unless("late", "never", 10s), bytes("l"));
  }
  auto start = Clock::now();
  {
    JoiningThread setter([&] {
      std::this_thread::sleep_for(100ms);
      other->set("stop", bytes("s"));
    });
    EXPECT_EQ(store_->get_unless("never", "stop", 10s), std::nullopt);
  }
  EXPECT_LT(seconds_since(start), 2.0);
  // Through a prefix, both keys are the prefix's.
  PrefixStore job(store_, "job");
  store_->set("flag", bytes("outside"));
  EXPECT_THROW(job.get_unless("never", "flag", 50ms), TimeoutError);
  job.set("flag", bytes("inside"));
  EXPECT_EQ(job.get_unless("never", "flag", 1s), std::nullopt);
  // A timeout names the key waited for, not the other one.
  try {
    store_->get_unless("missing-key", "other-key", 200ms);
    FAIL() << "get_unless of two missing keys did not time out";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'missing-key'"), std::string::npos) << what;
    EXPECT_EQ(what.find("other-key"), std::string::npos) << what;
  }
}

TEST_P(StoreConformance, GetTimeoutNamesTheKeyAndTheTimeout) {
  auto start = Clock::now();
  try {
    store_->get("missing-key", 300ms);
    FAIL() << "get of a missing key did not time out";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("'missing-key'"), std::string::npos) << what;
    EXPECT_NE(what.find("300 ms"), std::string::npos) << what;
  }
  double took = seconds_since(start);
  EXPECT_GE(took, 0.29);
  EXPECT_LE(took, 0.8);
}

TEST_P(StoreConformance, WaitTimeoutNamesOnlyTheMissingKeys) {
  store_->set("present", bytes("x"));
  auto start = Clock::now();
  try {
    store_->wait({"present", "absent-1", "absent-2"}, 300ms);
    FAIL() << "wait for missing keys did not time out";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("'absent-1'"), std::string::npos) << what;
    EXPECT_NE(what.find("'absent-2'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'present'"), std::string::npos) << what;
    EXPECT_NE(what.find("300 ms"), std::string::npos) << what;
  }
  double took = seconds_since(start);
  EXPECT_GE(took, 0.29);
  EXPECT_LE(took, 0.8);
}

TEST_P(StoreConformance, ZeroTimeoutChecksOnce) {
  auto start = Clock::now();
  EXPECT_THROW(store_->get("nope", 0ms), TimeoutError);
  EXPECT_THROW(store_->wait({"nope"}, 0ms), TimeoutError);
  EXPECT_LE(seconds_since(start), 0.3);
  store_->set("yes", bytes("1"));
  EXPECT_EQ(store_->get("yes", 0ms), bytes("1"));
}

TEST_P(StoreConformance, CheckNeverWaits) {
  EXPECT_TRUE(store_->check({}));
  EXPECT_FALSE(store_->check({"c1"}));
  store_->set("c1", bytes("1"));
  EXPECT_TRUE(store_->check({"c1"}));
  EXPECT_FALSE(store_->check({"c1", "c2"}));
  other_handle()->set("c2", bytes("2"));
  EXPECT_TRUE(store_->check({"c1", "c2"}));
}

TEST_P(StoreConformance, PrefixStoresAreIsolated) {
  PrefixStore job1(store_, "job1");
  PrefixStore job2(store_, "job2");
  job1.set("k", bytes("one"));
  EXPECT_TRUE(job1.check({"k"}));
  EXPECT_FALSE(job2.check({"k"}));
  EXPECT_TRUE(store_->check({"job1/k"}));
  EXPECT_EQ(store_->get("job1/k", 1s), bytes("one"));
  try {
    job2.get("k", 100ms);
    FAIL() << "job2 saw job1's key";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("job2/k"), std::string::npos) << e.what();
  }
  EXPECT_EQ(job1.add("n", 1), 1);
  EXPECT_EQ(job2.add("n", 10), 10);
  EXPECT_EQ(job1.add("n", 1), 2);
  job2.set("k", bytes("two"));
  job1.wait({"k"}, 1s);
  EXPECT_EQ(job1.get("k", 1s), bytes("one"));
  EXPECT_EQ(job2.get("k", 1s), bytes("two"));
  // Prefixes nest.
  PrefixStore nested(std::make_shared<PrefixStore>(store_, "outer"), "inner");
  nested.set("x", bytes("deep"));
  EXPECT_EQ(store_->get("outer/inner/x", 1s), bytes("deep"));
}

TEST_P(StoreConformance, LargeValue) {
  std::vector<uint8_t> big(16u << 20);
  std::mt19937 rng(42);
  for (auto& b : big) b = static_cast<uint8_t>(rng());
  store_->set("big", big);
  EXPECT_EQ(other_handle()->get("big", 10s), big);
  EXPECT_EQ(store_->get("big", 10s), big);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreConformance,
                         ::testing::Values("memory", "file", "tcp4", "tcp4token", "tcp6"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---------------------------------------------------------------------------------------------
// File store specifics.

TEST(FileStore, LeavesNoTemporaryFilesAndCreatesTheDirectory) {
  TempDir dir;
  std::string nested = dir.path() + "/a/b";
  auto store = make_file_store(nested);
  store->set("k", bytes("v"));
  store->add("c", 3);
  for (const auto& entry : std::filesystem::directory_iterator(nested))
    EXPECT_EQ(entry.path().filename().string().rfind(".tmp", 0), std::string::npos) << entry.path();
}

TEST(FileStore, AForeignFileUnderAKeyNameIsAnErrorNotAValue) {
  TempDir dir;
  auto store = make_file_store(dir.path());
  store->set("k", bytes("v"));
  // Overwrite the key's file with something that is not a store entry.
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().filename().string().rfind("k_", 0) == 0) {
      FILE* f = std::fopen(entry.path().c_str(), "w");
      ASSERT_NE(f, nullptr);
      std::fputs("garbage", f);
      std::fclose(f);
    }
  }
  EXPECT_THROW(store->get("k", 100ms), Error);
}

// ---------------------------------------------------------------------------------------------
// TCP store: split_host_port.

TEST(SplitHostPort, AcceptsTheDocumentedForms) {
  std::string host;
  int port = 0;
  split_host_port("127.0.0.1:29500", &host, &port);
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 29500);
  split_host_port("[::1]:29501", &host, &port);
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 29501);
  split_host_port("localhost:80", &host, &port);
  EXPECT_EQ(host, "localhost");
  EXPECT_EQ(port, 80);
  split_host_port("node-7.cluster.local:0", &host, &port);
  EXPECT_EQ(host, "node-7.cluster.local");
  EXPECT_EQ(port, 0);
  split_host_port("::1", &host, &port);
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, -1);
  split_host_port("fe80::1%eth0", &host, &port);
  EXPECT_EQ(host, "fe80::1%eth0");
  EXPECT_EQ(port, -1);
  split_host_port("[fe80::1%eth0]:5", &host, &port);
  EXPECT_EQ(host, "fe80::1%eth0");
  EXPECT_EQ(port, 5);
  split_host_port("[::]", &host, &port);
  EXPECT_EQ(host, "::");
  EXPECT_EQ(port, -1);
  split_host_port("myhost", &host, &port);
  EXPECT_EQ(host, "myhost");
  EXPECT_EQ(port, -1);
}

TEST(SplitHostPort, RejectsGarbage) {
  for (const char* bad :
       {"", ":29500", "host:", "host:abc", "host:70000", "host:-1", "[::1", "[::1]x",
        "[::1]:", "[]:5", "[notv6]:5", "a:b:c", "ho st:5", "host:12345678", "h/st:1"}) {
    std::string host;
    int port = 0;
    EXPECT_THROW(split_host_port(bad, &host, &port), InvalidArgument) << "'" << bad << "'";
  }
  try {
    std::string host;
    int port = 0;
    split_host_port("host:abc", &host, &port);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("host:abc"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// TCP store: robustness. A raw socket plays the broken client.

class RawClient {
 public:
  RawClient(const std::string& host, int port) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (host.find(':') != std::string::npos) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET6, host.c_str(), &a->sin6_addr);
      len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET, host.c_str(), &a->sin_addr);
      len = sizeof(*a);
    }
    fd_.reset(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd_.valid() || ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
      throw std::runtime_error("raw connect failed");
  }

  void send(const std::vector<uint8_t>& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_.get(), data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may already have dropped us; the caller checks that
      off += static_cast<size_t>(n);
    }
  }

  // "127.0.0.1:PORT" of this end, as the server's log lines name it.
  std::string local_address() const {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }

  // Reads exactly n bytes within the timeout; nullopt on EOF, error or timeout.
  std::optional<std::vector<uint8_t>> read(size_t n, std::chrono::milliseconds timeout) {
    std::vector<uint8_t> out(n);
    size_t have = 0;
    auto deadline = Clock::now() + timeout;
    while (have < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      ssize_t r = ::recv(fd_.get(), out.data() + have, n - have, 0);
      if (r <= 0) return std::nullopt;
      have += static_cast<size_t>(r);
    }
    return out;
  }

  // Performs the hello; true if the server accepted it.
  bool hello() {
    std::vector<uint8_t> h;
    wire::append_client_hello(&h);
    send(h);
    auto reply = read(wire::kHelloBytes, 2s);
    return reply && wire::load32(reply->data()) == wire::kMagic &&
           wire::load16(reply->data() + 6) == 0;
  }

  // True once the server has closed the connection (EOF or reset), within the timeout. Any
  // bytes the server sends before closing are read and ignored.
  bool closed_by_server(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    uint8_t buf[4096];
    while (Clock::now() < deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd_.get(), POLLIN, 0};
      int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1)));
      if (rc <= 0) continue;
      ssize_t r = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
  }

 private:
  core::Fd fd_;
};

std::vector<uint8_t> frame(wire::Op op, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  wire::Writer w(&out);
  w.begin(static_cast<uint8_t>(op));
  w.raw(payload.data(), payload.size());
  w.end();
  return out;
}

std::vector<uint8_t> set_request(const std::string& key, const std::string& value) {
  std::vector<uint8_t> payload;
  wire::Writer w(&payload);
  w.str(key);
  w.str(value);
  return frame(wire::Op::set, payload);
}

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
    port_ = server_->port();
    store_ = connect_tcp_store("127.0.0.1", port_, 5s);
  }

  // The well-behaved client does a round of work; fails the test if anything goes wrong.
  void normal_client_works(const std::string& tag, int rounds = 20) {
    for (int i = 0; i < rounds; ++i) {
      std::string key = tag + "/" + std::to_string(i);
      store_->set(key, bytes("v" + std::to_string(i)));
      ASSERT_EQ(store_->get(key, 2s), bytes("v" + std::to_string(i)));
    }
    ASSERT_EQ(store_->add(tag + "/n", 1), 1);
  }

  // The server still accepts new clients.
  void server_still_accepts() {
    auto fresh = connect_tcp_store("127.0.0.1", port_, 2s);
    fresh->set("fresh", bytes("ok"));
    EXPECT_EQ(store_->get("fresh", 1s), bytes("ok"));
  }

  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
  std::shared_ptr<Store> store_;
};

TEST_F(TcpStoreTest, GarbageBytesAreDropped) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> junk(64);
  std::mt19937 rng(7);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  junk[0] = 0x00;  // make sure the magic is wrong
  raw.send(junk);
  normal_client_works("garbage");
  EXPECT_TRUE(raw.closed_by_server(2s));
  server_still_accepts();
}

TEST_F(TcpStoreTest, WrongMagicIsDropped) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> h;
  wire::Writer w(&h);
  w.u32(0xdeadbeef);
  w.u16(wire::kVersion);
  w.u16(0);
  w.u32(0);
  raw.send(h);
  EXPECT_TRUE(raw.closed_by_server(2s));
  normal_client_works("magic");
  server_still_accepts();
}

TEST_F(TcpStoreTest, WrongVersionIsRefusedWithTheServersVersion) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, /*version=*/99);
  raw.send(h);
  auto reply = raw.read(wire::kHelloBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ(wire::load32(reply->data()), wire::kMagic);
  EXPECT_EQ(wire::load16(reply->data() + 4), wire::kVersion);
  EXPECT_EQ(wire::load16(reply->data() + 6), static_cast<uint16_t>(wire::HelloStatus::bad_version));
  EXPECT_TRUE(raw.closed_by_server(2s));
  normal_client_works("version");
}

TEST_F(TcpStoreTest, OversizedFrameLengthIsDropped) {
  RawClient raw("127.0.0.1", port_);
  ASSERT_TRUE(raw.hello());
  // A set frame that claims almost 4 GiB: rejected from its header, before any buffering.
  raw.send({static_cast<uint8_t>(wire::Op::set), 0xff, 0xff, 0xff, 0xf0, 1, 2, 3});
  EXPECT_TRUE(raw.closed_by_server(2s));
  normal_client_works("oversized");
  server_still_accepts();
}

TEST_F(TcpStoreTest, OversizedLengthsInsideAFrameAreDropped) {
  {
    // A key length over the 4 KiB limit inside a frame whose own length is acceptable.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(5000);
    w.raw(std::string(5000, 'k').data(), 5000);
    w.u32(0);
    raw.send(frame(wire::Op::set, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // A key length larger than what the frame holds.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u64(0);
    w.u32(4000);
    w.raw("abc", 3);
    raw.send(frame(wire::Op::get, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // A key count over the limit.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(100000);
    raw.send(frame(wire::Op::check, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // Trailing bytes after a well-formed payload.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(0);
    w.u8(9);
    raw.send(frame(wire::Op::check, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // An unknown op.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    raw.send({99, 0, 0, 0, 0});
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  normal_client_works("inner");
  server_still_accepts();
}

TEST_F(TcpStoreTest, SilentAndHalfSentClientsDoNotBlockOthers) {
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(std::make_unique<RawClient>("127.0.0.1", port_));
  // Half a hello.
  auto half_hello = std::make_unique<RawClient>("127.0.0.1", port_);
  half_hello->send({0x52, 0x52});
  // A complete hello, then half a request.
  auto half_request = std::make_unique<RawClient>("127.0.0.1", port_);
  ASSERT_TRUE(half_request->hello());
  auto req = set_request("half", "never completed");
  req.resize(req.size() / 2);
  half_request->send(req);

  auto start = Clock::now();
  normal_client_works("silent", 100);
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_FALSE(store_->check({"half"}));
  server_still_accepts();
}

// Scoped setenv for one setting; restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(TcpStoreStall, StalledClientsAreDroppedButIdleOnesAreKept) {
  // The server drops a client stuck mid-message after RINGREDUCE_TIMEOUT; one second here.
  std::unique_ptr<TcpStoreServer> server;
  {
    ScopedEnv timeout("RINGREDUCE_TIMEOUT", "1");
    server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  }
  int port = server->port();
  auto store = connect_tcp_store("127.0.0.1", port, 5s);

  RawClient no_hello("127.0.0.1", port);
  RawClient half_request("127.0.0.1", port);
  ASSERT_TRUE(half_request.hello());
  auto req = set_request("half", "never completed");
  req.resize(req.size() - 3);
  half_request.send(req);
  RawClient idle("127.0.0.1", port);
  ASSERT_TRUE(idle.hello());  // then nothing: a legitimate idle connection

  auto start = Clock::now();
  store->set("during", bytes("ok"));
  EXPECT_TRUE(half_request.closed_by_server(4s));
  EXPECT_TRUE(no_hello.closed_by_server(4s));
  EXPECT_GE(seconds_since(start), 0.5);
  // The idle client survives past the stall timeout and is still served.
  std::this_thread::sleep_for(500ms);
  idle.send(set_request("idle", "still here"));
  auto reply = idle.read(wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ((*reply)[0], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(store->get("idle", 1s), bytes("still here"));
  // So is the well-behaved store client, idle all that time.
  EXPECT_EQ(store->get("during", 1s), bytes("ok"));
}

TEST_F(TcpStoreTest, SlowTrickleClientIsServedWhileOthersWork) {
  RawClient trickle("127.0.0.1", port_);
  ASSERT_TRUE(trickle.hello());
  auto req = set_request("trickle", "slowly");
  std::atomic<bool> sent{false};
  JoiningThread sender([&] {
    for (uint8_t b : req) {
      trickle.send({b});
      std::this_thread::sleep_for(10ms);
    }
    sent = true;
  });
  // While the request dribbles in, others are served at full speed.
  auto start = Clock::now();
  normal_client_works("trickle-neighbour", 50);
  EXPECT_LT(seconds_since(start), 2.0);
  sender.join();
  ASSERT_TRUE(sent);
  auto reply = trickle.read(wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ((*reply)[0], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(store_->get("trickle", 1s), bytes("slowly"));
}

TEST_F(TcpStoreTest, PipelinedRequestsAreAnsweredInOrder) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> all;
  wire::append_client_hello(&all);
  auto s = set_request("p", "1");
  all.insert(all.end(), s.begin(), s.end());
  std::vector<uint8_t> get_payload;
  wire::Writer w(&get_payload);
  w.u64(1000);
  w.str("p");
  auto g = frame(wire::Op::get, get_payload);
  all.insert(all.end(), g.begin(), g.end());
  raw.send(all);  // hello and two requests in one write
  auto hello = raw.read(wire::kHelloBytes, 2s);
  ASSERT_TRUE(hello);
  auto set_reply = raw.read(wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(set_reply);
  EXPECT_EQ((*set_reply)[0], 0);
  auto get_reply = raw.read(wire::kFrameHeaderBytes + 4 + 1, 2s);
  ASSERT_TRUE(get_reply);
  EXPECT_EQ((*get_reply)[0], 0);
  EXPECT_EQ(get_reply->back(), '1');
}

TEST_F(TcpStoreTest, ClientSideLimitsAreInvalidArgument) {
  EXPECT_THROW(store_->set(std::string(wire::kMaxKeyBytes + 1, 'k'), bytes("v")), InvalidArgument);
  EXPECT_THROW(store_->set("k", std::vector<uint8_t>(wire::kMaxValueBytes + 1)), InvalidArgument);
  EXPECT_THROW(store_->check(std::vector<std::string>(wire::kMaxKeys + 1, "k")), InvalidArgument);
  normal_client_works("limits");
}

TEST_F(TcpStoreTest, ManyClientsRendezvous) {
  constexpr int kRanks = 32;
  std::atomic<int> failures{0};
  {
    std::vector<std::unique_ptr<JoiningThread>> ranks;
    for (int r = 0; r < kRanks; ++r) {
      ranks.push_back(std::make_unique<JoiningThread>([&, r] {
        try {
          auto s = connect_tcp_store("127.0.0.1", port_, 5s);
          s->set("addr/" + std::to_string(r), bytes("rank" + std::to_string(r)));
          s->add("arrived", 1);
          std::vector<std::string> keys;
          for (int i = 0; i < kRanks; ++i) keys.push_back("addr/" + std::to_string(i));
          s->wait(keys, 10s);
          for (int i = 0; i < kRanks; ++i)
            if (s->get(keys[i], 1s) != bytes("rank" + std::to_string(i))) ++failures;
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
          ++failures;
        }
      }));
    }
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->add("arrived", 0), kRanks);
}

TEST(TcpStore, ClientConnectingBeforeTheServerStartsRetries) {
  int port = free_port();
  std::unique_ptr<TcpStoreServer> server;
  JoiningThread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  auto start = Clock::now();
  auto store = connect_tcp_store("127.0.0.1", port, 10s);
  EXPECT_GE(seconds_since(start), 0.2);
  starter.join();
  store->set("k", bytes("v"));
  EXPECT_EQ(store->get("k", 1s), bytes("v"));
}

TEST(TcpStore, ConnectTimeoutNamesTheAddress) {
  int port = free_port();
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", port, 300ms);
    FAIL() << "connected to a port nobody listens on";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
  }
  double took = seconds_since(start);
  EXPECT_GE(took, 0.29);
  EXPECT_LE(took, 1.5);
}

TEST(TcpStore, ConnectingToSomethingElseFailsClearly) {
  // A "server" that answers with bytes that are not a store hello.
  core::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  JoiningThread impostor([&] {
    core::Fd c(::accept(listener.get(), nullptr, nullptr));
    const char reply[] = "HTTP/1.0 400 Bad\r\n";
    ssize_t ignored = ::send(c.get(), reply, sizeof(reply), MSG_NOSIGNAL);
    (void)ignored;
    std::this_thread::sleep_for(200ms);
  });
  try {
    connect_tcp_store("127.0.0.1", ntohs(a.sin_port), 2s);
    FAIL() << "accepted a non-store service";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once, not time out: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a ringreduce store"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServerDestructorReturnsPromptlyWithClientsConnected) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  int port = server->port();
  auto a = connect_tcp_store("127.0.0.1", port, 5s);
  auto b = connect_tcp_store("127.0.0.1", port, 5s);
  RawClient silent("127.0.0.1", port);
  RawClient half("127.0.0.1", port);
  half.send({0x52});
  std::atomic<bool> get_failed{false};
  std::atomic<double> get_ended_at{0};
  auto start = Clock::now();
  JoiningThread waiter([&] {
    try {
      b->get("never", 20s);
    } catch (const Error&) {
      get_failed = true;
    }
    get_ended_at = seconds_since(start);
  });
  a->set("x", bytes("1"));
  std::this_thread::sleep_for(100ms);  // let the get park on the server
  auto destroy_start = Clock::now();
  server.reset();
  EXPECT_LT(seconds_since(destroy_start), 1.0);
  waiter.join();
  EXPECT_TRUE(get_failed);
  EXPECT_LT(get_ended_at.load(), 2.0);
  EXPECT_TRUE(silent.closed_by_server(1s));
  EXPECT_THROW(a->set("y", bytes("2")), Error);
}

TEST(TcpStore, ResolvesLocalhost) {
  TcpStoreServer server("127.0.0.1", 0);
  // "localhost" may resolve to ::1 first; the client falls through to 127.0.0.1.
  auto store = connect_tcp_store("localhost", server.port(), 5s);
  store->set("k", bytes("v"));
  EXPECT_EQ(store->get("k", 1s), bytes("v"));
}

TEST(TcpStore, DualStackServerAcceptsIPv4Clients) {
  if (!ipv6_loopback_available()) GTEST_SKIP() << "IPv6 loopback (::1) is not available";
  TcpStoreServer server("::", 0);
  auto v4 = connect_tcp_store("127.0.0.1", server.port(), 5s);
  auto v6 = connect_tcp_store("::1", server.port(), 5s);
  v4->set("k", bytes("v"));
  EXPECT_EQ(v6->get("k", 1s), bytes("v"));
}

TEST(TcpStore, BadArgumentsAreInvalidArgument) {
  EXPECT_THROW(TcpStoreServer("127.0.0.1", 70000), InvalidArgument);
  EXPECT_THROW(connect_tcp_store("127.0.0.1", 0, 100ms), InvalidArgument);
  EXPECT_THROW(connect_tcp_store("", 1234, 100ms), InvalidArgument);
  // A port in use is an Error that names the address.
  TcpStoreServer first("127.0.0.1", 0);
  try {
    TcpStoreServer second("127.0.0.1", first.port());
    FAIL() << "two servers on one port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Token authentication (RINGREDUCE_TOKEN): the mutual HMAC-SHA256 proof of tcp_store_wire.h.

constexpr const char* kToken = "the job's token";

// The client half of the token handshake, done by hand so that tests can break it on purpose.
struct RawChallenge {
  core::auth::Nonce server_nonce{};
  core::auth::Proof server_proof{};
};

// Sends an HMAC hello carrying `nonce`; the server's challenge, or nullopt if it sent none.
std::optional<RawChallenge> raw_auth_hello(RawClient& raw, const core::auth::Nonce& nonce) {
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                            nonce.size());
  raw.send(h);
  auto reply = raw.read(wire::kHelloBytes, 2s);
  if (!reply || wire::load16(reply->data() + 6) != 0 ||
      wire::load32(reply->data() + 8) != wire::kChallengeBytes)
    return std::nullopt;
  auto challenge = raw.read(wire::kChallengeBytes, 2s);
  if (!challenge) return std::nullopt;
  RawChallenge c;
  std::copy_n(challenge->begin(), c.server_nonce.size(), c.server_nonce.begin());
  std::copy_n(challenge->begin() + c.server_nonce.size(), c.server_proof.size(),
              c.server_proof.begin());
  return c;
}

core::auth::Proof client_proof(const std::string& token, const RawChallenge& c,
                               const core::auth::Nonce& client_nonce) {
  return core::auth::make_proof(token, wire::kClientProofLabel,
                                wire::auth_context(wire::kVersion, wire::Auth::hmac_sha256),
                                c.server_nonce, client_nonce);
}

std::vector<uint8_t> to_vector(const core::auth::Proof& p) {
  return std::vector<uint8_t>(p.begin(), p.end());
}

// Captures what the server logs (its warnings go to stderr) for the scope's duration.
class CapturedLog {
 public:
  CapturedLog() { ::testing::internal::CaptureStderr(); }
  ~CapturedLog() {
    if (!taken_) ::testing::internal::GetCapturedStderr();
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string take() {
    taken_ = true;
    return ::testing::internal::GetCapturedStderr();
  }

 private:
  bool taken_ = false;
};

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

class TcpStoreAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0, kToken);
    port_ = server_->port();
    store_ = connect_tcp_store("127.0.0.1", port_, 5s, kToken);
  }

  // A client with the right token keeps being served, and new ones still get in.
  void job_unharmed(const std::string& tag) {
    for (int i = 0; i < 20; ++i) {
      std::string key = tag + "/" + std::to_string(i);
      store_->set(key, bytes("v"));
      ASSERT_EQ(store_->get(key, 2s), bytes("v"));
    }
    auto fresh = connect_tcp_store("127.0.0.1", port_, 2s, kToken);
    fresh->set(tag + "/fresh", bytes("ok"));
    EXPECT_EQ(store_->get(tag + "/fresh", 1s), bytes("ok"));
  }

  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
  std::shared_ptr<Store> store_;
};

TEST_F(TcpStoreAuthTest, RightTokenIsServed) {
  auto other = connect_tcp_store("127.0.0.1", port_, 5s, kToken);
  other->set("k", bytes("v"));
  EXPECT_EQ(store_->get("k", 1s), bytes("v"));
  EXPECT_EQ(other->add("n", 2), 2);
  job_unharmed("right");
}

TEST_F(TcpStoreAuthTest, WrongTokenFailsAtOnceAndIsLogged) {
  CapturedLog log;
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", port_, 5s, "another job's token");
    FAIL() << "a client with the wrong token got in";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once, not retry until the timeout: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "does not know this process's RINGREDUCE_TOKEN")) << e.what();
    EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(port_))) << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);
  job_unharmed("wrong");  // also gives the server time to see the client leave
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "closed the connection without proving it knows RINGREDUCE_TOKEN"))
      << text;
}

TEST_F(TcpStoreAuthTest, WrongProofIsDeniedDroppedAndLogged) {
  CapturedLog log;
  RawClient raw("127.0.0.1", port_);
  auto nonce = core::auth::random_nonce();
  auto challenge = raw_auth_hello(raw, nonce);
  ASSERT_TRUE(challenge);
  raw.send(to_vector(client_proof("a guess", *challenge, nonce)));
  auto verdict = raw.read(1, 2s);
  ASSERT_TRUE(verdict);
  EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::denied));
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("proof");
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "WARN")) << text;
  EXPECT_TRUE(contains(
      text, "dropping client " + raw.local_address() + ": its proof of RINGREDUCE_TOKEN is wrong"))
      << text;
}

TEST_F(TcpStoreAuthTest, RightProofByHandIsAccepted) {
  // The hand-made handshake the other tests break is the real one: done right, it is served.
  RawClient raw("127.0.0.1", port_);
  auto nonce = core::auth::random_nonce();
  auto challenge = raw_auth_hello(raw, nonce);
  ASSERT_TRUE(challenge);
  // The server proved it holds the token.
  EXPECT_TRUE(core::auth::proofs_equal(
      challenge->server_proof,
      core::auth::make_proof(kToken, wire::kServerProofLabel,
                             wire::auth_context(wire::kVersion, wire::Auth::hmac_sha256), nonce,
                             challenge->server_nonce)));
  auto msg = to_vector(client_proof(kToken, *challenge, nonce));
  auto req = set_request("by hand", "ok");
  msg.insert(msg.end(), req.begin(), req.end());
  raw.send(msg);
  auto verdict = raw.read(1 + wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(verdict);
  EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::ok));
  EXPECT_EQ((*verdict)[1], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(store_->get("by hand", 1s), bytes("ok"));
}

TEST_F(TcpStoreAuthTest, ReplayedOrReflectedProofIsRejected) {
  // A proof recorded from an earlier, successful connection...
  auto nonce = core::auth::random_nonce();
  core::auth::Proof recorded{};
  {
    RawClient first("127.0.0.1", port_);
    auto challenge = raw_auth_hello(first, nonce);
    ASSERT_TRUE(challenge);
    recorded = client_proof(kToken, *challenge, nonce);
    first.send(to_vector(recorded));
    auto verdict = first.read(1, 2s);
    ASSERT_TRUE(verdict);
    ASSERT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::ok));
  }
  // ... replayed with the same hello on a new one is worthless: the server's nonce is new.
  {
    RawClient replay("127.0.0.1", port_);
    auto challenge = raw_auth_hello(replay, nonce);
    ASSERT_TRUE(challenge);
    replay.send(to_vector(recorded));
    auto verdict = replay.read(1, 2s);
    ASSERT_TRUE(verdict);
    EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::denied));
    EXPECT_TRUE(replay.closed_by_server(2s));
  }
  // The server's own proof sent back as the client's is worthless too (the role labels differ).
  {
    RawClient reflect("127.0.0.1", port_);
    auto challenge = raw_auth_hello(reflect, nonce);
    ASSERT_TRUE(challenge);
    reflect.send(to_vector(challenge->server_proof));
    auto verdict = reflect.read(1, 2s);
    ASSERT_TRUE(verdict);
    EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::denied));
    EXPECT_TRUE(reflect.closed_by_server(2s));
  }
  job_unharmed("replay");
}

TEST_F(TcpStoreAuthTest, ClientWithoutTokenIsToldToSetIt) {
  CapturedLog log;
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", port_, 5s);
    FAIL() << "a client without the token got in";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "the store requires a token and this process has none: set "
                         "RINGREDUCE_TOKEN"))
        << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);
  // A raw client without a token gets the auth_required status, then the server closes.
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> h;
  wire::append_client_hello(&h);
  raw.send(h);
  auto reply = raw.read(wire::kHelloBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ(wire::load16(reply->data() + 6),
            static_cast<uint16_t>(wire::HelloStatus::auth_required));
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("none");
  std::string text = log.take();
  EXPECT_TRUE(contains(
      text, "refusing client " + raw.local_address() + ": it sent no proof of RINGREDUCE_TOKEN"))
      << text;
}

TEST(TcpStoreAuth, ClientWithTokenAgainstAStoreWithoutOne) {
  TcpStoreServer server("127.0.0.1", 0);
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", server.port(), 5s, kToken);
    FAIL() << "connected with a token to a store without one";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "RINGREDUCE_TOKEN is set in this process, but the store was "
                         "started without one"))
        << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);
  // Both without a token: served, exactly as before tokens existed.
  auto plain = connect_tcp_store("127.0.0.1", server.port(), 5s);
  plain->set("k", bytes("v"));
  EXPECT_EQ(plain->get("k", 1s), bytes("v"));
}

TEST(TcpStoreAuth, ClientNeverSendsItsProofToAStoreThatDidNotProveItself) {
  // An impostor answers the hello with a challenge whose proof is random bytes.
  core::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::atomic<size_t> received_after_hello{0};
  JoiningThread impostor([&] {
    core::Fd c(::accept(listener.get(), nullptr, nullptr));
    std::vector<uint8_t> hello(wire::kHelloBytes + core::auth::kNonceBytes);
    if (::recv(c.get(), hello.data(), hello.size(), MSG_WAITALL) != ssize_t(hello.size())) return;
    auto nonce = core::auth::random_nonce();
    auto fake = core::auth::random_nonce();
    std::vector<uint8_t> challenge(nonce.begin(), nonce.end());
    challenge.insert(challenge.end(), fake.begin(), fake.end());
    std::vector<uint8_t> reply;
    wire::append_server_hello(&reply, wire::HelloStatus::ok, challenge.data(), challenge.size());
    ssize_t ignored = ::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
    (void)ignored;
    // Whatever the client sends now would be its proof; it must send nothing and close.
    uint8_t buf[64];
    pollfd p{c.get(), POLLIN, 0};
    while (::poll(&p, 1, 2000) > 0) {
      ssize_t n = ::recv(c.get(), buf, sizeof(buf), 0);
      if (n <= 0) break;
      received_after_hello += static_cast<size_t>(n);
    }
  });
  try {
    connect_tcp_store("127.0.0.1", ntohs(a.sin_port), 2s, kToken);
    FAIL() << "accepted a store that does not know the token";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "does not know this process's RINGREDUCE_TOKEN")) << e.what();
  }
  impostor.join();
  EXPECT_EQ(received_after_hello.load(), 0u);
}

TEST_F(TcpStoreAuthTest, GarbageIsDroppedAndLogged) {
  CapturedLog log;
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> junk(300);
  std::mt19937 rng(11);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  junk[0] = 0x00;  // make sure the magic is wrong
  raw.send(junk);
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("garbage");
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "dropping client " + raw.local_address() + ": bad magic")) << text;
}

TEST_F(TcpStoreAuthTest, FloodBeforeTheProofIsDropped) {
  CapturedLog log;
  RawClient raw("127.0.0.1", port_);
  auto nonce = core::auth::random_nonce();
  ASSERT_TRUE(raw_auth_hello(raw, nonce));
  raw.send(std::vector<uint8_t>(64 * 1024, 0x55));  // far more than a proof
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("flood");
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "before proving it knows RINGREDUCE_TOKEN")) << text;
}

// With RINGREDUCE_TIMEOUT=1 the handshake deadline is one second instead of ten.
class TcpStoreDeadlineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    token_ = GetParam() ? kToken : "";
    ScopedEnv timeout("RINGREDUCE_TIMEOUT", "1");
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0, token_);
    port_ = server_->port();
    store_ = connect_tcp_store("127.0.0.1", port_, 5s, token_);
  }
  std::string token_;
  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
  std::shared_ptr<Store> store_;
};

TEST_P(TcpStoreDeadlineTest, HalfOpenConnectionIsDroppedAtTheDeadline) {
  CapturedLog log;
  RawClient silent("127.0.0.1", port_);  // connects and never sends a byte
  auto start = Clock::now();
  store_->set("during", bytes("ok"));
  EXPECT_TRUE(silent.closed_by_server(4s));
  double took = seconds_since(start);
  EXPECT_GE(took, 0.8);
  EXPECT_LT(took, 2.5);
  EXPECT_EQ(store_->get("during", 1s), bytes("ok"));
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "dropping client " + silent.local_address() +
                                 ": sent nothing within 1000 ms of connecting (a half-open"))
      << text;
}

TEST_P(TcpStoreDeadlineTest, SlowTrickleIsDroppedAtTheDeadline) {
  CapturedLog log;
  RawClient trickle("127.0.0.1", port_);
  // A well-formed hello (with a nonce when the store has a token), one byte every 100 ms: bytes
  // keep moving, so no stall is ever seen, but the whole would take 1.2 s (4.4 s with a nonce).
  std::vector<uint8_t> hello;
  auto nonce = core::auth::random_nonce();
  if (token_.empty())
    wire::append_client_hello(&hello);
  else
    wire::append_client_hello(&hello, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                              nonce.size());
  std::atomic<bool> stop{false};
  auto start = Clock::now();
  JoiningThread sender([&] {
    for (size_t i = 0; i < hello.size() && !stop; ++i) {
      trickle.send({hello[i]});
      std::this_thread::sleep_for(100ms);
    }
  });
  // Others are served at full speed meanwhile.
  for (int i = 0; i < 20; ++i) store_->set("n" + std::to_string(i), bytes("v"));
  EXPECT_TRUE(trickle.closed_by_server(4s));
  double took = seconds_since(start);
  stop = true;
  sender.join();
  EXPECT_GE(took, 0.8);
  EXPECT_LT(took, 2.5);
  EXPECT_EQ(store_->get("n19", 1s), bytes("v"));
  std::string text = log.take();
  EXPECT_TRUE(
      contains(text, "dropping client " + trickle.local_address() + ": did not finish its hello"))
      << text;
  EXPECT_TRUE(contains(text, "a slow trickle")) << text;
}

TEST_P(TcpStoreDeadlineTest, AuthenticatedIdleClientsAreKeptPastTheDeadline) {
  std::this_thread::sleep_for(1500ms);
  store_->set("still", bytes("here"));
  EXPECT_EQ(store_->get("still", 1s), bytes("here"));
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutToken, TcpStoreDeadlineTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "token" : "no_token");
                         });

// ---------------------------------------------------------------------------------------------
// TcpStoreProtocol: the server's state machine without sockets (what the fuzzer drives).

std::vector<uint8_t> hello_bytes() {
  std::vector<uint8_t> h;
  wire::append_client_hello(&h);
  return h;
}

TEST(TcpStoreProtocol, ServesRequestsLikeTheServer) {
  TcpStoreProtocol p;
  uint64_t a = p.connect();
  uint64_t b = p.connect();
  auto h = hello_bytes();
  ASSERT_TRUE(p.receive(a, h.data(), h.size()));
  ASSERT_TRUE(p.receive(b, h.data(), h.size()));
  EXPECT_EQ(p.take_output(a).size(), wire::kHelloBytes);
  EXPECT_EQ(p.take_output(b).size(), wire::kHelloBytes);
  // b parks in a get for a key that a sets later.
  std::vector<uint8_t> get_payload;
  wire::Writer w(&get_payload);
  w.u64(5000);
  w.str("k");
  auto get = frame(wire::Op::get, get_payload);
  ASSERT_TRUE(p.receive(b, get.data(), get.size()));
  EXPECT_TRUE(p.take_output(b).empty());
  auto set = set_request("k", "v");
  ASSERT_TRUE(p.receive(a, set.data(), set.size()));
  EXPECT_EQ(p.take_output(a).size(), wire::kFrameHeaderBytes);
  auto got = p.take_output(b);
  ASSERT_EQ(got.size(), wire::kFrameHeaderBytes + 4 + 1);
  EXPECT_EQ(got[0], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(got.back(), 'v');
  // A get that times out on the server's clock.
  std::vector<uint8_t> miss_payload;
  wire::Writer m(&miss_payload);
  m.u64(1000);
  m.str("missing");
  auto miss = frame(wire::Op::get, miss_payload);
  ASSERT_TRUE(p.receive(b, miss.data(), miss.size()));
  p.advance(999ms);
  EXPECT_TRUE(p.take_output(b).empty());
  p.advance(1ms);
  auto timeout = p.take_output(b);
  ASSERT_FALSE(timeout.empty());
  EXPECT_EQ(timeout[0], static_cast<uint8_t>(wire::Status::timeout));
}

TEST(TcpStoreProtocol, HandshakeDeadlineHoldsWhateverTrickles) {
  TcpStoreProtocol p(kToken);
  uint64_t trickle = p.connect();
  uint64_t silent = p.connect();
  auto nonce = core::auth::random_nonce();
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                            nonce.size());
  for (size_t i = 0; i + 1 < h.size() && i < 99; ++i) {
    ASSERT_TRUE(p.receive(trickle, &h[i], 1)) << "dropped after " << i * 100 << " ms";
    p.advance(100ms);  // 4.3 s for the hello's first 43 bytes
  }
  EXPECT_TRUE(p.is_open(trickle));
  EXPECT_TRUE(p.is_open(silent));
  p.advance(10000ms - 4300ms - 1ms);
  EXPECT_TRUE(p.is_open(trickle));
  p.advance(1ms);  // 10 s after accept
  EXPECT_FALSE(p.is_open(trickle));
  EXPECT_FALSE(p.is_open(silent));
}

TEST(TcpStoreProtocol, TokenHandshakeThenRequests) {
  TcpStoreProtocol p(kToken);
  uint64_t c = p.connect();
  auto nonce = core::auth::random_nonce();
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                            nonce.size());
  ASSERT_TRUE(p.receive(c, h.data(), h.size()));
  auto reply = p.take_output(c);
  ASSERT_EQ(reply.size(), wire::kHelloBytes + wire::kChallengeBytes);
  RawChallenge ch;
  std::copy_n(reply.begin() + wire::kHelloBytes, ch.server_nonce.size(), ch.server_nonce.begin());
  auto proof = to_vector(client_proof(kToken, ch, nonce));
  ASSERT_TRUE(p.receive(c, proof.data(), proof.size()));
  EXPECT_EQ(p.take_output(c), std::vector<uint8_t>{0});
  auto set = set_request("k", "v");
  ASSERT_TRUE(p.receive(c, set.data(), set.size()));
  EXPECT_EQ(p.take_output(c).size(), wire::kFrameHeaderBytes);
  p.advance(std::chrono::hours(1));  // an authenticated idle client is never dropped
  EXPECT_TRUE(p.is_open(c));
}

}  // namespace
}  // namespace ringreduce::rendezvous
