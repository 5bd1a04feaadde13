#!/usr/bin/env bash
# Strangers against a running job's store (issue 6, authentication). With RINGREDUCE_TOKEN set,
# four ranks of ringreduce-perf (started by hand, so that rank 0 hosts the store) run a long
# 64 MiB allreduce; while it runs, five clients written here in python3 hit the store's port:
#   wrong-token  a full handshake whose proof is made with another token: denied, then closed
#   no-token     a hello without a proof: refused (auth_required), then closed
#   garbage      random bytes: dropped at once (bad magic)
#   half-open    connects and sends nothing: dropped at the 10 s handshake deadline
#   trickle      a valid hello, one byte every 300 ms: dropped at the same deadline
# Passes when each stranger saw the server close on it, rank 0's log has a WARN line naming each
# one's address and why it was dropped, the job was still running when the last one finished, and
# the job exits 0 with its results checked ("Out of bounds values : 0 OK").
# Usage: strangers.sh BUILD_DIR. Every process is bounded by timeout and killed by pid on exit.
set -uo pipefail
build=$1
perf=$build/tools/ringreduce-perf
[ -x "$perf" ] || { echo "FAILED: no $perf"; exit 1; }
dir=$(mktemp -d /tmp/rr_strangers_XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export RINGREDUCE_TOKEN="strangers test token $$"
# -n 300: 300 calls out of place, then 300 in place, about 20 s here (34 and 42 ms a call), so
# that the job outlives the 10 s handshake deadline (checked below). Not adaptive (-n 0 -T):
# that estimates from one call, and a slow first call once made the run 4 s long. The ranks'
# 400 s limit guards against a hang only: in clean-clone runs, beside a cold build of the
# torch 2 root, ctest -j 2 and more, the 600 calls took longer than 100 s once and longer than
# 200 s once (2026-11-29, beside the cluster and soak tests; no op waited even the stall
# monitor's 60 s).
for r in 0 1 2 3; do
  env RINGREDUCE_RANK=$r RINGREDUCE_WORLD_SIZE=4 RINGREDUCE_ADDR="127.0.0.1:$port" RINGREDUCE_DEBUG=INFO \
    timeout 400 "$perf" allreduce -b 64M -e 64M -n 300 -w 1 >"$dir/rank$r.log" 2>&1 &
  pids+=($!)
done

# The strangers come once the job is running: after rank 0's communicator is ready.
for _ in $(seq 1 300); do
  grep -q "communicator ready" "$dir/rank0.log" && break
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.1
done
grep -q "communicator ready" "$dir/rank0.log" || { echo "FAILED: the job did not start"; cat "$dir/rank0.log"; exit 1; }

cat >"$dir/stranger.py" <<'EOF'
# One stranger; prints "ADDR <its address>" at once and "OK <what happened>" if the server
# behaved, else "BAD <what happened>" (exit 1).
import hashlib, hmac, os, socket, struct, sys, time

kind, port = sys.argv[1], int(sys.argv[2])
MAGIC, VERSION, HMAC_AUTH = 0x52524B56, 2, 1  # the store wire version (tcp_store_wire.h)

def closed_by_server(s, limit):
    """Seconds until the server closed the connection (EOF or reset), or None."""
    start = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - start < limit:
        try:
            if s.recv(4096) == b"":
                return time.monotonic() - start
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - start
    return None

def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        part = s.recv(n - len(buf))
        if not part:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += part
    return buf

def done(ok, what):
    print(("OK " if ok else "BAD ") + what, flush=True)
    sys.exit(0 if ok else 1)

s = socket.create_connection(("127.0.0.1", port), timeout=5)
print("ADDR %s:%d" % s.getsockname()[:2], flush=True)
nonce = os.urandom(32)
hello = struct.pack(">IHHI", MAGIC, VERSION, HMAC_AUTH, 32) + nonce

if kind == "wrong-token":
    s.sendall(hello)
    magic, version, status, clen = struct.unpack(">IHHI", recv_exact(s, 12))
    if magic != MAGIC or status != 0 or clen != 64:
        done(False, "unexpected server hello %x %d %d %d" % (magic, version, status, clen))
    challenge = recv_exact(s, 64)
    ctx = struct.pack(">IHH", MAGIC, VERSION, HMAC_AUTH)
    msg = b"ringreduce store client\0" + ctx + challenge[:32] + nonce
    s.sendall(hmac.new(b"not the job's token", msg, hashlib.sha256).digest())
    verdict = recv_exact(s, 1)
    took = closed_by_server(s, 5)
    done(verdict == b"\x01" and took is not None, "denied=%s closed=%s" % (verdict == b"\x01", took))
elif kind == "no-token":
    s.sendall(struct.pack(">IHHI", MAGIC, VERSION, 0, 0))
    magic, version, status, clen = struct.unpack(">IHHI", recv_exact(s, 12))
    took = closed_by_server(s, 5)
    done(status == 3 and took is not None, "status=%d closed=%s" % (status, took))
elif kind == "garbage":
    junk = bytearray(os.urandom(512))
    junk[0] = 0  # never the magic
    s.sendall(bytes(junk))
    took = closed_by_server(s, 5)
    done(took is not None and took < 3, "closed after %s s" % took)
elif kind == "half-open":
    took = closed_by_server(s, 30)
    done(took is not None and 8 <= took <= 15, "closed after %s s" % took)
elif kind == "trickle":
    start = time.monotonic()
    sent = 0
    try:
        for b in hello:  # 44 bytes at 300 ms each would take 13 s
            s.sendall(bytes([b]))
            sent += 1
            time.sleep(0.3)
            s.setblocking(False)
            try:
                if s.recv(4096) == b"":
                    break
            except BlockingIOError:
                pass
            finally:
                s.setblocking(True)
    except OSError:
        pass
    took = time.monotonic() - start
    rest = closed_by_server(s, 10)
    ok = sent < len(hello) and rest is not None and 8 <= took + rest <= 15
    done(ok, "sent %d of %d bytes, closed after %.1f s" % (sent, len(hello), took + (rest or 0)))
else:
    done(False, "unknown stranger " + kind)
EOF

kinds=(wrong-token no-token garbage half-open trickle)
spids=()
for k in "${kinds[@]}"; do
  timeout 60 python3 "$dir/stranger.py" "$k" "$port" >"$dir/$k.out" 2>&1 &
  spids+=($!)
  pids+=($!)
done
rc=0
for i in "${!kinds[@]}"; do
  wait "${spids[$i]}" || rc=1
  echo "${kinds[$i]}: $(tail -1 "$dir/${kinds[$i]}.out")"
done
[ $rc -eq 0 ] || { echo "FAILED: a stranger was not treated as it should be"; cat "$dir"/*.out; exit 1; }
# The strangers must have come while the job ran, or this test proves nothing about the job.
for r in 0 1 2 3; do
  kill -0 "${pids[$r]}" 2>/dev/null || { echo "FAILED: rank $r ended before the strangers were done; make the run longer"; cat "$dir/rank$r.log"; exit 1; }
done

for r in 0 1 2 3; do
  wait "${pids[$r]}"; code=$?
  [ $code -eq 0 ] || { echo "FAILED: rank $r exited $code"; tail -20 "$dir/rank$r.log"; rc=1; }
done
grep -q "Out of bounds values : 0 OK" "$dir/rank0.log" || { echo "FAILED: wrong results"; rc=1; }
grep -E "^ +67108864 " "$dir/rank0.log"

# Rank 0's log names each stranger's address and why it was dropped.
declare -A why=(
  [wrong-token]="dropping client ADDR: its proof of RINGREDUCE_TOKEN is wrong"
  [no-token]="refusing client ADDR: it sent no proof of RINGREDUCE_TOKEN"
  [garbage]="dropping client ADDR: bad magic"
  [half-open]="dropping client ADDR: sent nothing within 10000 ms of connecting (a half-open connection)"
  [trickle]="dropping client ADDR: did not finish its hello and proof of RINGREDUCE_TOKEN within 10000 ms of connecting"
)
for k in "${kinds[@]}"; do
  addr=$(sed -n 's/^ADDR //p' "$dir/$k.out")
  want=${why[$k]/ADDR/$addr}
  line=$(grep -F "$want" "$dir/rank0.log" | grep " WARN ")
  if [ -n "$addr" ] && [ -n "$line" ]; then
    echo "logged: $line"
  else
    echo "FAILED: rank 0 did not log '$want'"; rc=1
  fi
done
[ $rc -eq 0 ] || { echo "--- rank 0's log:"; grep -v "^RINGREDUCE_" "$dir/rank0.log"; exit 1; }
echo "ok: 5 strangers dropped and logged; the job's results are right"
