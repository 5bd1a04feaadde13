#!/usr/bin/env python3
"""A man in the middle for cluster.sh's mitm case (issue 45): a transparent TCP relay in a host's
namespace. nftables there sends the host's connections to one peer host to this relay (DNAT in the
output hook); the relay finds where each was going (SO_ORIGINAL_DST), connects there itself (its
own packets marked so that the rule lets them through), and passes bytes on both ways. On the
connector-to-acceptor direction it reads the encrypted data connection's layout (the hello with
the token's nonce and proof, then records: a 16-byte header with the plaintext length, the
ciphertext, a 16-byte tag; transport/tcp/secure_channel.h) and does one thing to one record of
the first connection that gets that far:

  flip     flips one bit of record K's ciphertext
  replay   sends record K twice
  drop     leaves record K out
  reorder  sends record K+1 before record K

Which direction it tampers with (DIRECTION): c2s, the connector's bytes to the acceptor (after
the connector's hello: Hello, nonce, proof), or s2c, the acceptor's to the connector (after its
answer: Hello, proof); so that the same traffic can be reached whichever end connected.

Usage: mitm_relay.py MODE LISTEN_ADDR LISTEN_PORT K MARK READY_FILE DIRECTION
Bounded: it exits after 120 s whatever happens.
"""
import os
import select
import socket
import struct
import sys
import threading
import time

SO_ORIGINAL_DST = 80
SO_MARK = 36
# The connector's hello (Hello, its nonce, its proof: with a token), the acceptor's (Hello, proof).
HELLO_BYTES = {"c2s": 32 + 32 + 32, "s2c": 32 + 32}
RECORD_HEADER = 16
TAG = 16

mode, listen_addr, listen_port, target_k, mark, ready, direction = sys.argv[1:8]
listen_port, target_k, mark = int(listen_port), int(target_k), int(mark, 0)
done = threading.Event()  # one connection tampered with: the others pass untouched
lock = threading.Lock()
deadline = time.monotonic() + 120


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def shut(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pump(src, dst):
    """Bytes from src to dst until either closes."""
    try:
        while time.monotonic() < deadline:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    shut(src, dst)


def tamper(src, dst):
    """One direction: the hello, then record by record, tampering with record K."""
    try:
        # Only data connections (their Hello's magic, "RRH1"): the control plane's pass untouched.
        magic = recv_exact(src, 4)
        if magic is None:
            return
        if struct.unpack("<I", magic)[0] != 0x31485252:
            dst.sendall(magic)
            return pump(src, dst)
        hello = recv_exact(src, HELLO_BYTES[direction] - 4)
        if hello is None:
            return
        dst.sendall(magic + hello)
        with lock:
            mine = not done.is_set()
            if mine:
                done.set()
        if not mine:
            return pump(src, dst)
        held = None
        k = 0
        while time.monotonic() < deadline:
            header = recv_exact(src, RECORD_HEADER)
            if header is None:
                break
            nbytes, magic, seq = struct.unpack("<IIQ", header)
            body = recv_exact(src, nbytes + TAG)
            if body is None:
                break
            record = header + body
            if k == target_k:
                print(f"mitm: {mode} on record {k} (sequence {seq}, {nbytes} bytes)", flush=True)
                if mode == "flip":
                    b = bytearray(record)
                    b[RECORD_HEADER + nbytes // 2] ^= 0x04
                    dst.sendall(bytes(b))
                elif mode == "replay":
                    dst.sendall(record)
                    dst.sendall(record)
                elif mode == "drop":
                    pass
                elif mode == "reorder":
                    held = record
            elif held is not None:
                dst.sendall(record)
                dst.sendall(held)
                held = None
            else:
                dst.sendall(record)
            k += 1
    except OSError:
        pass
    shut(src, dst)


def serve(client):
    raw = client.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, ip = struct.unpack("!2xH4s8x", raw)
    upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    upstream.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
    upstream.settimeout(10)
    try:
        upstream.connect((socket.inet_ntoa(ip), port))
    except OSError as e:
        print(f"mitm: cannot reach {socket.inet_ntoa(ip)}:{port}: {e}", flush=True)
        client.close()
        return
    upstream.settimeout(None)
    c2s, s2c = (tamper, pump) if direction == "c2s" else (pump, tamper)
    threading.Thread(target=c2s, args=(client, upstream), daemon=True).start()
    threading.Thread(target=s2c, args=(upstream, client), daemon=True).start()


def main():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((listen_addr, listen_port))
    srv.listen(64)
    with open(ready, "w") as f:
        f.write("ready\n")
    while time.monotonic() < deadline:
        r, _, _ = select.select([srv], [], [], 1.0)
        if r:
            client, _ = srv.accept()
            serve(client)
    os._exit(0)


main()
