#!/usr/bin/env python3
"""A man in the middle for cluster.sh's mitm case (issue 45): a transparent TCP relay in a host's
namespace. nftables there sends the host's connections to one peer host to this relay (DNAT in the
output hook); the relay finds where each was going (SO_ORIGINAL_DST), connects there itself (its
own packets marked so that the rule lets them through), and passes bytes on both ways. On one
direction (DIRECTION, below) it reads the encrypted data connection's layout (the hello, with
ENCRYPT=tls the TLS handshake, then records: a 16-byte header with the plaintext length, the
record magic "RRE1" and the sequence number, the ciphertext, a 16-byte tag;
transport/tcp/secure_channel.h) and does one thing to one record of the first connection whose
records begin:

  flip     flips one bit of record K's ciphertext
  replay   sends record K twice
  drop     leaves record K out
  reorder  sends record K+1 before record K

What comes before the records depends on ENCRYPT (RINGREDUCE_ENCRYPT): psk, the hellos with the
token's proof (transport/tcp/handshake.h); tls, bare hellos, then a TLS 1.3 handshake with
certificates and both sides' close_notify (core/tls_keys.h), whose TLS records (a 5-byte header:
type 20-23, version 3.x, length) pass untouched; the first 16 bytes that carry the record magic
at bytes 4..8 begin ours, and only those are counted.

Which direction it tampers with (DIRECTION): c2s, the connector's bytes to the acceptor (after
the connector's hello: Hello, then with psk its nonce and proof), or s2c, the acceptor's to the
connector (after its answer: Hello, then with psk its proof); so that the same traffic can be
reached whichever end connected.

Usage: mitm_relay.py MODE LISTEN_ADDR LISTEN_PORT K MARK READY_FILE DIRECTION ENCRYPT
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
HELLO = 32
HELLO_MAGIC = 0x31485252  # "RRH1"
# What follows a Hello: psk, the connector's nonce and proof, the acceptor's proof; tls, nothing.
AUTH_BYTES = {"psk": {"c2s": 32 + 32, "s2c": 32}, "tls": {"c2s": 0, "s2c": 0}}
RECORD_HEADER = 16
RECORD_MAGIC = 0x31455252  # "RRE1"
TAG = 16
TLS_HEADER = 5

mode, listen_addr, listen_port, target_k, mark, ready, direction, encrypt = sys.argv[1:9]
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


def tls_handshake(src, dst):
    """tls: the TLS records before ours, passed on untouched. Returns the 16 bytes that follow
    them (the header of our first record, if all is well) and how many TLS records went by; None
    for the bytes if the connection ended first."""
    records = 0
    while time.monotonic() < deadline:
        head = recv_exact(src, TLS_HEADER)
        if head is None:
            return None, records
        tls = 20 <= head[0] <= 23 and head[1] == 3 and head[2] <= 4
        length = struct.unpack("!H", head[3:5])[0]
        # A record of ours can look like a TLS header in its first 5 bytes (a plaintext length of
        # 788-791 bytes), but then its "length" (the magic's first byte) is 82: reading on to 16
        # bytes stays inside the TLS record either way, and the magic decides.
        if not tls or length >= RECORD_HEADER - TLS_HEADER:
            rest = recv_exact(src, RECORD_HEADER - TLS_HEADER)
            if rest is None:
                return None, records
            head += rest
            if not tls or struct.unpack_from("<I", head, 4)[0] == RECORD_MAGIC:
                return head, records
            length -= RECORD_HEADER - TLS_HEADER
        body = recv_exact(src, length)
        if body is None:
            return None, records
        dst.sendall(head + body)
        records += 1
    return None, records


def tamper(src, dst):
    """One direction: the hello (and with tls the TLS handshake), then record by record,
    tampering with record K."""
    try:
        # Only data connections (their Hello's magic, "RRH1"): the control plane's pass untouched.
        magic = recv_exact(src, 4)
        if magic is None:
            return shut(src, dst)
        if struct.unpack("<I", magic)[0] != HELLO_MAGIC:
            dst.sendall(magic)
            return pump(src, dst)
        # The Hello on its own first: an acceptor's answer that refuses a crossing connection is a
        # bare Hello, then the close.
        hello = recv_exact(src, HELLO - 4)
        if hello is None:
            return shut(src, dst)
        dst.sendall(magic + hello)
        auth = recv_exact(src, AUTH_BYTES[encrypt][direction])
        if auth is None:
            return shut(src, dst)
        dst.sendall(auth)
        tls_records = 0
        if encrypt == "tls":
            header, tls_records = tls_handshake(src, dst)
        else:
            header = recv_exact(src, RECORD_HEADER)
        if header is None:
            return shut(src, dst)
        if struct.unpack_from("<I", header, 4)[0] != RECORD_MAGIC:
            print(f"mitm: not a record after the handshake: {header.hex()}", flush=True)
            dst.sendall(header)
            return pump(src, dst)
        # The first connection whose records begin is the one tampered with.
        with lock:
            mine = not done.is_set()
            if mine:
                done.set()
        if not mine:
            dst.sendall(header)
            return pump(src, dst)
        if encrypt == "tls":
            print(f"mitm: {tls_records} TLS records passed untouched before the first record",
                  flush=True)
        held = None
        k = 0
        while time.monotonic() < deadline:
            if header is None:
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
            header = None
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
