"""rustext.tokens: JWT verification on PyJWT with secrets, PEM public keys and
a JWKS (a real local endpoint): every algorithm family, the key fixing the
algorithm, hostile tokens, key rotation and a provider that goes down."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import jwt
import pytest

from rustext.tokens import TokenConfig, TokenError, TokenVerifier, UnknownKey
from tests.jwks import JwksServer, SigningKey

pytestmark = pytest.mark.timeout(60)

CLAIMS = {"sub": "alice"}
SECRET = "a-shared-secret-long-enough-for-hs512-" * 2


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@pytest.mark.parametrize("alg", ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"])
async def test_every_asymmetric_algorithm_through_a_jwks(alg: str) -> None:
    key = SigningKey(alg, kid=f"k-{alg}")
    async with JwksServer([key]) as idp, TokenVerifier(TokenConfig(jwks_url=idp.url)) as v:
        assert v.verify(key.sign(CLAIMS))["sub"] == "alice"


@pytest.mark.parametrize("alg", ["RS256", "PS256", "ES256", "ES384", "EdDSA"])
def test_every_asymmetric_algorithm_with_a_pem_public_key(alg: str, tmp_path: Path) -> None:
    key = SigningKey(alg)
    (tmp_path / "pub.pem").write_bytes(key.public_pem())
    v = TokenVerifier(TokenConfig(public_key=str(tmp_path / "pub.pem")))
    assert v.verify(key.sign(CLAIMS))["sub"] == "alice"


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_shared_secrets(alg: str) -> None:
    v = TokenVerifier(TokenConfig(secret=SECRET))
    assert v.verify(jwt.encode(CLAIMS, SECRET, algorithm=alg))["sub"] == "alice"
    with pytest.raises(TokenError, match="signature"):
        v.verify(jwt.encode(CLAIMS, "another-secret-" * 5, algorithm=alg))


def test_the_key_fixes_the_algorithm(tmp_path: Path) -> None:
    rsa_key = SigningKey("RS256")
    pem = rsa_key.public_pem()
    (tmp_path / "pub.pem").write_bytes(pem)
    v = TokenVerifier(TokenConfig(public_key=str(tmp_path / "pub.pem")))
    # the classic confusion: an HS256 token "signed" with the public key as its secret
    head = b64({"alg": "HS256", "typ": "JWT"})
    body = b64(CLAIMS)
    import hashlib
    import hmac

    sig = base64.urlsafe_b64encode(hmac.new(pem, f"{head}.{body}".encode(), hashlib.sha256).digest()).rstrip(b"=")
    with pytest.raises(TokenError, match="no key verifies HS256"):
        v.verify(f"{head}.{body}.{sig.decode()}")
    # alg none, with or without a signature
    for token in (f"{b64({'alg': 'none'})}.{body}.", f"{b64({'alg': 'None'})}.{body}.eA"):
        with pytest.raises(TokenError, match="not accepted"):
            v.verify(token)
    # an EC token against an RSA key
    with pytest.raises(TokenError):
        v.verify(SigningKey("ES256").sign(CLAIMS))


async def test_a_jwk_alg_narrows_its_key_and_kids_must_match() -> None:
    narrow = SigningKey("RS256", kid="n", jwk_alg=True)
    ec_key = SigningKey("ES256", kid="e")
    async with JwksServer([narrow, ec_key]) as idp, TokenVerifier(TokenConfig(jwks_url=idp.url)) as v:
        assert v.verify(narrow.sign(CLAIMS))["sub"] == "alice"
        with pytest.raises(TokenError, match="does not match its key"):
            v.verify(narrow.sign(CLAIMS, alg="PS256"))
        # a token claiming the EC key's kid but signed RS256
        with pytest.raises(TokenError, match="does not match its key"):
            v.verify(narrow.sign(CLAIMS, kid="e"))


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"exp": -5}, "expired"),  # exp and nbf: seconds from the moment the test runs
        ({"nbf": 600}, "not valid yet"),
        ({"aud": "other"}, "audience"),
        ({"iss": "https://evil.test"}, "issuer"),
        ({"iat": "yesterday"}, "invalid token"),
    ],
)
def test_claims_are_checked(claims: dict, reason: str) -> None:
    v = TokenVerifier(TokenConfig(secret=SECRET, audience="me", issuer="https://idp.test"))
    good = {"aud": "me", "iss": "https://idp.test", "exp": time.time() + 60}
    assert v.verify(jwt.encode(good, SECRET, algorithm="HS256"))["aud"] == "me"
    # relative to now, not to collection: a long suite must not turn "in 10 minutes" into the past
    claims = {k: time.time() + x if k in ("exp", "nbf") else x for k, x in claims.items()}
    with pytest.raises(TokenError, match=reason):
        v.verify(jwt.encode({**good, **claims}, SECRET, algorithm="HS256"))


def test_leeway_and_audience_when_not_configured() -> None:
    v = TokenVerifier(TokenConfig(secret=SECRET, leeway=30))
    assert v.verify(jwt.encode({"exp": time.time() - 5, "aud": "anyone"}, SECRET, algorithm="HS256"))


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "a.b", "....", "e30.e30.", "\x00.\xff.x", "x" * 10_000])
def test_malformed_tokens(token: str) -> None:
    with pytest.raises(TokenError):
        TokenVerifier(TokenConfig(secret=SECRET)).verify(token)


async def test_rotation_unknown_kids_are_fetched_at_most_once_per_interval() -> None:
    k1, k2, k3 = SigningKey("ES256", kid="1"), SigningKey("ES256", kid="2"), SigningKey("RS256", kid="3")
    async with JwksServer([k1]) as idp:
        async with TokenVerifier(TokenConfig(jwks_url=idp.url, jwks_min_interval=3600)) as v:
            assert idp.fetches == 1
            idp.keys = [k1, k2]
            with pytest.raises(UnknownKey):
                v.verify(k2.sign(CLAIMS))
            # refetching is rate-limited: the start fetch was just now
            assert not v.refetch_allowed()
            with pytest.raises(UnknownKey):
                await v.verify_fresh(k2.sign(CLAIMS))
            assert idp.fetches == 1
        async with TokenVerifier(TokenConfig(jwks_url=idp.url, jwks_min_interval=0)) as v:
            idp.keys = [k1, k2, k3]
            assert (await v.verify_fresh(k3.sign(CLAIMS)))["sub"] == "alice"
            # the provider goes down: the keys held stay in use
            idp.status = 503
            with pytest.raises(TokenError, match="HTTP 503"):
                await v.refresh()
            assert v.verify(k1.sign(CLAIMS))["sub"] == "alice"
            assert v.jwks_failures == 1


async def test_an_unreachable_jwks_does_not_stop_the_start() -> None:
    v = TokenVerifier(TokenConfig(jwks_url="http://127.0.0.1:9/jwks.json", jwks_timeout=1))
    await v.start()
    try:
        with pytest.raises(UnknownKey):
            v.verify(SigningKey("ES256", kid="x").sign(CLAIMS))
        assert v.jwks_failures == 1
    finally:
        await v.aclose()


def test_configuration_errors_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no token key"):
        TokenVerifier(TokenConfig())
    with pytest.raises(ValueError, match="nope.pem"):
        TokenVerifier(TokenConfig(public_key=str(tmp_path / "nope.pem")))
    (tmp_path / "bad.pem").write_text("hello")
    with pytest.raises(ValueError, match="not a PEM public key"):
        TokenVerifier(TokenConfig(public_key=str(tmp_path / "bad.pem")))
    with pytest.raises(ValueError, match="http"):
        TokenConfig(jwks_url="ftp://x")
