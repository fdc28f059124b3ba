"""Redis glob patterns (PSUBSCRIBE), matched exactly as Redis's stringmatchlen.

``*`` any run, ``?`` one byte, ``[abc]`` / ``[^abc]`` / ``[a-z]`` classes,
``\\x`` escapes. Redis matches bytes, so patterns and channels are compared as
UTF-8 bytes.

Each (pattern position, channel position) a ``*`` retries from is tried at
most once per match (failures are remembered), so a hostile pattern such as
``*a*a*a*a*a*b`` costs at most len(pattern) × len(channel) steps instead of
exponential time.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["glob_match"]


def glob_match(pattern: str | bytes, channel: str | bytes) -> bool:
    p = pattern.encode() if isinstance(pattern, str) else pattern
    s = channel.encode() if isinstance(channel, str) else channel
    if _literal(p):
        return p == s
    return _match(p, s, 0, 0, 0, set())


@lru_cache(maxsize=4096)
def _literal(p: bytes) -> bool:
    return not any(c in p for c in b"*?[\\")


def _match(p: bytes, s: bytes, pi: int, si: int, depth: int, failed: set[tuple[int, int]]) -> bool:
    """Match p[pi:] against s[si:]; `failed` holds the starts already known not to match."""
    if (pi, si) in failed:
        return False
    if not _match_from(p, s, pi, si, depth, failed):
        failed.add((pi, si))
        return False
    return True


def _match_from(p: bytes, s: bytes, pi: int, si: int, depth: int, failed: set[tuple[int, int]]) -> bool:
    plen, slen = len(p), len(s)
    while pi < plen and si < slen:
        c = p[pi]
        if c == 0x2A:  # '*'
            while pi + 1 < plen and p[pi + 1] == 0x2A:
                pi += 1
            if pi + 1 == plen:
                return True
            if depth > 1000:
                return False
            for k in range(si, slen):
                if _match(p, s, pi + 1, k, depth + 1, failed):
                    return True
            return False
        elif c == 0x3F:  # '?'
            si += 1
        elif c == 0x5B:  # '['
            pi += 1
            negate = pi < plen and p[pi] == 0x5E
            if negate:
                pi += 1
            matched = False
            while True:
                if pi >= plen:  # unterminated class: Redis backs up one
                    pi -= 1
                    break
                pc = p[pi]
                if pc == 0x5C and plen - pi >= 2:  # '\\'
                    pi += 1
                    if p[pi] == s[si]:
                        matched = True
                elif pc == 0x5D:  # ']'
                    break
                elif plen - pi >= 3 and p[pi + 1] == 0x2D:  # a-z
                    lo, hi = p[pi], p[pi + 2]
                    if lo > hi:
                        lo, hi = hi, lo
                    if lo <= s[si] <= hi:
                        matched = True
                    pi += 2
                else:
                    if pc == s[si]:
                        matched = True
                pi += 1
            if negate:
                matched = not matched
            if not matched:
                return False
            si += 1
        else:
            if c == 0x5C and plen - pi >= 2:  # '\\'
                pi += 1
                c = p[pi]
            if c != s[si]:
                return False
            si += 1
        pi += 1
        if si == slen:
            while pi < plen and p[pi] == 0x2A:
                pi += 1
            break
    return pi == plen and si == slen
