"""kcp-go's packet layer around KCP segments, sans-I/O: encryption, checksum, FEC framing.

A datagram as kcp-go (``ListenWithOptions`` / ``DialWithOptions`` with a
block crypt and 10 data + 3 parity shards, as Go rpcx uses it) sends it::

    [nonce 16 random][crc32 IEEE LE of what follows, 4]        crypto header
    [FEC seqid u32 LE][flag u16 LE: 0xf1 data, 0xf2 parity]    FEC header
    [size u16 LE = 2 + len(segments)][KCP segments ...]        data shard

The whole datagram, nonce included, is encrypted with the block cipher in CFB
mode with kcp-go's fixed IV (the random nonce is what makes two datagrams
with equal contents differ). With no shards configured there is no FEC
header; kcp-go's "none" block crypt keeps the crypto header in clear.

Parity is neither sent nor used: KCP retransmits what is lost. The data
shards are numbered as kcp-go's encoder numbers them, skipping the parity
seqids of each group, so that a Go decoder sees complete groups of data
shards and frees them at once.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

try:  # CFB lives among cryptography's "decrepit" modes since 47
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
except ImportError:  # pragma: no cover - older cryptography
    from cryptography.hazmat.primitives.ciphers.modes import CFB  # type: ignore[assignment,no-redef]

from rpc.transport.errors import KcpPacketError

NONCE_SIZE = 16
CRC_SIZE = 4
CRYPT_HEADER = NONCE_SIZE + CRC_SIZE
FEC_HEADER = 6
FEC_HEADER_PLUS2 = FEC_HEADER + 2
FEC_DATA, FEC_PARITY = 0xF1, 0xF2
#: kcp-go's initial vector of its CFB mode (crypt.go ``initialVector``)
IV = bytes([167, 115, 79, 156, 18, 172, 27, 1, 164, 21, 242, 193, 252, 120, 230, 107])
#: the passphrase and salt of rpcx's KCP examples (pbkdf2-sha1, 4096 iterations, 32 bytes)
RPCX_KEY, RPCX_SALT = "rpcx-key", "rpcx-salt"
PBKDF2_ITERATIONS = 4096
_FEC = struct.Struct("<IHH")


def derive_key(passphrase: str, salt: str = RPCX_SALT) -> bytes:
    """The AES-256 key rpcx's examples derive: ``pbkdf2.Key(pass, salt, 4096, 32, sha1.New)``."""
    return hashlib.pbkdf2_hmac("sha1", passphrase.encode(), salt.encode(), PBKDF2_ITERATIONS, 32)


