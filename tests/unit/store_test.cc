// The Store conformance suite, run against every implementation (memory, file, TCP over IPv4
// and IPv6 loopback, with a token, and sealed with RINGREDUCE_ENCRYPT=psk), then the file store's
// specifics and split_host_port.
#include "store_test_util.h"

namespace ringreduce::rendezvous {
namespace {

using namespace store_testing;

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
    } else if (kind == "tcp4psk") {
      // Every operation sealed (RINGREDUCE_ENCRYPT=psk): records of at most 64 KiB both ways.
      host_ = "127.0.0.1";
      security_ = core::Security{"conformance token", core::Encrypt::psk, {}};
      server_ = std::make_unique<TcpStoreServer>(host_, 0, security_);
      store_ = connect_tcp_store(host_, server_->port(), 5s, security_);
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
    if (server_ && security_.encrypt != core::Encrypt::off)
      return connect_tcp_store(host_, server_->port(), 5s, security_);
    if (server_) return connect_tcp_store(host_, server_->port(), 5s, token_);
    return store_;
  }

  // Declared so that the store goes first, then the server, then the directory.
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<TcpStoreServer> server_;
  std::string host_;
  std::string token_;
  core::Security security_;
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
  EXPECT_EQ(store_->get_unless("big", "never", 10s), big);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreConformance,
                         ::testing::Values("memory", "file", "tcp4", "tcp4token", "tcp4psk",
                                           "tcp6"),
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

}  // namespace
}  // namespace ringreduce::rendezvous
