// Single-stream TCP throughput, a tiny iperf: a receiver process and a sender process (forked) on
// 127.0.0.1; the sender writes W-byte blocks for ~T seconds, the receiver counts bytes from
// accept() to the last byte before EOF. Default socket buffers (kernel autotuning).
//   tcp_stream [-t SECONDS=2] [-s WRITE_BYTES=4M] [-a IPV4_ADDR] [-R NETNS] [-S NETNS]
// Across an emulated cluster (scripts/cluster): the receiver enters network namespace -R and
// listens on -a (its address there), the sender enters namespace -S and connects to it, e.g.
//   tcp_stream -a 10.213.77.1 -R /run/netns/rrch0 -S /run/netns/rrch1
// Output (one line, parsed by bench/plots/make_table.py):
//   tcp_stream write=4194304 bytes=... time_s=... GB/s=...
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  std::size_t mul = 1;
  if (end && (*end == 'k' || *end == 'K')) mul = std::size_t{1} << 10;
  if (end && (*end == 'm' || *end == 'M')) mul = std::size_t{1} << 20;
  if (end && (*end == 'g' || *end == 'G')) mul = std::size_t{1} << 30;
  return static_cast<std::size_t>(v * static_cast<double>(mul));
}

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// Moves this process into the network namespace at path (ip netns keeps them in /run/netns).
void enter_netns(const std::string& path) {
  if (path.empty()) return;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) die(path.c_str());
  if (setns(fd, CLONE_NEWNET) != 0) die("setns");
  close(fd);
}

in_addr_t g_addr = htonl(INADDR_LOOPBACK);

int sender(uint16_t port, std::size_t block, double seconds) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = g_addr;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("connect");
  std::vector<char> buf(block, 'x');
  double end = now_s() + seconds;
  while (now_s() < end) {
    std::size_t off = 0;
    while (off < block) {
      ssize_t n = write(fd, buf.data() + off, block - off);
      if (n < 0) die("write");
      off += static_cast<std::size_t>(n);
    }
  }
  close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0;
  std::size_t block = std::size_t{4} << 20;
  std::string addr_text = "127.0.0.1", recv_ns, send_ns;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-t" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "-s" && i + 1 < argc) {
      block = parse_size(argv[++i]);
    } else if (a == "-a" && i + 1 < argc) {
      addr_text = argv[++i];
    } else if (a == "-R" && i + 1 < argc) {
      recv_ns = argv[++i];
    } else if (a == "-S" && i + 1 < argc) {
      send_ns = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [-t SECONDS] [-s WRITE_BYTES] [-a IPV4] [-R NETNS] [-S NETNS]\n",
                   argv[0]);
      return 2;
    }
  }
  if (block == 0) block = 1;
  if (inet_pton(AF_INET, addr_text.c_str(), &g_addr) != 1) {
    std::fprintf(stderr, "tcp_stream: -a wants an IPv4 address, not '%s'\n", addr_text.c_str());
    return 2;
  }
  enter_netns(recv_ns);

  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = g_addr;
  if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("bind");
  if (listen(lfd, 1) != 0) die("listen");
  socklen_t len = sizeof(a);
  if (getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) die("getsockname");
  uint16_t port = ntohs(a.sin_port);

  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(lfd);
    enter_netns(send_ns);
    std::_Exit(sender(port, block, seconds));
  }

  int fd = accept(lfd, nullptr, nullptr);
  if (fd < 0) die("accept");
  close(lfd);
  std::vector<char> buf(block);
  std::size_t total = 0;
  const double t0 = now_s();
  double t1 = t0;
  for (;;) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) die("read");
    if (n == 0) break;
    total += static_cast<std::size_t>(n);
    t1 = now_s();
  }
  close(fd);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "tcp_stream: sender failed\n");
    return 1;
  }
  double dt = t1 - t0;
  std::printf("# tcp_stream: one TCP stream to %s, %zu-byte writes, ~%.1f s\n", addr_text.c_str(),
              block, seconds);
  std::printf("tcp_stream write=%zu bytes=%zu time_s=%.3f GB/s=%.3f\n", block, total, dt,
              dt > 0 ? static_cast<double>(total) / dt / 1e9 : 0.0);
  return 0;
}
