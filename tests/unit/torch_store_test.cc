// The torch TCPStore client (rendezvous/torch_store.h): against a fake server speaking either
// dialect as torch 1.13's and 2.6's servers do (answers, and closing the connection on what they
// reject), against fakes that break the protocol, and against the real torch server when the
// system's Python has torch (torch 1.13 on this host; torch 2.6's is met by tests/python's
// test_torchrun.py in scripts/torch2's root).
#include "rendezvous/torch_store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "core/config.h"
#include "core/fd.h"
#include "rendezvous/launch_env.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// A torch TCPStore server in miniature: one thread per connection, blocking reads with a stop
// flag. Dialect v2 wants VALIDATE first and answers PING; v1 has torch 1's numbering. Either
// closes a connection on what it cannot serve, as torch's do.
class FakeTorchServer {
 public:
  enum class Mode { v1, v2, bad_ping, huge_value };

  explicit FakeTorchServer(Mode mode) : mode_(mode) {
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listener_.get(), 16), 0);
    socklen_t len = sizeof(a);
    ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FakeTorchServer() {
    stop_ = true;
    cv_.notify_all();
    acceptor_.join();
    for (auto& t : handlers_) t.join();
  }
  int port() const { return port_; }
  std::set<std::string> keys() {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::string> out;
    for (const auto& [k, v] : data_) out.insert(k);
    return out;
  }
  int connections() const { return connections_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ++connections_;
      handlers_.emplace_back([this, fd] {
        core::Fd conn(fd);
        serve(conn.get());
      });
    }
  }

  // Reads exactly n bytes; false on EOF, error or stop.
  bool read(int fd, void* out, size_t n) {
    auto* p = static_cast<uint8_t*>(out);
    while (n > 0) {
      pollfd pf{fd, POLLIN, 0};
      if (stop_) return false;
      if (::poll(&pf, 1, 20) <= 0) continue;
      ssize_t r = ::recv(fd, p, n, 0);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  template <typename T>
  bool value(int fd, T* v) {
    return read(fd, v, sizeof(T));
  }
  bool string(int fd, std::string* s) {
    uint64_t len = 0;
    if (!value(fd, &len) || len > 4096) return false;  // torch fails to allocate absurd ones
    s->resize(len);
    return read(fd, s->data(), len);
  }
  template <typename T>
  void send(int fd, const T& v) {
    (void)::send(fd, &v, sizeof(v), MSG_NOSIGNAL);
  }
  bool all_set(const std::vector<std::string>& keys) {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  }

  void serve(int fd) {
    const bool v2 = mode_ != Mode::v1;
    // torch 2's numbering; torch 1's is one less (no VALIDATE) up to GETNUMKEYS.
    const int shift = v2 ? 0 : 1;
    if (v2) {
      uint8_t type = 0;
      uint32_t magic = 0;
      if (!value(fd, &type) || type != 0 || !value(fd, &magic) || magic != 0x3C85F7CE) return;
    }
    for (;;) {
      uint8_t type = 0;
      if (!value(fd, &type)) return;
      const int t = type + shift;
      std::string key;
      if (t == 13 && v2) {  // PING
        uint32_t nonce = 0;
        if (!value(fd, &nonce)) return;
        send(fd, mode_ == Mode::bad_ping ? nonce + 1 : nonce);
      } else if (t == 1) {  // SET
        uint64_t len = 0;
        if (!string(fd, &key) || !value(fd, &len) || len > 4096) return;
        std::vector<uint8_t> v(len);
        if (!read(fd, v.data(), len)) return;
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = v;
        cv_.notify_all();
      } else if (t == 3) {  // GET
        if (!string(fd, &key)) return;
        std::vector<uint8_t> v;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (!data_.count(key)) return;  // torch: tcpStore_.at() throws, the connection closes
          v = data_[key];
        }
        uint64_t len = mode_ == Mode::huge_value ? uint64_t{1} << 40 : v.size();
        send(fd, len);
        (void)::send(fd, v.data(), v.size(), MSG_NOSIGNAL);
      } else if (t == 4) {  // ADD
        int64_t delta = 0;
        if (!string(fd, &key) || !value(fd, &delta)) return;
        std::lock_guard<std::mutex> lock(mu_);
        auto it = data_.find(key);
        if (it != data_.end())
          delta += std::stoll(std::string(it->second.begin(), it->second.end()));
        data_[key] = bytes(std::to_string(delta));
        cv_.notify_all();
        send(fd, delta);
      } else if (t == 5 || t == 6) {  // CHECK, WAIT
        uint64_t n = 0;
        if (!value(fd, &n) || n > 64) return;
        std::vector<std::string> keys(n);
        for (auto& k : keys)
          if (!string(fd, &k)) return;
        std::unique_lock<std::mutex> lock(mu_);
        if (t == 5) {
          send(fd, static_cast<uint8_t>(all_set(keys) ? 0 : 1));
        } else {
          // Until set, or the client goes away (torch forgets a closed connection's waits).
          while (!all_set(keys)) {
            if (stop_) return;
            cv_.wait_for(lock, 20ms);
            pollfd pf{fd, POLLIN, 0};
            if (::poll(&pf, 1, 0) > 0) {
              char c;
              if (::recv(fd, &c, 1, MSG_PEEK) <= 0) return;
            }
          }
          send(fd, static_cast<uint8_t>(0));
        }
      } else if (t == 7 && !v2) {  // torch 1's GETNUMKEYS (type 6)
        std::lock_guard<std::mutex> lock(mu_);
        send(fd, static_cast<int64_t>(data_.size()));
      } else {
        return;  // "Unexpected query type": the connection closes
      }
    }
  }

  const Mode mode_;
  core::Fd listener_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread acceptor_;
  std::vector<std::thread> handlers_;  // joined by the destructor (only the acceptor adds)
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

// set/get/add/check/wait, a timed-out wait, and a wait ended by another thread's set.
void exercise(FakeTorchServer& server, TorchStoreDialect want) {
  auto store = connect_torch_store("127.0.0.1", server.port(), 5s);
  ASSERT_EQ(torch_store_dialect(*store), want);
  store->set("a", bytes("alpha"));
  EXPECT_EQ(store->get("a", 1s), bytes("alpha"));
  EXPECT_TRUE(store->check({"a"}));
  EXPECT_FALSE(store->check({"a", "b"}));
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_EQ(store->get("n", 1s), bytes("3"));  // counters are decimal text, as in torch
  // The keys carry the "/" of torch's own client.
  EXPECT_EQ(server.keys(), (std::set<std::string>{"/a", "/n"}));

  const auto t0 = std::chrono::steady_clock::now();
  try {
    store->wait({"a", "missing"}, 200ms);
    FAIL() << "wait on a missing key returned";
  } catch (const TimeoutError& e) {
    // Only the key still missing is named.
    EXPECT_NE(std::string(e.what()).find("'missing' was not set within 200 ms"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  // After the timeout (its connection closed) the store still works.
  EXPECT_TRUE(store->check({"a"}));

  // A get parked in one thread does not hold up the set of another.
  std::vector<uint8_t> got;
  std::thread waiter([&] { got = store->get("late", 5s); });
  std::this_thread::sleep_for(100ms);
  store->set("late", bytes("here"));
  waiter.join();
  EXPECT_EQ(got, bytes("here"));
  EXPECT_THROW(store->get("never", 100ms), TimeoutError);
}

TEST(TorchStore, Torch2Dialect) {
  FakeTorchServer server(FakeTorchServer::Mode::v2);
  exercise(server, TorchStoreDialect::v2);
}

TEST(TorchStore, Torch1Dialect) {
  // The v2 probe is closed by a torch 1 server; the client falls back to torch 1's numbering.
  FakeTorchServer server(FakeTorchServer::Mode::v1);
  exercise(server, TorchStoreDialect::v1);
}

TEST(TorchStore, WrongPingAnswerIsNotATorchStore) {
  FakeTorchServer server(FakeTorchServer::Mode::bad_ping);
  try {
    connect_torch_store("127.0.0.1", server.port(), 2s);
    FAIL() << "connected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not speak torch's TCPStore protocol"),
              std::string::npos)
        << e.what();
  }
}

TEST(TorchStore, SilentServerIsNotATorchStore) {
  // Something that accepts and never answers (here: a listening socket nobody serves).
  core::Fd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(l.get(), 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(connect_torch_store("127.0.0.1", ntohs(a.sin_port), 500ms), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST(TorchStore, OversizedValueIsRefused) {
  FakeTorchServer server(FakeTorchServer::Mode::huge_value);
  auto store = connect_torch_store("127.0.0.1", server.port(), 2s);
  store->set("k", bytes("v"));
  try {
    store->get("k", 1s);
    FAIL() << "a 1 TiB value was accepted";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit"), std::string::npos) << e.what();
  }
}

TEST(TorchStore, NothingListeningTimesOut) {
  int port = 0;
  {
    core::Fd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ::getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }  // closed: nothing listens there now
  EXPECT_THROW(connect_torch_store("127.0.0.1", port, 300ms), TimeoutError);
}

// The real thing: torch's TCPStore server in the system's Python (torch 1.13 here). The script
// hosts the store, sets a key, waits for the client's key, checks its counter and prints OK.
TEST(TorchStore, RealTorchServer) {
  const char* py = "/usr/bin/python3";
  if (::access(py, X_OK) != 0 ||
      std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no torch in /usr/bin/python3";
  const char* script = R"(
import datetime, sys, torch
import torch.distributed as d
kw = {"use_libuv": False} if int(torch.__version__.split(".")[0]) >= 2 else {}
s = d.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30),
               wait_for_workers=False, **kw)
s.set("from_torch", "hello")
print(s.port, flush=True)
s.wait(["from_ringreduce"])
assert s.get("from_ringreduce") == b"world", s.get("from_ringreduce")
assert s.add("counter", 1) == 8
print("OK torch", torch.__version__, flush=True)
)";
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::execl(py, py, "-c", script, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  core::Fd from_py(out[0]);
  // Killed by pid on every way out.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{pid};
  auto read_line = [&](std::chrono::milliseconds limit) {
    std::string line;
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{from_py.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char c;
      if (::read(from_py.get(), &c, 1) != 1) break;
      if (c == '\n') return line;
      line += c;
    }
    return line;
  };
  const std::string port = read_line(60s);
  ASSERT_FALSE(port.empty()) << "the torch script printed no port";
  auto store = connect_torch_store("127.0.0.1", std::stoi(port), 10s);
  EXPECT_EQ(store->get("from_torch", 5s), bytes("hello"));
  EXPECT_FALSE(store->check({"from_ringreduce"}));
  EXPECT_THROW(store->wait({"nobody"}, 100ms), TimeoutError);
  EXPECT_EQ(store->add("counter", 7), 7);
  store->set("from_ringreduce", bytes("world"));
  const std::string verdict = read_line(30s);
  EXPECT_EQ(verdict.rfind("OK torch", 0), 0u) << "the torch script said: '" << verdict << "'";
  std::cout << "[ info ] " << verdict << ", dialect "
            << (torch_store_dialect(*store) == TorchStoreDialect::v1 ? "v1" : "v2") << "\n";
}

// When the launcher's store is torch's: TORCHELASTIC_USE_AGENT_STORE=True with MASTER_ADDR and
// MASTER_PORT; not with RINGREDUCE_ADDR (a ringreduce store of the user's), nor with "False".
TEST(TorchStore, LaunchEnvTellsTheAgentStore) {
  struct Env {
    const char* name;
    Env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~Env() { ::unsetenv(name); }
  };
  Env rank("RANK", "1"), size("WORLD_SIZE", "2"), addr("MASTER_ADDR", "127.0.0.1"),
      port("MASTER_PORT", "29511"), run("TORCHELASTIC_RUN_ID", "job7"),
      restart("TORCHELASTIC_RESTART_COUNT", "2");
  {
    Env agent("TORCHELASTIC_USE_AGENT_STORE", "True");
    core::Config config;
    LaunchInfo info = detect_launch(config);
    EXPECT_TRUE(info.torch_store);
    EXPECT_EQ(info.store_port, 29511);
    EXPECT_TRUE(launch_hints(config).torch_store);
    // The run's id, not the restart count (each agent's own: one that joins later counts from
    // 0); the groups of a run are told apart by their generation in the store.
    EXPECT_EQ(job_id(config), "torchrun-job7");
    EXPECT_TRUE(rounds_share_store());
    {
      Env none("TORCHELASTIC_RUN_ID", "none");  // the static rendezvous's
      EXPECT_EQ(job_id(config), "torchrun-none");
    }
    core::Config own(std::map<std::string, std::string>{{"RINGREDUCE_ADDR", "127.0.0.1:29600"}});
    EXPECT_FALSE(detect_launch(own).torch_store);
  }
  {
    Env agent("TORCHELASTIC_USE_AGENT_STORE", "False");
    core::Config config;
    EXPECT_FALSE(detect_launch(config).torch_store);
  }
}

}  // namespace
}  // namespace ringreduce::rendezvous
