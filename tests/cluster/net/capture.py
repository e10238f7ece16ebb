#!/usr/bin/env python3
"""A passive reader of the namespace hosts' links, and what it can do with what it read (test_capture.sh).

  capture.py capture OUT.pcap IFACE...      every frame of each interface (AF_PACKET, both ways) into a pcap file,
                                            until SIGTERM; prints "capturing" once the sockets are bound
  capture.py find PCAP NEEDLES.json         each needle ({"name": hex}) searched in every frame and in every TCP
                                            stream reassembled: prints "found NAME" / "absent NAME"; exit 1 when a
                                            needle marked secret (name not starting with "control:") was found
  capture.py flows PCAP                     the TCP connections seen: "SRC:PORT > DST:PORT first last bytes"
  capture.py stream PCAP SRC DST DPORT T0 T1 OUT
                                            the client's and the server's bytes of every connection from SRC to
                                            DST:DPORT opened (SYN) between T0 and T1 (unix seconds): OUT.N.c, OUT.N.s
  capture.py messages STREAM.c...           how many SP messages the client sent in those streams
  capture.py keys RUN.json SECRETFILE       the needles of a grpod journal snapshot (see main)
  capture.py replay HOST PORT STREAM.c [STREAM.s]
                                            the client's messages of STREAM.c sent again on a fresh connection, one
                                            at a time, each answer printed ("answer N: challenge|sealed|reply TEXT");
                                            with STREAM.s, whether the first challenge is a fresh one
No third-party module: the standard library only.
"""
import hashlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003


def capture(out, ifaces):
    socks = []
    for name in ifaces:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.bind((name, 0))
        socks.append(s)
    f = open(out, "wb")
    f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))  # pcap, Ethernet
    f.flush()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print("capturing", flush=True)
    while not stop:
        try:
            ready, _, _ = select.select(socks, [], [], 0.2)
        except InterruptedError:
            continue
        for s in ready:
            try:
                frame = s.recv(262144)
            except BlockingIOError:
                continue
            t = time.time()
            f.write(struct.pack("<IIII", int(t), int((t % 1) * 1e6), len(frame), len(frame)) + frame)
        f.flush()
    f.close()


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    off = 24
    while off + 16 <= len(data):
        sec, usec, incl, _ = struct.unpack_from("<IIII", data, off)
        off += 16
        yield sec + usec / 1e6, data[off:off + incl]
        off += incl


def tcp_of(frame):
    """(src, sport, dst, dport, seq, flags, payload) of an IPv4 TCP frame, else None."""
    if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 15) * 4
    total = struct.unpack_from(">H", ip, 2)[0]
    if ip[9] != 6 or len(ip) < ihl + 20:
        return None
    src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
    tcp = ip[ihl:total if total else len(ip)]
    sport, dport, seq = struct.unpack_from(">HHI", tcp, 0)
    doff = (tcp[12] >> 4) * 4
    return src, sport, dst, dport, seq, tcp[13], tcp[doff:]


def streams(path):
    """{(src, sport, dst, dport): {"syn": time or None, "first": t, "last": t, "segs": {seq: payload}}}"""
    out = {}
    for t, fr in frames(path):
        p = tcp_of(fr)
        if not p:
            continue
        src, sport, dst, dport, seq, flags, payload = p
        k = (src, sport, dst, dport)
        s = out.setdefault(k, {"syn": None, "first": t, "last": t, "segs": {}, "isn": None})
        s["last"] = t
        if flags & 0x02:  # SYN
            s["syn"] = t if s["syn"] is None else s["syn"]
            s["isn"] = seq
        if payload and len(payload) > len(s["segs"].get(seq, b"")):
            s["segs"][seq] = payload
    return out


def assemble(s):
    """The stream's bytes in order (duplicates, as seen on two links, once)."""
    if not s["segs"]:
        return b""
    base = s["isn"] + 1 if s["isn"] is not None else min(s["segs"])
    buf = bytearray()
    for seq in sorted(s["segs"], key=lambda q: (q - base) % (1 << 32)):
        off = (seq - base) % (1 << 32)
        p = s["segs"][seq]
        if off > len(buf):  # a gap: a frame not captured; keep what follows apart
            buf += b"\0" * (off - len(buf))
        buf[off:off + len(p)] = p
    return bytes(buf)


def find(path, needles_file):
    needles = {k: bytes.fromhex(v) for k, v in json.load(open(needles_file)).items()}
    blobs = [fr for _, fr in frames(path)] + [assemble(s) for s in streams(path).values()]
    bad = 0
    for name, n in sorted(needles.items()):
        forms = {n, n.hex().encode(), n.hex().upper().encode()}
        hit = any(f in b for b in blobs for f in forms if f)
        print(("found " if hit else "absent ") + name)
        if hit and not name.startswith("control:"):
            bad = 1
    return bad


def flows(path):
    for (src, sport, dst, dport), s in sorted(streams(path).items(), key=lambda kv: kv[1]["first"]):
        print("%s:%d > %s:%d %.3f %.3f %d" % (src, sport, dst, dport, s["first"], s["last"], len(assemble(s))))


