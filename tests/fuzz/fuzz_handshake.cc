// libFuzzer target: the start-up handshake of a data connection (transport/tcp/handshake.h), as
// an acceptor reads it. The input is XORed onto a valid connector hello with a token proof (so an
// all-zero input is a hello that must be accepted, and small changes reach every check), and its
// remaining bytes choose how the message is split into reads. Checked besides "no crash, no
// sanitizer report": the reader never asks for more than the hello, accepts only hellos whose
// fields are in range and whose proof is right, and the connector's check of an answer accepts
// only the real acceptor's.
#include <cstdint>
#include <cstring>
#include <vector>

#include "transport/tcp/handshake.h"

namespace {

using namespace ringreduce::transport::tcp;
namespace auth = ringreduce::core::auth;

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct Fixture {
  HelloExpect expect;
  std::vector<uint8_t> valid;
  Hello sent;
  auth::Nonce connector_nonce{};
  Fixture() {
    expect.comm_id = 0x1234;
    expect.rank = 1;
    expect.size = 5;
    expect.channels = 2;
    expect.token = "fuzz token";
    expect.nonce = auth::random_nonce();
    sent.comm_id = expect.comm_id;
    sent.rank = 3;
    sent.world_size = 5;
    sent.channel = 1;
    valid = connector_hello(sent, expect.token, expect.nonce, &connector_nonce);
    sent.auth = kHelloAuthHmac;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture f;
  std::vector<uint8_t> msg = f.valid;
  const size_t n = std::min(size, msg.size());
  for (size_t i = 0; i < n; ++i) msg[i] ^= data[i];
  // Trailing input: extra bytes the peer sends, and the sizes of the reads.
  msg.insert(msg.end(), data + n, data + size);
  HelloReader r(&f.expect);
  size_t off = 0, k = 0;
  while (off < msg.size() && r.state() == HelloReader::State::need_more) {
    const size_t want = r.want();
    CHECK(want > 0 && want <= sizeof(Hello) + kConnectorAuthBytes);
    size_t step = 1 + (k < size ? data[k] % 97 : 31);
    ++k;
    step = std::min({step, want, msg.size() - off});
    r.feed(msg.data() + off, step);
    off += step;
  }
  if (r.state() == HelloReader::State::done) {
    const Hello& h = r.hello();
    CHECK(h.rank > f.expect.rank && h.rank < f.expect.size);
    CHECK(h.channel >= 0 && h.channel < f.expect.channels);
    CHECK(h.comm_id == f.expect.comm_id && h.world_size == f.expect.size);
    // With a token, only the untouched hello and proof can pass: HMAC-SHA256 is not forgeable by
    // flipping bits.
    CHECK(std::memcmp(msg.data(), f.valid.data(), f.valid.size()) == 0);
    // And the answer to it convinces the connector.
    Hello mine;
    mine.comm_id = f.expect.comm_id;
    mine.rank = f.expect.rank;
    mine.world_size = f.expect.size;
    mine.channel = h.channel;
    const auto answer = acceptor_hello(r, mine, f.expect.token, f.expect.nonce);
    CHECK(check_acceptor_hello(answer.data(), answer.size(), f.sent, f.expect.rank, f.expect.token,
                               f.expect.nonce, f.connector_nonce)
              .empty());
  } else if (r.state() == HelloReader::State::rejected) {
    CHECK(!r.why().empty());
  }
  // The connector's side: the input as an answer from rank 1 must not pass unless it is real.
  if (size >= acceptor_hello_bytes(f.expect.token)) {
    const std::string bad =
        check_acceptor_hello(data, acceptor_hello_bytes(f.expect.token), f.sent, f.expect.rank,
                             f.expect.token, f.expect.nonce, f.connector_nonce);
    CHECK(!bad.empty());
  }
  return 0;
}
