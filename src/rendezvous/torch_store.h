// A client of torch's TCPStore (torch.distributed.TCPStore, c10d), as a ringreduce::Store.
//
// torchrun's agent hosts such a store on MASTER_ADDR:MASTER_PORT and tells its workers so with
// TORCHELASTIC_USE_AGENT_STORE=True (torch 1.13 with the static rendezvous, torch 2.x with the
// static and the c10d ones). Rank 0 cannot host ringreduce's own store on that port then, so the
// ranks rendezvous through torch's store instead (launch_env.h decides when).
//
// Two dialects of the protocol, told apart at the first connection (the first that answers its
// probe is used for every later connection):
//   v2 (torch 2.x): each connection opens with VALIDATE (0) and the magic 0x3C85F7CE; query types
//      VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, ... CANCEL_WAIT=12,
//      PING=13. The probe is VALIDATE then PING with a nonce, which the server echoes.
//   v1 (torch 1.x): no handshake; SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5,
//      GETNUMKEYS=6. The probe is GETNUMKEYS, answered by an int64.
// A v1 server closes the connection on the v2 probe (it reads a SET whose key length, made of the
// magic and the nonce, is over 2^63, and fails to allocate it); a v2 server closes the connection
// on anything before VALIDATE. Both were checked against torch 1.13 and 2.6's servers.
//
// On the wire: a query type byte, then its arguments; strings and values are a uint64 length and
// the bytes; counts and integers are in the host's byte order (little-endian here). SET has no
// answer; GET answers a length and the value; ADD the new value (int64; the store keeps counters
// as decimal text, as ringreduce's stores do); CHECK one byte (0 ready, 1 not); WAIT one byte
// (0) once every key is set. Keys go out with the "/" that torch's own TCPStore client puts before
// every key, so that torch's clients and this one see the same keys.
//
// Requests take a connection from a small pool (one thread's long wait does not hold up another
// thread's set). A WAIT that times out leaves its connection with an answer still to come: that
// connection is closed (the server forgets a closed connection's waits), not reused. A SET is
// followed by a CHECK of its key on the same connection, so that it has taken effect when set()
// returns, as with ringreduce's store: a later request on another connection sees it.
// torch's store authenticates no one: RINGREDUCE_TOKEN cannot protect it (the data connections
// still prove the token).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ringreduce/store.h"

namespace ringreduce::rendezvous {

enum class TorchStoreDialect { v1, v2 };

// Connects to torch's TCPStore at host:port, retrying until timeout while nothing listens there,
// and finds its dialect. Error if the service there answers neither probe (not a torch store, or
// a protocol this client does not know); TimeoutError if it never becomes reachable. The timeout
// is also the limit of each later request's answer (a get or wait has its own).
std::shared_ptr<Store> connect_torch_store(const std::string& host, int port,
                                           std::chrono::milliseconds timeout);

// The dialect a store returned by connect_torch_store speaks (for tests and the start-up log);
// nullopt for any other store.
std::optional<TorchStoreDialect> torch_store_dialect(const Store& store);

}  // namespace ringreduce::rendezvous
