#!/usr/bin/env python3
"""Cache-aside memcached traffic (text protocol) for pictures.sh, for a bounded time:

  load.py SECONDS --cache HOST:PORT --sessions HOST:PORT[,HOST:PORT...]

cache: through one address (the pool's proxy Service), 4 connections of 300 ops/s each:
get a key drawn from 200,000 with a skew (u**4: a few hot keys, a long tail), on a miss set
it (500-3,000 bytes, far more than the pool holds, so it evicts), 2% deletes.
sessions: keys hashed over the given addresses (the pods, as a client library shards), 2
workers per address of 150 ops/s each (each with a connection to every address):
20,000 keys of 200-1,000 bytes (they fit: a high hit ratio), a hit touched now and then,
a miss set with a 10 minute expiry.
Only the real node's addresses are accepted (its pods' 10.199.0.0/16, the Services'
10.96.0.0/16, see crates/envtest) and loopback: nothing else is ever sent traffic.
"""
import argparse
import ipaddress
import random
import socket
import sys
import threading
import time
import zlib

ALLOWED = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("10.199.0.0/16"), ipaddress.ip_network("10.96.0.0/16")]


def address(s):
    host, port = s.rsplit(":", 1)
    if not any(ipaddress.ip_address(host) in n for n in ALLOWED):
        raise argparse.ArgumentTypeError(f"{host} is not an address of the real node's pods or Services")
    return host, int(port)


class Conn:
    def __init__(self, addr):
        self.addr, self.sock, self.f = addr, None, None

    def call(self, request, value=None):
        if self.sock is None:
            self.sock = socket.create_connection(self.addr, timeout=5)
            self.f = self.sock.makefile("rb")
        self.sock.sendall(request + b"\r\n" + (value + b"\r\n" if value is not None else b""))
        line = self.f.readline()
        if line.startswith(b"VALUE "):
            self.f.read(int(line.split()[3]) + 2)
            line = self.f.readline()  # END
            return b"HIT"
        if not line or b"ERROR" in line:
            raise OSError(line.strip().decode() or "connection closed")
        return line.strip()

    def close(self):
        if self.sock:
            self.sock.close()
        self.sock = None


class Stats:
    def __init__(self):
        self.lock, self.n = threading.Lock(), {}

    def add(self, key):
        with self.lock:
            self.n[key] = self.n.get(key, 0) + 1


def worker(profile, addrs, rate, deadline, stats, seed):
    rnd = random.Random(seed)
    conns = [Conn(a) for a in addrs]
    keys, skew, lo, hi = profile["keys"], profile["skew"], profile["min"], profile["max"]
    pace = time.monotonic()
    while time.monotonic() < deadline:
        pace += 1 / rate
        time.sleep(max(0, pace - time.monotonic()))
        k = int(keys * rnd.random() ** skew)
        key = f"{profile['name']}:{k}".encode()
        conn = conns[zlib.crc32(key) % len(conns)]
        try:
            if rnd.random() < profile["delete"]:
                stats.add((profile["name"], "delete " + conn.call(b"delete " + key).decode()))
                continue
            if conn.call(b"get " + key) == b"HIT":
                stats.add((profile["name"], "hit"))
                if rnd.random() < profile["touch"]:
                    conn.call(b"touch %s %d" % (key, profile["ttl"]))
                continue
            stats.add((profile["name"], "miss"))
            value = bytes([97 + k % 26]) * (lo + k * 7919 % (hi - lo))
            conn.call(b"set %s 0 %d %d" % (key, profile["ttl"], len(value)), value)
        except OSError as e:  # a pod restarting, the proxy reloading: count, reconnect, go on
            stats.add((profile["name"], "error " + type(e).__name__))
            conn.close()
            time.sleep(0.2)
            pace = time.monotonic()


PROFILES = {
    "cache": dict(name="cache", keys=200_000, skew=4, min=500, max=3000, delete=0.02, touch=0, ttl=0,
                  conns=4, rate=300),
    "sessions": dict(name="sessions", keys=20_000, skew=2, min=200, max=1000, delete=0, touch=0.1, ttl=600,
                     conns=2, rate=150),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seconds", type=float)
    ap.add_argument("--cache", type=address, required=True)
    ap.add_argument("--sessions", type=lambda s: [address(a) for a in s.split(",")], required=True)
    a = ap.parse_args()
    deadline = time.monotonic() + a.seconds
    stats, threads, seed = Stats(), [], 0
    for profile, addrs, per in ((PROFILES["cache"], [a.cache], 1), (PROFILES["sessions"], a.sessions, len(a.sessions))):
        for _ in range(profile["conns"] * per):
            seed += 1
            threads.append(threading.Thread(target=worker, daemon=True,
                                            args=(profile, addrs, profile["rate"], deadline, stats, seed)))
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(min(60, max(0.1, deadline - time.monotonic() + 1)))
        with stats.lock:
            print(time.strftime("%H:%M:%S"), dict(sorted((f"{p} {k}", v) for (p, k), v in stats.n.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
