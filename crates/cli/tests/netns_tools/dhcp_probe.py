#!/usr/bin/env python3
"""A DHCP client that says what it is told: sends the requests named in argv[1] (JSON) from
UDP port 68 and prints every reply that arrives within argv[2] seconds as one JSON object a
line. The requests are DHCP packets laid out as RFC 2131 says, with the options a PXE client
(or a plain client) sends; the replies are decoded as far as the test needs.

Request fields: xid, mac ("aa:bb:.."), type (1 DISCOVER, 3 REQUEST), class (option 60 or
null), arch (option 93 or null), user_class (option 77 or null), to ("IP:PORT"), count.
"""
import json
import socket
import struct
import sys
import time


def packet(r):
    mac = bytes(int(x, 16) for x in r["mac"].split(":"))
    b = bytes([1, 1, 6, 0]) + struct.pack(">I", r["xid"]) + struct.pack(">HH", 0, 0x8000)
    b += b"\0" * 16 + mac + b"\0" * 10 + b"\0" * 192 + bytes([99, 130, 83, 99])
    opts = [(53, bytes([r["type"]]))]
    if r.get("class"):
        opts.append((60, r["class"].encode()))
    if r.get("arch") is not None:
        opts.append((93, struct.pack(">H", r["arch"])))
    if r.get("user_class"):
        opts.append((77, r["user_class"].encode()))
    opts.append((55, bytes([1, 3, 6, 43, 60, 66, 67])))
    for code, value in opts:
        b += bytes([code, len(value)]) + value
    return (b + b"\xff").ljust(300, b"\0")


def decode(b, src):
    if len(b) < 240 or b[236:240] != bytes([99, 130, 83, 99]):
        return {"from": src, "malformed": True}
    opts, i = {}, 240
    while i < len(b) and b[i] != 255:
        if b[i] == 0:
            i += 1
            continue
        code, n = b[i], b[i + 1]
        opts[code] = b[i + 2:i + 2 + n]
        i += 2 + n
    return {
        "from": src,
        "xid": struct.unpack(">I", b[4:8])[0],
        "yiaddr": socket.inet_ntoa(b[16:20]),
        "siaddr": socket.inet_ntoa(b[20:24]),
        "file": b[108:236].split(b"\0")[0].decode(errors="replace"),
        "type": opts.get(53, b"\0")[0],
        "class": opts.get(60, b"").decode(errors="replace"),
        "server_id": socket.inet_ntoa(opts[54]) if 54 in opts else None,
    }


def main():
    requests = json.loads(sys.argv[1])
    wait = float(sys.argv[2])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    s.bind(("", 68))
    for r in requests:
        host, port = r["to"].rsplit(":", 1)
        for _ in range(r.get("count", 1)):
            s.sendto(packet(r), (host, int(port)))
    end = time.time() + wait
    while True:
        left = end - time.time()
        if left <= 0:
            break
        s.settimeout(left)
        try:
            b, (src, _) = s.recvfrom(2048)
        except socket.timeout:
            break
        print(json.dumps(decode(b, src)), flush=True)


main()
