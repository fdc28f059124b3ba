"""The ``--kcp-*`` flags of the rpc commands: the block crypt and shards of
``kcp@host:port`` addresses (rpc/transport/kcpchannel.py), which both ends
must share, as Go rpcx's ``kcp`` build tag does."""

from __future__ import annotations

import argparse
from typing import Any

NEEDS_CRYPT = ("KCP needs a block crypt shared with the peer, as Go rpcx does: give --kcp-key PASSPHRASE "
               "(rpcx's examples use rpcx-key), --kcp-key-hex HEX or --kcp-crypt none")


def add_kcp_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KCP (kcp@host:port addresses)")
    g.add_argument("--kcp-key", metavar="PASSPHRASE",
                   help="AES key derived as rpcx's examples do: pbkdf2-sha1(PASSPHRASE, --kcp-salt, 4096, 32); "
                        "rpcx's examples use rpcx-key")
    g.add_argument("--kcp-salt", default="rpcx-salt", metavar="SALT", help="salt of --kcp-key [%(default)s]")
    g.add_argument("--kcp-key-hex", metavar="HEX", help="the AES key itself: 16, 24 or 32 bytes in hex")
    g.add_argument("--kcp-crypt", choices=("aes", "none"), default="aes",
                   help="aes, or none (kcp-go's NewNoneBlockCrypt: checksummed, NOT encrypted) [%(default)s]")
    g.add_argument("--kcp-data-shards", type=int, default=10, metavar="N",
                   help="FEC data shards, as the peer's (Go rpcx: 10) [%(default)s]")
    g.add_argument("--kcp-parity-shards", type=int, default=3, metavar="N",
                   help="FEC parity shards, as the peer's (Go rpcx: 3; none are sent) [%(default)s]")
    g.add_argument("--kcp-idle-timeout", type=float, default=300.0, metavar="S",
                   help="drop a KCP session that hears nothing that long [%(default)s]")
    g.add_argument("--kcp-stream", action="store_true",
                   help="send in stream mode (writes packed into full segments); Go peers read either mode")


def uses_kcp(address: str | None) -> bool:
    return bool(address) and str(address).startswith(("kcp@", "kcp://"))


def kcp_options(args: argparse.Namespace, *, required: bool) -> Any:
    """The ``KcpOptions`` of the flags, or None when no key is given and
    ``required`` is false; raises ValueError (one line for the user) for
    flags that do not make a block crypt."""
    from rpc.transport.kcp import KcpSettings
    from rpc.transport.kcpchannel import KcpOptions
    from rpc.transport.kcpwire import KcpCrypt

    if args.kcp_crypt == "none":
        if args.kcp_key or args.kcp_key_hex:
            raise ValueError("--kcp-crypt none takes no key: drop --kcp-key / --kcp-key-hex")
        crypt = KcpCrypt(cipher="none")
    elif args.kcp_key and args.kcp_key_hex:
        raise ValueError("give --kcp-key or --kcp-key-hex, not both")
    elif args.kcp_key:
        crypt = KcpCrypt.from_passphrase(args.kcp_key, args.kcp_salt)
    elif args.kcp_key_hex:
        try:
            key = bytes.fromhex(args.kcp_key_hex)
        except ValueError as exc:
            raise ValueError(f"--kcp-key-hex: not hexadecimal ({exc})") from None
        if len(key) not in (16, 24, 32):
            raise ValueError(f"--kcp-key-hex: {len(key)} bytes, expected 16, 24 or 32 (AES-128/192/256)")
        crypt = KcpCrypt(key=key)
    elif required:
        raise ValueError(NEEDS_CRYPT)
    else:
        return None
    if not (0 <= args.kcp_data_shards <= 255 and 0 <= args.kcp_parity_shards <= 255):
        raise ValueError("--kcp-data-shards and --kcp-parity-shards: expected 0..255")
    if args.kcp_idle_timeout <= 0:
        raise ValueError("--kcp-idle-timeout must be > 0")
    return KcpOptions(crypt=crypt, data_shards=args.kcp_data_shards, parity_shards=args.kcp_parity_shards,
                      settings=KcpSettings(stream=args.kcp_stream), idle_timeout=args.kcp_idle_timeout)
