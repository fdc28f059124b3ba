"""Write the committed seed corpora of the fuzz targets (corpus/<target>/):
valid inputs of each format, so libFuzzer starts from the shapes real peers
send. Run from the repository with the package installed:

    python rustext/fuzz/seeds.py [SHARED_DIR]

SHARED_DIR (default ../shared beside the checkout) adds the captured rpcx
frames and juggler messages of the protocol vectors when present.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from pathlib import Path

import rustext

HERE = Path(__file__).resolve().parent


def write(target: str, blobs: list[bytes]) -> None:
    out = HERE / "corpus" / target
    out.mkdir(parents=True, exist_ok=True)
    for blob in blobs:
        (out / hashlib.sha1(blob).hexdigest()[:16]).write_bytes(blob)


def deflated(payload: bytes) -> bytes:
    """A permessage-deflate payload (RFC 7692 §7.2.1: sync flush, its 4-byte tail removed)."""
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    return (z.compress(payload) + z.flush(zlib.Z_SYNC_FLUSH))[:-4]


def ws_frame(fin: bool, op: int, payload: bytes, key: bytes = b"\x11\x22\x33\x44", rsv: int = 0) -> bytes:
    n = len(payload)
    head = bytes(((0x80 if fin else 0) | rsv | op,))
    if n < 126:
        head += bytes((0x80 | n,))
    elif n < 65536:
        head += bytes((0x80 | 126,)) + n.to_bytes(2, "big")
    else:
        head += bytes((0x80 | 127,)) + n.to_bytes(8, "big")
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def main() -> None:
    shared = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[2] / "shared"
    messages = [
        b'{"meta":{"uuid":"d11bff91-58fb-4e20-87ca-8c221fccbb49","type":0},"payload":'
        b'{"uri":"test.echo","timeout":5000,"args":"hello"}}',
        b'{"meta":{"uuid":"982ea198-679c-4ab2-a0a5-6f9626821755","type":1},"payload":{"channel":"news","args":{"a":[1,2.5e3,true,null]}}}',
        b'{"meta":{"uuid":"982ea198-679c-4ab2-a0a5-6f9626821755","type":2},"payload":{"channel":"n*","pattern":true}}',
        b'{"a":"\\u00e9\\ud83d\\ude00","b":-0.0e-0}',
    ]
    transcript = shared / "vectors" / "juggler" / "transcript.jsonl"
    if transcript.exists():
        for line in transcript.read_text().splitlines():
            try:
                frame = json.loads(line).get("frame")
            except ValueError:
                continue  # a capture line cut short
            if isinstance(frame, str) and frame.startswith("{"):
                messages.append(frame.encode())
    write("juggler_json", messages)

    # headers before the selector: limit byte, cut byte, then the frames
    text = messages[0]
    frames = [
        ws_frame(True, 1, text),
        ws_frame(False, 1, text[:10]) + ws_frame(True, 9, b"ping") + ws_frame(True, 0, text[10:]),
        ws_frame(True, 1, "€ and ✓".encode()) + ws_frame(True, 8, b"\x03\xe8bye"),
        ws_frame(True, 1, b"x" * 300) + ws_frame(True, 10, b""),
    ]
    write("wsframe", [bytes((limit, cut)) + f for f in frames for limit, cut in ((0, 0), (2, 3))])
    # permessage-deflate on (the cut byte's high bit): compressed messages, whole and
    # fragmented, beside plain ones; a small frame that inflates past the limit
    z = deflated(text)
    bomb = deflated(b"a" * 100_000)
    compressed = [
        ws_frame(True, 1, z, rsv=0x40) + ws_frame(True, 1, text),
        ws_frame(False, 1, z[:5], rsv=0x40) + ws_frame(True, 9, b"p") + ws_frame(True, 0, z[5:]),
        ws_frame(True, 1, bomb, rsv=0x40),
    ]
    write("wsframe", [bytes((limit, cut)) + f for f in compressed for limit, cut in ((0, 0x80), (2, 0x83))])

    rpcx = [
        rustext.encode_rpcx_request(1, b'{"A":10,"B":20}', service_path="Arith", service_method="Mul", serialize_type=1),
        rustext.encode_rpcx_request(7, b"\x82\xa1A\x01\xa1B\x02", service_path="Arith", service_method="Add",
                                    metadata=[("__AUTH", "token"), ("k", "v")], serialize_type=3),
    ]
    vectors = shared / "vectors" / "rpcx" / "frames.json"
    if vectors.exists():
        rpcx += [bytes.fromhex(v["frame_hex"]) for v in json.loads(vectors.read_text()) if v.get("frame_hex")]
    write("rpcx_codec", [bytes((cut,)) + b"".join(rpcx[:3]) for cut in (0, 5)] + [b"\x00" + f for f in rpcx])

    # the balancer's HTTP/1 requests (the fast path, and the differential against hyper)
    http = [
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /x?y=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: a:80\r\nContent-Length: 5\r\nX-User: bob\r\n\r\nhello",
        b"HEAD /h HTTP/1.1\r\nHost: [::1]:8080\r\nX-Forwarded-For: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\n\r\n",
        b"DELETE /d HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /second HTTP/1.1\r\nHost: a\r\n\r\n",
    ]
    write("h1_request", http)
    write("h1_differential", http)

    # seq's gRPC messages: framed, and bare protobuf of the RRAPI messages
    def grpc_frame(msg: bytes) -> bytes:
        return b"\x00" + len(msg).to_bytes(4, "big") + msg
    protos = [b"\x0a\x03seq\x10\x64", b"\x08\x01\x10\x64", b"\x0a\x01a", b"\x08\xff\xff\x03", b"\x08\x01", b""]
    write("grpc_codec", protos + [grpc_frame(p) for p in protos] + [b"5S", b"100m", b"abc%20def"])

    # a QUIC client's first datagrams (aioquic, HTTP/3), each behind its 2-byte length
    write("quic_datagram", [b"".join(len(d).to_bytes(2, "big") + d for d in grams) for grams in quic_hellos()])


def quic_hellos() -> list[list[bytes]]:
    """The first flight of an HTTP/3 client, whole and with its Initial cut short."""
    from aioquic.h3.connection import H3_ALPN
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    conn = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                                                          server_name="localhost"))
    conn.connect(("127.0.0.1", 4433), now=0.0)
    first = [d for d, _ in conn.datagrams_to_send(now=0.0)]
    return [first, [first[0][:100]], [first[0], first[0]]]


if __name__ == "__main__":
    main()
