#include "rendezvous/tls_handshakes.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {
// Handshakes at once: each costs the server a signature and a verification (about a millisecond
// of CPU) and mostly waits on its client (a round trip or two), so a few threads keep a thousand
// ranks' start-up short without a thread per rank. A handshake starts only once its client's
// first TLS bytes are in (tcp_store_server.cc), so a stranger that stalls must first speak TLS,
// and it holds a thread for at most its connection's 10 s.
constexpr size_t kThreads = 16;
}  // namespace

TlsHandshakes::TlsHandshakes(const core::tls::Files& files) : context_(files) {
  ready_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!ready_.valid()) throw Error(std::string("TCP store: eventfd: ") + std::strerror(errno));
}

TlsHandshakes::~TlsHandshakes() {
  {
    std::lock_guard lock(mu_);
    queue_.clear();
    // A handshake waiting on its client ends now rather than at its deadline.
    for (int fd : running_) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : threads_) t.request_stop();
  wake_.notify_all();
  threads_.clear();  // joins
}

void TlsHandshakes::start(uint64_t id, int fd, std::span<const uint8_t> context,
                          core::Deadline deadline) {
  Job job;
  job.id = id;
  job.fd.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  job.context.assign(context.begin(), context.end());
  job.deadline = deadline;
  std::lock_guard lock(mu_);
  if (!job.fd.valid()) {
    results_.push_back({id, std::nullopt, std::string("dup: ") + std::strerror(errno)});
    const uint64_t one = 1;
    ssize_t ignored = ::write(ready_.get(), &one, sizeof one);
    (void)ignored;
    return;
  }
  queue_.push_back(std::move(job));
  if (idle_ == 0 && threads_.size() < kThreads)
    threads_.emplace_back([this](std::stop_token stop) { work(stop); });
  else
    wake_.notify_one();
}

std::vector<TlsHandshakes::Result> TlsHandshakes::take() {
  uint64_t n = 0;
  ssize_t ignored = ::read(ready_.get(), &n, sizeof n);
  (void)ignored;
  std::lock_guard lock(mu_);
  return std::exchange(results_, {});
}

void TlsHandshakes::work(std::stop_token stop) {
  std::unique_lock lock(mu_);
  // Bounded by the server's life: it ends when the destructor asks it to stop.
  while (!stop.stop_requested()) {
    ++idle_;
    wake_.wait(lock, stop, [&] { return !queue_.empty(); });
    --idle_;
    if (queue_.empty()) continue;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_.push_back(job.fd.get());
    lock.unlock();
    Result r;
    r.id = job.id;
    if (job.deadline.expired()) {
      // Waited in the queue past its connection's deadline: said as the server's cause, not the
      // client's.
      r.error = "the store's " + std::to_string(kThreads) +
                " TLS handshake threads were busy until this connection's deadline";
    } else {
      try {
        r.secret =
            context_.handshake(job.fd.get(), core::aead::Side::acceptor, job.context, job.deadline);
      } catch (const std::exception& e) {
        r.error = e.what();
      }
    }
    lock.lock();
    std::erase(running_, job.fd.get());
    results_.push_back(std::move(r));
    const uint64_t one = 1;
    ssize_t ignored = ::write(ready_.get(), &one, sizeof one);
    (void)ignored;
    // The duplicate closes with the job; the connection's own descriptor stays the loop's.
  }
}

}  // namespace ringreduce::rendezvous
