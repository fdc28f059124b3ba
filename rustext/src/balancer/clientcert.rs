//! The verified client certificate of a TLS connection (mutual TLS): its
//! identity as HAProxy's `ssl_c_*` fetches give it, computed once per
//! connection after the handshake, for the request headers that pass it on
//! to backends and for the routes that test it.
//!
//! rustls has verified the certificate (chain, validity, key usage) before
//! this module sees it; it only reads the subject, serial number and
//! subjectAltName out of the DER. The reader is still strict: any malformed
//! length or tag gives no value rather than a guess.

use std::fmt::Write;

use http::{HeaderName, HeaderValue};

/// Which request headers carry the identity to backends (each None: not sent).
/// Fields of these names coming from the client are always removed first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertHeaders {
    /// The subject DN, an RFC 4514 string (`CN=alice,O=Example,C=DE`).
    pub subject: Option<HeaderName>,
    /// Lower-case hex SHA-256 of the certificate's DER.
    pub fingerprint: Option<HeaderName>,
    /// `SUCCESS` (nginx's `$ssl_client_verify`); absent without a certificate.
    pub verified: Option<HeaderName>,
    /// Upper-case hex of the serial number's bytes as encoded.
    pub serial: Option<HeaderName>,
    /// The subjectAltName entries, `DNS:a.example, email:x@example, URI:..., IP:...`.
    pub san: Option<HeaderName>,
}

impl CertHeaders {
    /// The names configured, for the listeners to remove from requests.
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> {
        [&self.subject, &self.fingerprint, &self.verified, &self.serial, &self.san].into_iter().flatten()
    }

    pub fn is_empty(&self) -> bool {
        self.names().next().is_none()
    }
}

/// A connection's verified client certificate.
#[derive(Debug, Default)]
pub struct ClientCert {
    /// RFC 4514 subject DN (empty if the certificate could not be read).
    pub subject: String,
    /// The request headers to add, per [`CertHeaders`].
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl ClientCert {
    /// The identity of the leaf certificate `der`; `sha256` hashes (the TLS
    /// provider's), `names` says which headers to prepare.
    pub fn new(der: &[u8], sha256: impl FnOnce(&[u8]) -> Vec<u8>, names: &CertHeaders) -> Self {
        let parsed = parse(der);
        let subject = parsed.as_ref().and_then(|p| rfc4514(p.subject)).unwrap_or_default();
        let mut headers = Vec::new();
        let mut push = |name: &Option<HeaderName>, value: Option<String>| {
            if let (Some(n), Some(v)) = (name, value) {
                if let Ok(v) = HeaderValue::from_str(&v) {
                    headers.push((n.clone(), v));
                }
            }
        };
        push(&names.subject, Some(subject.clone()).filter(|s| !s.is_empty()));
        push(&names.fingerprint, names.fingerprint.as_ref().map(|_| hex(&sha256(der), false)));
        push(&names.verified, Some("SUCCESS".to_owned()));
        push(&names.serial, parsed.as_ref().map(|p| hex(p.serial, true)));
        push(&names.san, parsed.as_ref().and_then(|p| p.san).map(san_text).filter(|s| !s.is_empty()));
        ClientCert { subject, headers }
    }
}

fn hex(b: &[u8], upper: bool) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = if upper { write!(s, "{x:02X}") } else { write!(s, "{x:02x}") };
    }
    s
}

/// One DER element: (tag, contents, what follows). Definite lengths only.
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    if tag & 0x1f == 0x1f {
        return None; // high tag numbers never occur in a certificate
    }
    let (&l0, mut b) = b.split_first()?;
    let len = if l0 < 0x80 {
        l0 as usize
    } else {
        let n = (l0 & 0x7f) as usize;
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n].iter().fold(0usize, |a, &x| (a << 8) | x as usize);
        b = &b[n..];
        len
    };
    (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

/// `tlv` expecting `tag`.
fn expect(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    tlv(b).filter(|(t, ..)| *t == tag).map(|(_, c, r)| (c, r))
}

struct Parsed<'a> {
    serial: &'a [u8],
    /// The subject Name's contents (a sequence of RDN sets).
    subject: &'a [u8],
    /// The subjectAltName extension's GeneralNames contents.
    san: Option<&'a [u8]>,
}

const SEQ: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const SAN_OID: &[u8] = &[0x55, 0x1d, 0x11];

fn parse(der: &[u8]) -> Option<Parsed<'_>> {
    let (cert, _) = expect(der, SEQ)?;
    let (mut tbs, _) = expect(cert, SEQ)?;
    if tbs.first() == Some(&0xa0) {
        tbs = tlv(tbs)?.2; // version
    }
    let (serial, rest) = expect(tbs, 0x02)?;
    let (_, rest) = expect(rest, SEQ)?; // signature algorithm
    let (_, rest) = expect(rest, SEQ)?; // issuer
    let (_, rest) = expect(rest, SEQ)?; // validity
    let (subject, mut rest) = expect(rest, SEQ)?;
    let (_, r) = expect(rest, SEQ)?; // subjectPublicKeyInfo
    rest = r;
    let mut san = None;
    while let Some((tag, content, r)) = tlv(rest) {
        rest = r;
        if tag != 0xa3 {
            continue; // issuer/subject unique ids
        }
        let (mut exts, _) = expect(content, SEQ)?;
        while !exts.is_empty() {
            let (ext, r) = expect(exts, SEQ)?;
            exts = r;
            let (oid, mut e) = expect(ext, OID)?;
            if e.first() == Some(&0x01) {
                e = tlv(e)?.2; // critical
            }
            if oid == SAN_OID {
                let (value, _) = expect(e, 0x04)?;
                san = Some(expect(value, SEQ)?.0);
            }
        }
    }
    Some(Parsed { serial, subject, san })
}

