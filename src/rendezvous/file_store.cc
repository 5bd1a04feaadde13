// The file store. Layout of the directory:
//   k_<encoded key>       one file per key whose encoded name is short enough
//   h_<prefix>_<hash>     one file per longer key (NAME_MAX is 255 bytes; keys may be 4 KiB)
//   .lock                 flock()ed around add() so read-modify-write is atomic across processes
//   .tmp.<host>.<pid>...  files being written; renamed over their final name when complete
// Every key file holds "RRF1", the key's length (u32, big-endian), the key, then the value. The
// stored key makes the hashed names safe (a collision is detected, not silently served) and lets
// a reader tell a store file from anything else that landed in the directory.
//
// set() writes a temporary file and rename()s it into place, so a reader sees either the old
// complete value or the new complete value, never a torn one (rename is atomic on local
// filesystems and on NFS). Readers poll: a shared filesystem has no portable change notification.
#include "rendezvous/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "core/fd.h"
#include "rendezvous/store_util.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

constexpr char kMagic[4] = {'R', 'R', 'F', '1'};
constexpr size_t kHeaderBytes = 8;  // magic + key length
// Encoded names up to this length are used verbatim; longer ones are shortened and hashed.
constexpr size_t kMaxPlainName = 200;
// add() holds the lock for one small read and one small write; a holder that keeps it this
// long is stuck (or the filesystem is), and waiting on is worse than failing with a message.
constexpr std::chrono::seconds kLockTimeout(60);
// Pollers start fast (a set from a sibling process often lands within a millisecond or two)
// and back off so that many waiting ranks do not hammer a shared filesystem.
constexpr std::chrono::microseconds kPollFirst(500);
constexpr std::chrono::milliseconds kPollMax(50);

using core::errno_text;

uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Keeps [a-z0-9_.-] and writes every other byte as %xx with lowercase hex. No upper-case letter
// ever appears in a name, so two keys cannot collide on a case-insensitive filesystem either.
std::string encode_key(const std::string& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    bool plain =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string file_name(const std::string& key) {
  std::string enc = encode_key(key);
  if (enc.size() + 2 <= kMaxPlainName) return "k_" + enc;
  // Two independent 64-bit hashes; the key stored in the file catches the rare collision.
  char hash[40];
  std::snprintf(hash, sizeof(hash), "_%016llx%016llx",
                static_cast<unsigned long long>(fnv1a(key, 0xcbf29ce484222325ULL)),
                static_cast<unsigned long long>(fnv1a(key, 0x84222325cbf29ce4ULL)));
  return "h_" + enc.substr(0, 120) + hash;
}

void write_all(int fd, const uint8_t* data, size_t len, const std::string& path) {
  // Bounded: every iteration either writes at least one byte or throws (EINTR aside).
  while (len > 0) {
    ssize_t n = ::write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("file store: cannot write " + path + ": " + errno_text(errno));
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
}

// Writes header, key and value with as few system calls as the kernel allows (usually one).
void write_entry_file(int fd, const uint8_t* header, const std::string& key,
                      const std::vector<uint8_t>& value, const std::string& path) {
  iovec iov[3] = {{const_cast<uint8_t*>(header), kHeaderBytes},
                  {const_cast<char*>(key.data()), key.size()},
                  {const_cast<uint8_t*>(value.data()), value.size()}};
  size_t total = kHeaderBytes + key.size() + value.size();
  ssize_t n = ::writev(fd, iov, 3);
  if (n == static_cast<ssize_t>(total)) return;
  if (n < 0 && errno != EINTR)
    throw Error("file store: cannot write " + path + ": " + errno_text(errno));
  // A short write: finish piece by piece from where writev stopped.
  size_t done = n > 0 ? static_cast<size_t>(n) : 0;
  for (const iovec& v : iov) {
    size_t skip = std::min(done, v.iov_len);
    done -= skip;
    write_all(fd, static_cast<const uint8_t*>(v.iov_base) + skip, v.iov_len - skip, path);
  }
}

// Reads up to max bytes, or to the end of the file when max is SIZE_MAX. size_hint (the file's
// size) sizes the buffer once so that a 64 MiB value is not grown and copied chunk by chunk.
std::vector<uint8_t> read_up_to(int fd, size_t size_hint, size_t max, const std::string& path) {
  constexpr size_t kChunk = 1 << 16;
  // One byte beyond the hint, so that reaching EOF does not need a reallocation to notice it.
  std::vector<uint8_t> buf(std::min(size_hint + 1, max));
  size_t have = 0;
  // Bounded: every pass reads at least one byte or stops (EOF, max reached, or an error).
  while (have < max) {
    if (have == buf.size()) buf.resize(std::min(max, have + kChunk));
    ssize_t n = ::read(fd, buf.data() + have, buf.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("file store: cannot read " + path + ": " + errno_text(errno));
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  buf.resize(have);
  return buf;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Removes a temporary file unless it was renamed into place: no failed set() leaves litter.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::string path) : path_(std::move(path)) {}
  ~TempFileGuard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void committed() { path_.clear(); }

 private:
  std::string path_;
};

// Holds the flock on the store's lock file for the lifetime of the object.
class FlockGuard {
 public:
  FlockGuard(int fd, const std::string& path) : fd_(fd) {
    auto deadline = core::Deadline::after(kLockTimeout);
    auto pause = std::chrono::microseconds(50);
    // Bounded by the deadline. LOCK_NB and a sleep rather than a blocking flock(): a blocking
    // call could not honour the deadline.
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR)
        throw Error("file store: cannot lock " + path + ": " + errno_text(errno));
      if (deadline.expired())
        throw TimeoutError("file store: " + path + " stayed locked for " +
                           std::to_string(kLockTimeout.count()) +
                           " s; a process holding it is stuck");
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }
  ~FlockGuard() { ::flock(fd_, LOCK_UN); }
  FlockGuard(const FlockGuard&) = delete;
  FlockGuard& operator=(const FlockGuard&) = delete;

 private:
  int fd_;
};

class FileStore : public Store {
 public:
  explicit FileStore(const std::string& directory) : dir_(directory), name_("file store " + dir_) {
    if (dir_.empty()) throw InvalidArgument("file store: the directory name is empty");
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw Error(name_ + ": cannot create the directory: " + ec.message());
    std::string lock_path = path_of(".lock");
    lock_fd_.reset(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!lock_fd_.valid())
      throw Error(name_ + ": cannot open " + lock_path + ": " + errno_text(errno));
    // Host, pid and a random tag keep temporary names unique across the processes (and hosts,
    // and pid namespaces) that share the directory.
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "host");
    std::random_device rd;
    tmp_prefix_ = ".tmp." + encode_key(host) + "." + std::to_string(::getpid()) + "." +
                  std::to_string(rd()) + ".";
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    write_entry(key, value);
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto deadline = store_deadline(timeout);
    auto pause = std::chrono::duration_cast<std::chrono::microseconds>(kPollFirst);
    // Bounded by the deadline: each pass sleeps, and the last pass is at or after the deadline.
    for (;;) {
      if (auto v = read_entry(key, true)) return std::move(*v);
      if (deadline.expired()) throw TimeoutError(missing_keys_message(name_, {key}, timeout));
      sleep_until_next_poll(deadline, &pause);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    // Threads of this process queue on the mutex: flock() does not exclude threads that share
    // one open file description, and a mutex is cheaper than all of them polling the flock.
    std::lock_guard<std::mutex> lock(add_mu_);
    FlockGuard flock(lock_fd_.get(), path_of(".lock"));
    auto existing = read_entry(key, true);
    int64_t current = existing ? parse_counter(name_, key, *existing) : 0;
    int64_t result = add_counter(name_, key, current, delta);
    write_entry(key, format_counter(result));
    return result;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    auto deadline = store_deadline(timeout);
    auto pause = std::chrono::duration_cast<std::chrono::microseconds>(kPollFirst);
    std::vector<std::string> missing = keys;
    for (;;) {
      // Keys are never removed, so a key seen once need not be looked at again.
      std::erase_if(missing,
                    [&](const std::string& k) { return read_entry(k, false).has_value(); });
      if (missing.empty()) return;
      if (deadline.expired()) throw TimeoutError(missing_keys_message(name_, missing, timeout));
      sleep_until_next_poll(deadline, &pause);
    }
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys)
      if (!read_entry(k, false)) return false;
    return true;
  }

 private:
  std::string path_of(const std::string& name) const { return dir_ + "/" + name; }

  static void sleep_until_next_poll(const core::Deadline& deadline,
                                    std::chrono::microseconds* pause) {
    auto wake = std::min(core::Clock::now() + *pause, deadline.at());
    std::this_thread::sleep_until(wake);
    *pause = std::min<std::chrono::microseconds>(*pause * 2, kPollMax);
  }

  void write_entry(const std::string& key, const std::vector<uint8_t>& value) {
    if (key.size() > UINT32_MAX) throw InvalidArgument(name_ + ": key too long");
    std::string final_path = path_of(file_name(key));
    std::string tmp_path = path_of(tmp_prefix_ + std::to_string(tmp_counter_++));
    core::Fd fd(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd.valid()) throw Error(name_ + ": cannot create " + tmp_path + ": " + errno_text(errno));
    TempFileGuard guard(tmp_path);
    uint8_t header[kHeaderBytes];
    std::memcpy(header, kMagic, 4);
    uint32_t klen = static_cast<uint32_t>(key.size());
    for (int i = 0; i < 4; ++i) header[4 + i] = static_cast<uint8_t>(klen >> (24 - 8 * i));
    write_entry_file(fd.get(), header, key, value, tmp_path);
    // On NFS, close() is where buffered data reaches the server, so its error matters.
    if (::close(fd.release()) != 0)
      throw Error(name_ + ": cannot write " + tmp_path + ": " + errno_text(errno));
    if (::rename(tmp_path.c_str(), final_path.c_str()) != 0)
      throw Error(name_ + ": cannot rename " + tmp_path + " to " + final_path + ": " +
                  errno_text(errno));
    guard.committed();
  }

  // The value stored under key (empty when !want_value), or nullopt if the key is not set.
  std::optional<std::vector<uint8_t>> read_entry(const std::string& key, bool want_value) {
    std::string path = path_of(file_name(key));
    core::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return std::nullopt;
      throw Error(name_ + ": cannot open " + path + ": " + errno_text(errno));
    }
    struct stat st {};
    size_t size_hint = ::fstat(fd.get(), &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
    size_t header_len = kHeaderBytes + key.size();
    // One read for the common small entry; only the header when the value is not wanted.
    std::vector<uint8_t> data =
        read_up_to(fd.get(), size_hint, want_value ? SIZE_MAX : header_len, path);
    if (data.size() < header_len || std::memcmp(data.data(), kMagic, 4) != 0 ||
        be32(data.data() + 4) != key.size() ||
        std::memcmp(data.data() + kHeaderBytes, key.data(), key.size()) != 0)
      throw Error(name_ + ": " + path + " does not hold key " + quote_key(key) +
                  " (a foreign or corrupt file, or a hash collision)");
    if (!want_value) return std::vector<uint8_t>();
    data.erase(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(header_len));
    return data;
  }

  std::string dir_;
  std::string name_;
  std::string tmp_prefix_;
  std::atomic<uint64_t> tmp_counter_{0};
  std::mutex add_mu_;
  core::Fd lock_fd_;
};

}  // namespace

std::shared_ptr<Store> make_file_store(const std::string& directory) {
  return std::make_shared<FileStore>(directory);
}

}  // namespace ringreduce::rendezvous
