"""kcp-go's packet layer (rpc/transport/kcpwire.py): the CFB encryption
checked against a block-by-block reference written from kcp-go's crypt.go,
the FEC numbering, typed errors for bad datagrams, and a fuzzed decoder."""

from __future__ import annotations

import hashlib
import zlib

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc.transport.errors import KcpPacketError
from rpc.transport.kcpwire import IV, KcpCrypt, PacketCodec, derive_key, first_segment

pytestmark = pytest.mark.timeout(60)


def reference_encrypt(key: bytes, src: bytes) -> bytes:
    """kcp-go's ``encrypt16``: tbl = E(IV); each 16-byte block d = s ^ tbl,
    tbl = E(d); the tail is XORed with the last tbl."""
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    tbl = ecb.update(IV)
    out = bytearray()
    for i in range(0, len(src), 16):
        block = bytes(x ^ y for x, y in zip(src[i:i + 16], tbl))
        out += block
        if len(block) == 16:
            tbl = ecb.update(block)
    return bytes(out)


def test_aes_is_kcp_gos_cfb_with_its_fixed_iv() -> None:
    key = derive_key("rpcx-key")
    crypt = KcpCrypt(key=key)
    for n in (0, 1, 15, 16, 17, 100, 1400):
        plain = bytes(range(256)) * 6
        plain = plain[:n]
        assert crypt.encrypt(plain) == reference_encrypt(key, plain)
        assert crypt.decrypt(crypt.encrypt(plain)) == plain


def test_the_key_is_rpcx_examples_pbkdf2() -> None:
    assert derive_key("rpcx-key", "rpcx-salt") == hashlib.pbkdf2_hmac("sha1", b"rpcx-key", b"rpcx-salt", 4096, 32)
    assert KcpCrypt.from_passphrase().key == derive_key("rpcx-key")
    with pytest.raises(ValueError, match="16, 24 or 32"):
        KcpCrypt(key=b"short")
    with pytest.raises(ValueError, match="aes or none"):
        KcpCrypt(cipher="salsa20", key=b"k" * 32)


@pytest.mark.parametrize("cipher", ["aes", "none"])
@pytest.mark.parametrize("shards", [(10, 3), (0, 0)])
def test_round_trip(cipher: str, shards: tuple[int, int]) -> None:
    crypt = KcpCrypt(cipher=cipher, key=b"k" * 32 if cipher == "aes" else b"")
    tx, rx = PacketCodec(crypt, *shards), PacketCodec(crypt, *shards)
    assert tx.overhead == (28 if shards[0] else 20)
    for payload in (b"x" * 24, b"segments" * 100):
        dgram = tx.encode(payload)
        assert len(dgram) == len(payload) + tx.overhead
        assert rx.decode(dgram) == payload
    a, b = tx.encode(b"y" * 30), tx.encode(b"y" * 30)
    assert a != b  # the random nonce


def test_data_shards_skip_the_parity_seqids() -> None:
    codec = PacketCodec(KcpCrypt(cipher="none"), 10, 3)
    seqids = [int.from_bytes(codec.encode(b"z" * 24)[20:24], "little") for _ in range(25)]
    assert seqids == [*range(10), *range(13, 23), *range(26, 31)]
    plain = codec.encode(b"z" * 24)
    assert plain[24:26] == b"\xf1\x00" and int.from_bytes(plain[26:28], "little") == 26


def _datagram(body: bytes, crypt: KcpCrypt) -> bytes:
    return crypt.encrypt(b"n" * 16 + zlib.crc32(body).to_bytes(4, "little") + body)


def test_bad_datagrams_are_typed_errors_and_parity_is_skipped() -> None:
    crypt = KcpCrypt(key=b"k" * 32)
    codec = PacketCodec(crypt)
    assert codec.decode(_datagram(b"\x0a\0\0\0\xf2\0" + b"p" * 40, crypt)) is None
    with pytest.raises(KcpPacketError, match="FEC flag"):
        codec.decode(_datagram(b"\0\0\0\0\xf3\0\x1a\0" + b"s" * 24, crypt))
    with pytest.raises(KcpPacketError, match="announcing"):
        codec.decode(_datagram(b"\0\0\0\0\xf1\0\xff\0" + b"s" * 24, crypt))
    with pytest.raises(KcpPacketError, match="checksum"):
        PacketCodec(KcpCrypt(key=b"o" * 32)).decode(codec.encode(b"s" * 24))
    with pytest.raises(KcpPacketError, match="crypto header"):
        codec.decode(b"tiny")
    with pytest.raises(KcpPacketError, match="FEC header"):
        codec.decode(_datagram(b"\0\0", crypt))


def test_first_segment() -> None:
    assert first_segment(b"\x01\0\0\0\x51\0\x20\0" + b"\0" * 4 + b"\x05\0\0\0\x07\0\0\0" + b"\0" * 4) == (1, 81, 5, 7)
    assert first_segment(b"short") is None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=1500), st.sampled_from(["aes", "none"]), st.booleans())
def test_garbage_is_a_typed_error_never_another_exception(data: bytes, cipher: str, fec: bool) -> None:
    codec = PacketCodec(KcpCrypt(cipher=cipher, key=b"k" * 16 if cipher == "aes" else b""), *((10, 3) if fec else (0, 0)))
    try:
        out = codec.decode(data)
    except KcpPacketError:
        return
    assert out is None or isinstance(out, bytes)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=2, max_size=600))
def test_valid_checksum_with_garbage_inside_is_still_typed(body: bytes) -> None:
    crypt = KcpCrypt(cipher="none")
    try:
        PacketCodec(crypt).decode(_datagram(body, crypt))
    except KcpPacketError:
        pass