def stream(path, src, dst, dport, t0, t1, out):
    all_ = streams(path)
    n = 0
    for (s_, sport, d_, dp), s in sorted(all_.items(), key=lambda kv: kv[1]["first"]):
        if s_ != src or d_ != dst or dp != dport or s["syn"] is None or not t0 <= s["syn"] <= t1 or not s["segs"]:
            continue  # (a connection that carried nothing: a client's probe that the endpoint listens)
        back = all_.get((d_, dp, s_, sport))
        with open("%s.%d.c" % (out, n), "wb") as f:
            f.write(assemble(s))
        with open("%s.%d.s" % (out, n), "wb") as f:
            f.write(assemble(back) if back else b"")
        n += 1
    print(n)


def sp_messages(data, header=True):
    """The SP messages of one side's bytes: the 8-byte protocol header, then [8-byte length][body] each."""
    off, out = (8 if header else 0), []
    while off + 8 <= len(data):
        n = struct.unpack_from(">Q", data, off)[0]
        if off + 8 + n > len(data):
            break
        out.append(data[off + 8:off + 8 + n])
        off += 8 + n
    return out


def pb_fields(buf):
    """Top-level protobuf fields: [(number, value)] (varints as ints, length-delimited as bytes)."""
    out, off = [], 0

    def varint():
        nonlocal off
        v, shift = 0, 0
        while True:
            b = buf[off]
            off += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v

    try:
        while off < len(buf):
            key = varint()
            num, wt = key >> 3, key & 7
            if wt == 0:
                out.append((num, varint()))
            elif wt == 2:
                n = varint()
                out.append((num, buf[off:off + n]))
                off += n
            elif wt == 1:
                off += 8
            elif wt == 5:
                off += 4
            else:
                break
    except IndexError:
        pass
    return out


def describe(body):
    """'challenge NONCEHEX', 'sealed', 'reply ERROR', or 'other' of an answer (backtrace stripped)."""
    env = dict(pb_fields(body))
    if 28 in env:
        ch = dict(pb_fields(env[28]))
        return "challenge " + ch.get(1, b"").hex()
    if 29 in env:
        return "sealed"
    if 16 in env:
        r = dict(pb_fields(env[16]))
        return "reply %s%s" % (r.get(2, b"").decode("utf-8", "replace"), " (reauth)" if r.get(5) else "")
    return "other"


def recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b


def replay(host, port, cfile, sfile=None):
    msgs = sp_messages(open(cfile, "rb").read())
    captured_challenge = None
    if sfile:
        for m in sp_messages(open(sfile, "rb").read()):
            d = describe(m[4:])
            if d.startswith("challenge "):
                captured_challenge = d
                break
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"\x00SP\x00\x00\x30\x00\x00")
    recvn(s, 8)
    for i, m in enumerate(msgs):
        bt = 4  # the request id word (a direct REQ peer sends one)
        s.sendall(struct.pack(">Q", len(m)) + m)
        try:
            n = struct.unpack(">Q", recvn(s, 8))[0]
            a = recvn(s, n)
        except (EOFError, socket.timeout, ConnectionResetError) as e:
            print("answer %d: none (%s)" % (i, type(e).__name__), flush=True)
            return
        d = describe(a[bt:])
        print("answer %d: %s" % (i, d), flush=True)
        if d.startswith("challenge ") and captured_challenge is not None:
            print("challenge: %s" % ("fresh" if d != captured_challenge else "the captured one"), flush=True)


def main():
    cmd = sys.argv[1]
    if cmd == "capture":
        capture(sys.argv[2], sys.argv[3:])
    elif cmd == "find":
        sys.exit(find(sys.argv[2], sys.argv[3]))
    elif cmd == "flows":
        flows(sys.argv[2])
    elif cmd == "stream":
        stream(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]),
               sys.argv[8])
    elif cmd == "messages":
        print(sum(len(sp_messages(open(f, "rb").read())) for f in sys.argv[2:]))
    elif cmd == "replay":
        replay(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    elif cmd == "keys":
        # keys RUN.json SECRETFILE: the needles of a journal snapshot: the run key, each worker's process key (its
        # identity under the run key, protocol 1.12's derivation) and the secret, as JSON {name: hex}
        run = json.load(open(sys.argv[2]))["run"]
        workers = json.load(open(sys.argv[2])).get("workers", [])
        key = bytes.fromhex(run["plane_key"])
        epoch = int(run.get("plane_epoch", "1"), 16)
        out = {"run key (epoch %d)" % epoch: key.hex()}
        for w in workers:
            if not w:
                continue
            msg = b"grpo plane key 2" + struct.pack("<IIQQ", w["rank"] & 0xFFFFFFFF, w["pid"] & 0xFFFFFFFF,
                                                    int(w["incarnation"], 16), epoch)
            out["rank %d's key (epoch %d)" % (w["rank"], epoch)] = hashlib.blake2b(
                msg, key=key, digest_size=32).hexdigest()
        out["the secret"] = open(sys.argv[3], "rb").read().split(b"\n")[0].strip().hex()
        json.dump(out, sys.stdout)
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