/// The short names of RFC 4514 §3 (and `emailAddress`, as OpenSSL and HAProxy print it).
fn short_name(oid: &[u8]) -> Option<&'static str> {
    Some(match oid {
        [0x55, 0x04, 0x03] => "CN",
        [0x55, 0x04, 0x07] => "L",
        [0x55, 0x04, 0x08] => "ST",
        [0x55, 0x04, 0x0a] => "O",
        [0x55, 0x04, 0x0b] => "OU",
        [0x55, 0x04, 0x06] => "C",
        [0x55, 0x04, 0x09] => "STREET",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19] => "DC",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01] => "UID",
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01] => "emailAddress",
        _ => return None,
    })
}

/// An OID in dotted form; None if malformed.
fn dotted(oid: &[u8]) -> Option<String> {
    let mut out = String::new();
    let mut v: u64 = 0;
    let mut first = true;
    for &b in oid {
        if v > (u64::MAX >> 7) {
            return None;
        }
        v = (v << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if first {
                let (a, rest) = if v < 80 { (v / 40, v % 40) } else { (2, v - 80) };
                let _ = write!(out, "{a}.{rest}");
                first = false;
            } else {
                let _ = write!(out, ".{v}");
            }
            v = 0;
        }
    }
    (!first && oid.last().is_some_and(|b| b & 0x80 == 0)).then_some(out)
}

/// A directory string's text (UTF8, Printable, IA5, Teletex as Latin-1, BMP).
fn text(tag: u8, v: &[u8]) -> Option<String> {
    match tag {
        0x0c | 0x13 | 0x16 => String::from_utf8(v.to_vec()).ok(),
        0x14 => Some(v.iter().map(|&b| b as char).collect()),
        0x1e if v.len().is_multiple_of(2) => {
            String::from_utf16(&v.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect::<Vec<_>>()).ok()
        }
        _ => None,
    }
}

/// RFC 4514 §2.4 escaping, and control characters as `\XX` (a header value
/// never carries them).
fn escape(s: &str, out: &mut String) {
    let n = s.chars().count();
    for (i, c) in s.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i + 1 == n => out.push_str("\\ "),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The RFC 4514 string of a Name's contents: the last RDN first, `,`
/// between RDNs, `+` inside one (its values also last first, as OpenSSL's
/// `-nameopt RFC2253`); an unknown type or string kind as the
/// dotted OID and `#` with the hex of the value's DER.
fn rfc4514(name: &[u8]) -> Option<String> {
    let mut rdns = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        let (set, r) = expect(rest, SET)?;
        rest = r;
        let mut parts = Vec::new();
        let mut atvs = set;
        while !atvs.is_empty() {
            let (atv, r) = expect(atvs, SEQ)?;
            atvs = r;
            let (oid, value) = expect(atv, OID)?;
            let (tag, v, _) = tlv(value)?;
            let mut s = String::new();
            match (short_name(oid), text(tag, v)) {
                (Some(short), Some(t)) => {
                    s.push_str(short);
                    s.push('=');
                    escape(&t, &mut s);
                }
                _ => {
                    s.push_str(&dotted(oid)?);
                    s.push_str("=#");
                    s.push_str(&hex(&value[..value.len() - tlv(value)?.2.len()], false));
                }
            }
            parts.push(s);
        }
        parts.reverse(); // as OpenSSL (and so HAProxy) prints a multi-valued RDN
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// `DNS:a.example, email:x@example, URI:https://..., IP:192.0.2.1` (other kinds left out).
fn san_text(names: &[u8]) -> String {
    let mut out = Vec::new();
    let mut rest = names;
    while let Some((tag, v, r)) = tlv(rest) {
        rest = r;
        let entry = match tag {
            0x81 => std::str::from_utf8(v).ok().map(|s| format!("email:{s}")),
            0x82 => std::str::from_utf8(v).ok().map(|s| format!("DNS:{s}")),
            0x86 => std::str::from_utf8(v).ok().map(|s| format!("URI:{s}")),
            0x87 => match v.len() {
                4 => Some(format!("IP:{}", std::net::Ipv4Addr::new(v[0], v[1], v[2], v[3]))),
                16 => <[u8; 16]>::try_from(v).ok().map(|a| format!("IP:{}", std::net::Ipv6Addr::from(a))),
                _ => None,
            },
            _ => None,
        };
        if let Some(e) = entry.filter(|e| e.bytes().all(|b| (0x20..0x7f).contains(&b))) {
            out.push(e);
        }
    }
    out.join(", ")
}

#[cfg(test)]
mod tests;