@dataclass(kw_only=True, frozen=True, slots=True)
class KcpCrypt:
    """The block crypt both sides must share: ``aes`` with a 16, 24 or 32-byte
    key (kcp-go's ``NewAESBlockCrypt``) or ``none`` (``NewNoneBlockCrypt``:
    checksummed, not encrypted). Other kcp-go ciphers are not available."""

    #: ``aes`` or ``none``
    cipher: str = "aes"
    #: the AES key (16, 24 or 32 bytes); empty for ``none``
    key: bytes = field(default=b"", repr=False)
    _aes: Any = field(default=None, init=False, repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        if self.cipher == "aes" and len(self.key) not in (16, 24, 32):
            raise ValueError(f"KCP AES key of {len(self.key)} bytes: expected 16, 24 or 32")
        if self.cipher not in ("aes", "none"):
            raise ValueError(f"KCP cipher {self.cipher!r}: expected aes or none")
        if self.cipher == "aes":  # built once: each datagram only starts a new encryptor from the IV
            object.__setattr__(self, "_aes", Cipher(algorithms.AES(self.key), CFB(IV)))

    def __getstate__(self) -> tuple[str, bytes]:  # picklable for the bench's client processes
        return (self.cipher, self.key)

    def __setstate__(self, state: tuple[str, bytes]) -> None:
        object.__setattr__(self, "cipher", state[0])
        object.__setattr__(self, "key", state[1])
        object.__setattr__(self, "_aes", None)
        self.__post_init__()

    @classmethod
    def from_passphrase(cls, passphrase: str = RPCX_KEY, salt: str = RPCX_SALT) -> KcpCrypt:
        return cls(cipher="aes", key=derive_key(passphrase, salt))

    def encrypt(self, data: bytes) -> bytes:
        if self.cipher == "none":
            return data
        enc = self._aes.encryptor()
        return enc.update(data) + enc.finalize()

    def decrypt(self, data: bytes) -> bytes:
        if self.cipher == "none":
            return data
        dec = self._aes.decryptor()
        return dec.update(data) + dec.finalize()


class PacketCodec:
    """Wraps KCP payloads into datagrams and unwraps them, for one session
    (the FEC sequence numbers are per session). ``data_shards`` and
    ``parity_shards`` must match the peer's (rpcx: 10 and 3); 0 for either
    means no FEC header, as in kcp-go."""

    def __init__(self, crypt: KcpCrypt, data_shards: int = 10, parity_shards: int = 3) -> None:
        if data_shards < 0 or parity_shards < 0 or data_shards + parity_shards > 255:
            raise ValueError(f"KCP shards {data_shards}+{parity_shards}: expected 0..255 in all")
        self.crypt = crypt
        self.fec = data_shards > 0 and parity_shards > 0
        self._data = data_shards
        self._group = data_shards + parity_shards
        self._paws = (0xFFFFFFFF // self._group) * self._group if self.fec else 0
        self._next = 0
        # the nonce only makes equal datagrams differ (the IV is fixed): it needs to be unpredictable,
        # not secret, so a generator seeded from the OS saves a system call per datagram
        self._nonce = random.Random(os.urandom(16))
        #: bytes of headers before the KCP segments (what KcpSession must reserve)
        self.overhead = CRYPT_HEADER + (FEC_HEADER_PLUS2 if self.fec else 0)

    def encode(self, segments: bytes) -> bytes:
        """One datagram carrying ``segments`` (a KcpSession output)."""
        if self.fec:
            body = _FEC.pack(self._next, FEC_DATA, len(segments) + 2) + segments
            self._next += 1
            if self._next % self._group == self._data:  # the parity seqids we do not send
                self._next = (self._next + self._group - self._data) % self._paws
        else:
            body = segments
        plain = self._nonce.randbytes(NONCE_SIZE) + zlib.crc32(body).to_bytes(4, "little") + body
        return self.crypt.encrypt(plain)

    def decode(self, datagram: bytes) -> bytes | None:
        """The KCP segments of a datagram, ``None`` for a parity shard (not
        used); ``KcpPacketError`` for anything that is not a datagram of ours."""
        if len(datagram) < CRYPT_HEADER:
            raise KcpPacketError(f"KCP datagram of {len(datagram)} bytes: shorter than its crypto header")
        plain = self.crypt.decrypt(datagram)
        body = plain[CRYPT_HEADER:]
        if zlib.crc32(body) != int.from_bytes(plain[NONCE_SIZE:CRYPT_HEADER], "little"):
            raise KcpPacketError("KCP datagram with a bad checksum (another key or a damaged datagram)")
        if not self.fec:
            return body
        if len(body) < FEC_HEADER_PLUS2:
            raise KcpPacketError(f"KCP datagram of {len(body)} bytes after its checksum: shorter than an FEC header")
        _seqid, flag, size = _FEC.unpack_from(body)
        if flag == FEC_PARITY:
            return None
        if flag != FEC_DATA:
            raise KcpPacketError(f"KCP datagram with FEC flag {flag:#x}: expected 0xf1 or 0xf2")
        if not 2 <= size <= len(body) - FEC_HEADER:
            raise KcpPacketError(f"KCP data shard announcing {size} bytes in {len(body) - FEC_HEADER}")
        return body[FEC_HEADER_PLUS2:FEC_HEADER + size]


def first_segment(segments: bytes) -> tuple[int, int, int, int] | None:
    """``(conv, cmd, sn, una)`` of the first segment, or ``None`` if there is
    no whole header: what a listener looks at to open a session."""
    if len(segments) < 24:
        return None
    conv, cmd, _frg, _wnd, _ts, sn, una = struct.unpack_from("<IBBHIII", segments)
    return conv, cmd, sn, una
