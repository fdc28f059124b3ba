use super::*;

/// `openssl req -x509 ... -set_serial 0x1234ABCD -multivalue-rdn
/// -subj "/C=DE/O=Example, Inc./OU=ops\+dev/CN=admin alice+UID=42/emailAddress=a@example.com"
/// -addext "subjectAltName=DNS:alice.example,email:a@example.com,IP:192.0.2.7,URI:spiffe://example/alice"`
const ALICE: &[u8] = include_bytes!("alice.der");

fn all_names() -> CertHeaders {
    let n = |s: &'static str| Some(HeaderName::from_static(s));
    CertHeaders {
        subject: n("x-ssl-client-dn"),
        fingerprint: n("x-ssl-client-sha256"),
        verified: n("x-ssl-client-verify"),
        serial: n("x-ssl-client-serial"),
        san: n("x-ssl-client-san"),
    }
}

fn header<'a>(c: &'a ClientCert, name: &str) -> Option<&'a str> {
    c.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.to_str().unwrap())
}

#[test]
fn the_identity_reads_as_openssl_prints_it() {
    let c = ClientCert::new(ALICE, |_| vec![0xab, 0x01], &all_names());
    // `openssl x509 -noout -subject -nameopt RFC2253`
    let dn = "emailAddress=a@example.com,CN=admin alice+UID=42,OU=ops\\+dev,O=Example\\, Inc.,C=DE";
    assert_eq!(c.subject, dn);
    assert_eq!(header(&c, "x-ssl-client-dn"), Some(dn));
    assert_eq!(header(&c, "x-ssl-client-sha256"), Some("ab01"));
    assert_eq!(header(&c, "x-ssl-client-verify"), Some("SUCCESS"));
    assert_eq!(header(&c, "x-ssl-client-serial"), Some("1234ABCD"));
    assert_eq!(
        header(&c, "x-ssl-client-san"),
        Some("DNS:alice.example, email:a@example.com, IP:192.0.2.7, URI:spiffe://example/alice")
    );
}

#[test]
fn only_the_configured_headers_are_prepared() {
    let names = CertHeaders { verified: Some(HeaderName::from_static("x-v")), ..Default::default() };
    let c = ClientCert::new(ALICE, |_| panic!("no fingerprint asked"), &names);
    assert_eq!(c.headers.len(), 1);
    assert!(!c.subject.is_empty(), "the subject is kept for routing");
}

#[test]
fn escaping_follows_rfc_4514() {
    let mut s = String::new();
    escape("#a b ", &mut s);
    assert_eq!(s, "\\#a b\\ ");
    s.clear();
    escape(" x\"y;<>\u{1}\n", &mut s);
    assert_eq!(s, "\\ x\\\"y\\;\\<\\>\\01\\0A");
}

#[test]
fn an_unknown_attribute_is_an_oid_and_hex() {
    // SET { SEQ { OID 1.2.3.4, PrintableString "x" } }
    let name = [0x31, 0x0a, 0x30, 0x08, 0x06, 0x03, 0x2a, 0x03, 0x04, 0x13, 0x01, b'x'];
    assert_eq!(rfc4514(&name).as_deref(), Some("1.2.3.4=#130178"));
    assert_eq!(dotted(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d]).as_deref(), Some("1.2.840.113549"));
    assert_eq!(dotted(&[0x2a, 0x86]), None, "a truncated arc");
}

#[test]
fn malformed_der_gives_no_value_and_never_panics() {
    // every truncation and every single-byte corruption of a real certificate
    for n in 0..ALICE.len() {
        let _ = ClientCert::new(&ALICE[..n], |_| Vec::new(), &all_names());
        for x in [0x00, 0x7f, 0x80, 0x84, 0xff] {
            let mut b = ALICE.to_vec();
            b[n] = x;
            let _ = ClientCert::new(&b, |_| Vec::new(), &all_names());
        }
    }
    assert!(parse(&ALICE[..ALICE.len() - 1]).is_none());
    let c = ClientCert::new(b"", |_| Vec::new(), &all_names());
    assert_eq!(c.subject, "");
    assert_eq!(header(&c, "x-ssl-client-dn"), None);
    // a length of more than four bytes, a high tag number
    assert!(tlv(&[0x30, 0x85, 1, 1, 1, 1, 1]).is_none());
    assert!(tlv(&[0x1f, 0x01, 0x00]).is_none());
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
        let _ = ClientCert::new(&b, |_| Vec::new(), &all_names());
        let _ = rfc4514(&b);
        let _ = san_text(&b);
        let _ = dotted(&b);
    }
}
