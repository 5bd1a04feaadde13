// ringreduce-store: a standalone rendezvous store server, for jobs where rank 0 should not host
// the store (RINGREDUCE_STORE_SERVER=0) or where the store must outlive any one rank.
//   ringreduce-store [--host H] [--port P] | --help | --version
// With RINGREDUCE_TOKEN set in its environment, only clients that prove they hold the same token
// are served; with RINGREDUCE_ENCRYPT=psk or tls (and its files) every connection is encrypted,
// as the ranks' must be too.
// Prints "listening on HOST:PORT" once it accepts connections, then serves until SIGINT or
// SIGTERM.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "core/config.h"
#include "core/security.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/tcp_store.h"
#include "tool_version.h"

namespace {

constexpr const char* kUsage =
    "usage: ringreduce-store [--host H] [--port P]\n"
    "  --host H   address to listen on (default 0.0.0.0; :: for IPv6 and IPv4)\n"
    "  --port P   TCP port (default 29500; 0 picks a free one)\n"
    "  -h, --help print this text; --version: print the version\n"
    "RINGREDUCE_TOKEN in the environment: serve only clients that prove they hold it.\n"
    "RINGREDUCE_ENCRYPT=psk|tls (with RINGREDUCE_TLS_KEY, _CERT, _CA for tls): encrypt every\n"
    "connection, as the ranks' settings must say too.\n";

bool parse_port(const std::string& text, int* port) {
  if (text.empty() || text.size() > 5) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  *port = std::stoi(text);
  return *port <= 65535;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "0.0.0.0";
  int port = 29500;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("%s\n", ringreduce_tools::version_text("ringreduce-store").c_str());
      return 0;
    }
    if (arg != "--host" && arg != "--port") {
      std::fprintf(stderr, "ringreduce-store: unknown argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ringreduce-store: %s needs a value\n%s", arg.c_str(), kUsage);
        return 2;
      }
      value = argv[++i];
    }
    if (arg == "--host") {
      host = value;
    } else if (!parse_port(value, &port)) {
      std::fprintf(stderr, "ringreduce-store: --port '%s' is not a port (0..65535)\n",
                   value.c_str());
      return 2;
    }
  }

  // Block the signals before the server thread starts, so that every thread inherits the mask
  // and they are delivered only to the sigwait() below, not to a random thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr) != 0) {
    std::fprintf(stderr, "ringreduce-store: cannot block SIGINT/SIGTERM\n");
    return 1;
  }

  try {
    // The token comes from the environment, never the command line, where ps would show it.
    ringreduce::rendezvous::TcpStoreServer server(
        host, port, ringreduce::core::security_settings(ringreduce::core::Config()));
    std::printf("listening on %s\n",
                ringreduce::rendezvous::join_host_port(host, server.port()).c_str());
    std::fflush(stdout);
    int sig = 0;
    // Bounded by the process's life: it ends on the first SIGINT or SIGTERM.
    while (sigwait(&stop_signals, &sig) != 0) {
    }
    const auto served = server.stats();
    std::fprintf(
        stderr,
        "ringreduce-store: %s, shutting down (served %llu requests over %llu connections)\n",
        strsignal(sig), static_cast<unsigned long long>(served.requests),
        static_cast<unsigned long long>(served.connections));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringreduce-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
