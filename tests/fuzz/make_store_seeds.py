#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_store (tests/fuzz/corpus/fuzz_store/): a few well-formed
sessions in the harness's command language (see fuzz_store.cc), so that the fuzzer starts from
every request kind, parked gets and waits, timeouts and the token handshake instead of having to
discover the magic number first. Run it again after changing the language or the wire format."""
import os
import struct
import sys

MAGIC, VERSION = 0x52524B56, 2
SET, GET, ADD, WAIT, CHECK, GET_UNLESS = 1, 2, 3, 4, 5, 6


def cmd(op, slot):
    return bytes([(op << 2) | slot])


def feed(slot, data):
    out = b""
    while True:  # a feed carries at most 255 bytes
        out += cmd(0, slot) + bytes([min(len(data), 255)]) + data[:255]
        data = data[255:]
        if not data:
            return out


def hello(slot):
    return cmd(7, slot)


def prove(slot):
    return cmd(4, slot)


def advance(b):
    return cmd(5, 0) + bytes([b])


def close(slot):
    return cmd(6, slot)


def s(b):
    return struct.pack(">I", len(b)) + b


def frame(op, payload):
    return bytes([op]) + struct.pack(">I", len(payload)) + payload


def set_(k, v):
    return frame(SET, s(k) + s(v))


def get(k, timeout_ms):
    return frame(GET, struct.pack(">Q", timeout_ms) + s(k))


def get_unless(k, unless, timeout_ms):
    return frame(GET_UNLESS, struct.pack(">Q", timeout_ms) + s(k) + s(unless))


def add(k, d):
    return frame(ADD, s(k) + struct.pack(">q", d))


def wait(keys, timeout_ms):
    return frame(WAIT, struct.pack(">QI", timeout_ms, len(keys)) + b"".join(s(k) for k in keys))


def check(keys):
    return frame(CHECK, struct.pack(">I", len(keys)) + b"".join(s(k) for k in keys))


def plain_hello():
    return struct.pack(">IHHI", MAGIC, VERSION, 0, 0)


def sessions(token):
    flags = bytes([1 if token else 0])
    base = hello(0) + (prove(0) if token else b"")
    both = base + hello(1) + (prove(1) if token else b"")
    yield "requests", flags + base + feed(0, set_(b"k", b"v") + get(b"k", 0) + add(b"n", 5) +
                                           add(b"n", -7) + check([b"k", b"n"]) +
                                           wait([b"k", b"n"], 10))
    yield "parked", flags + both + feed(1, get(b"later", 60000)) + feed(
        1, wait([b"a", b"b"], 60000)) + feed(0, set_(b"later", b"x") + set_(b"a", b"1") +
                                              set_(b"b", b"2"))
    yield "unless", flags + both + feed(1, get_unless(b"key", b"mark", 60000) + get_unless(
        b"k2", b"m2", 60000)) + feed(0, set_(b"mark", b"failed") + set_(b"k2", b"v") +
                                    get_unless(b"key", b"mark", 0) + get_unless(b"x", b"y", 5)) + advance(3)
    yield "timeout", flags + both + feed(1, get(b"never", 500) + wait([b"x"], 2000)) + advance(
        10) + advance(20) + advance(30)
    yield "bad_add", flags + base + feed(0, set_(b"c", b"abc") + add(b"c", 1) + add(
        b"m", 2**62) + add(b"m", 2**62))
    yield "pipelined", flags + base + feed(0, set_(b"p", b"1") + get(b"p", 5) + check([]))
    yield "trickle", flags + b"".join(feed(2, bytes([b])) + advance(3) for b in plain_hello())
    yield "reconnect", flags + base + close(0) + hello(0) + (prove(0) if token else b"") + feed(
        0, get(b"k", 0))
    # Clients with RINGREDUCE_ENCRYPT=psk (auth 2, a nonce) and tls (auth 4): refused with the
    # store's mode (TcpStoreProtocol's is off).
    yield "encrypted_hello", flags + feed(0, struct.pack(">IHHI", MAGIC, VERSION, 2, 32) + bytes(
        32)) + feed(1, struct.pack(">IHHI", MAGIC, VERSION, 4, 0))
    if not token:
        yield "raw_hello", flags + feed(0, plain_hello() + set_(b"r", b"raw"))


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_store")
    os.makedirs(out, exist_ok=True)
    for token in (False, True):
        for name, data in sessions(token):
            path = os.path.join(out, ("token_" if token else "plain_") + name)
            with open(path, "wb") as f:
                f.write(data)
    print("wrote", len(os.listdir(out)), "seeds to", out, file=sys.stderr)


if __name__ == "__main__":
    main()
