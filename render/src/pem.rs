//! Secrets to certificate files: a Secret's `tls.crt`, `tls.key` and `ca.crt` reach the render
//! only as the blocks parsed from them, re-encoded.
//!
//! Owns reading PEM (with `rustls-pki-types`), checking each certificate (with `x509-parser`:
//! one DER certificate per block, nothing after it, its notAfter), checking that the key is
//! the leaf certificate's, and writing fresh PEM: base64 of the parsed DER in 64-character
//! lines, the chain first, then the key. Text around or between the blocks (comments, a Lua
//! chunk) is dropped, and a block of another kind than the one expected refuses the Secret.
//! Every refusal is a [`PemError`]. It must never copy a byte of a Secret into a file other
//! than through this re-encoding, and never read the clock: expiry is reported as notAfter,
//! the caller compares it with its own clock. Pure.

use std::sync::Arc;

use base64::Engine as _;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{PemObject, SectionKind};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a Secret's certificate data is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    /// The key's bytes hold no PEM block, or a block that does not decode.
    #[error("{key} is not PEM{}", if .why.is_empty() { String::new() } else { format!(" ({})", .why) })]
    NotPem {
        /// The Secret's data key.
        key: String,
        /// The PEM reader's words, empty when there was no block at all.
        why: String,
    },
    /// A block of a kind that does not belong in this key (a private key in `tls.crt`, …).
    #[error("{key} holds a {kind} block where only {expected} belongs")]
    UnexpectedBlock {
        /// The Secret's data key.
        key: String,
        /// The block's kind.
        kind: String,
        /// What belongs there.
        expected: &'static str,
    },
    /// No CERTIFICATE block.
    #[error("{key} holds no certificate")]
    NoCertificate {
        /// The Secret's data key.
        key: String,
    },
    /// A CERTIFICATE block that is not one X.509 certificate.
    #[error("{key}: certificate {index} does not parse: {why}")]
    BadCertificate {
        /// The Secret's data key.
        key: String,
        /// Its position in the chain, from 0 (the leaf).
        index: usize,
        /// The parser's words.
        why: String,
    },
    /// No private key block.
    #[error("tls.key holds no private key")]
    NoKey,
    /// More than one private key block.
    #[error("tls.key holds more than one private key")]
    TwoKeys,
    /// A key of a kind or form that cannot be loaded.
    #[error("tls.key is not a usable private key: {0}")]
    BadKey(String),
    /// The key is not the leaf certificate's (or cannot be compared with it).
    #[error("tls.key does not match the certificate in tls.crt")]
    KeyMismatch,
}

/// One parsed certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCert {
    /// Its DER.
    pub der: Vec<u8>,
    /// notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// A certificate file's content and what the renderer may tell about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFile {
    /// The re-encoded PEM: certificates (then the key, for a certificate with its key).
    pub pem: Vec<u8>,
    /// The earliest notAfter of its certificates (seconds since the Unix epoch): past it, a
    /// client that checks the chain refuses it.
    pub not_after: i64,
}

/// Whether `not_after` lies before `now` (both in seconds since the Unix epoch). An expired
/// certificate is still written (as ingress-nginx serves it); a status may warn.
pub fn expired(not_after: i64, now: i64) -> bool {
    not_after < now
}

/// Every PEM block of `bytes` (its kind and DER), in order; text outside blocks is skipped.
fn blocks(key: &str, bytes: &[u8]) -> Result<Vec<(SectionKind, Vec<u8>)>, PemError> {
    let out: Vec<(SectionKind, Vec<u8>)> = <(SectionKind, Vec<u8>)>::pem_slice_iter(bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| PemError::NotPem { key: key.into(), why: e.to_string() })?;
    if out.is_empty() {
        return Err(PemError::NotPem { key: key.into(), why: String::new() });
    }
    Ok(out)
}

/// The certificates of `bytes` (the Secret's data key `key`): CERTIFICATE blocks only, each one
/// X.509 certificate, at least one.
pub fn certificates(key: &str, bytes: &[u8]) -> Result<Vec<ParsedCert>, PemError> {
    let mut out = Vec::new();
    for (kind, der) in blocks(key, bytes)? {
        if kind != SectionKind::Certificate {
            let kind = format!("{kind:?}");
            return Err(PemError::UnexpectedBlock { key: key.into(), kind, expected: "CERTIFICATE blocks" });
        }
        let index = out.len();
        let bad = |why: String| PemError::BadCertificate { key: key.into(), index, why };
        let (rest, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| bad(e.to_string()))?;
        if !rest.is_empty() {
            return Err(bad(format!("{} bytes after the certificate", rest.len())));
        }
        let not_after = cert.validity().not_after.timestamp();
        out.push(ParsedCert { der, not_after });
    }
    if out.is_empty() {
        return Err(PemError::NoCertificate { key: key.into() });
    }
    Ok(out)
}

/// The one private key of `tls.key`: PKCS#8, PKCS#1 (RSA) or SEC1 (EC). Blocks of other kinds
/// (an `EC PARAMETERS` block as OpenSSL writes it) are dropped; a certificate there refuses.
pub fn private_key(bytes: &[u8]) -> Result<PrivateKeyDer<'static>, PemError> {
    let mut keys = Vec::new();
    for (kind, der) in blocks("tls.key", bytes)? {
        let k = match kind {
            SectionKind::PrivateKey => PrivateKeyDer::Pkcs8(der.into()),
            SectionKind::RsaPrivateKey => PrivateKeyDer::Pkcs1(der.into()),
            SectionKind::EcPrivateKey => PrivateKeyDer::Sec1(der.into()),
            other => {
                let kind = format!("{other:?}");
                return Err(PemError::UnexpectedBlock { key: "tls.key".into(), kind, expected: "one private key" });
            }
        };
        keys.push(k);
    }
    match keys.len() {
        0 => Err(PemError::NoKey),
        1 => Ok(keys.remove(0)),
        _ => Err(PemError::TwoKeys),
    }
}

/// Checks that `key` is the private key of `leaf`.
///
/// Chosen: rustls's [`CertifiedKey::keys_match`] over the aws-lc-rs provider (the one crypto
/// stack the workspace already builds for kube and the agent's TLS). It derives the public key
/// from the private key, as a SubjectPublicKeyInfo, and compares it with the leaf's
/// SubjectPublicKeyInfo: no signature is made and no hand-written ASN.1 is needed. A key whose
/// public half cannot be derived is refused (not compared is not matched).
fn check_pair(leaf: &[u8], key: &PrivateKeyDer<'static>) -> Result<(), PemError> {
    let signer =
        rustls::crypto::aws_lc_rs::sign::any_supported_type(key).map_err(|e| PemError::BadKey(e.to_string()))?;
    let certified = CertifiedKey::new(vec![CertificateDer::from(leaf.to_vec())], Arc::clone(&signer));
    certified.keys_match().map_err(|_| PemError::KeyMismatch)
}

/// Fresh PEM of one block: `label` armour around base64 of `der` in 64-character lines.
pub fn encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        // Base64 is ASCII.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The PEM label of a key's form.
fn key_label(key: &PrivateKeyDer<'_>) -> &'static str {
    match key {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        _ => "PRIVATE KEY",
    }
}

/// The certificates of `chain`, re-encoded, and their earliest notAfter.
fn encode_chain(chain: &[ParsedCert]) -> CertFile {
    let pem: String = chain.iter().map(|c| encode("CERTIFICATE", &c.der)).collect();
    let not_after = chain.iter().map(|c| c.not_after).min().unwrap_or(i64::MIN);
    CertFile { pem: pem.into_bytes(), not_after }
}

/// A certificate chain with its key (HAProxy's `crt` file) from a Secret's `tls.crt` and
/// `tls.key`: checked and re-encoded, the chain first.
pub fn certified(crt: &[u8], key: &[u8]) -> Result<CertFile, PemError> {
    let chain = certificates("tls.crt", crt)?;
    let k = private_key(key)?;
    check_pair(&chain[0].der, &k)?;
    let mut out = encode_chain(&chain);
    out.pem.extend_from_slice(encode(key_label(&k), k.secret_der()).as_bytes());
    Ok(out)
}

/// A CA bundle (HAProxy's `ca-file`) from a Secret's `key`: its certificates only, re-encoded.
pub fn ca_bundle(key: &str, bytes: &[u8]) -> Result<CertFile, PemError> {
    Ok(encode_chain(&certificates(key, bytes)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `host` and its key, both PEM.
    fn pair(host: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![host.to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    /// The PEM blocks of a file, as (label, DER).
    fn parsed(pem: &[u8]) -> Vec<(SectionKind, Vec<u8>)> {
        blocks("file", pem).unwrap()
    }

    #[test]
    fn a_good_pair_is_re_encoded_chain_then_key() {
        let (crt, key) = pair("a.example");
        let (ca, _) = pair("ca.example");
        let chain = format!("{crt}{ca}");
        let out = certified(chain.as_bytes(), key.as_bytes()).unwrap();
        let text = String::from_utf8(out.pem.clone()).unwrap();
        assert!(text.lines().all(|l| l.len() <= 64), "{text}");
        let kinds: Vec<SectionKind> = parsed(&out.pem).into_iter().map(|(k, _)| k).collect();
        assert_eq!(kinds, [SectionKind::Certificate, SectionKind::Certificate, SectionKind::PrivateKey]);
        // The same DER as the input's blocks.
        assert_eq!(parsed(&out.pem)[..2], parsed(chain.as_bytes())[..]);
        assert_eq!(parsed(&out.pem)[2], parsed(key.as_bytes())[0]);
        // rcgen's default validity ends in 4096.
        assert!(out.not_after > 4_000_000_000 && !expired(out.not_after, 1_800_000_000), "{}", out.not_after);
        assert!(expired(out.not_after, out.not_after + 1));
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let (crt, _) = pair("a.example");
        let (_, other) = pair("b.example");
        assert_eq!(certified(crt.as_bytes(), other.as_bytes()), Err(PemError::KeyMismatch));
        // Nor does the chain's second certificate's key do.
        let (ca, ca_key) = pair("ca.example");
        assert_eq!(certified(format!("{crt}{ca}").as_bytes(), ca_key.as_bytes()), Err(PemError::KeyMismatch));
    }

    #[test]
    fn text_around_and_between_blocks_never_reaches_the_file() {
        let (crt, key) = pair("a.example");
        let (ca, _) = pair("ca.example");
        let lua = "core.register_service('x', 'http', function(applet) os.execute('id') end)\n--[[\n";
        let hostile_crt = format!("{lua}{crt}-- ]] {lua}\n{ca}{lua}");
        let hostile_key = format!("{lua}{key}{lua}");
        let out = certified(hostile_crt.as_bytes(), hostile_key.as_bytes()).unwrap();
        let text = String::from_utf8(out.pem).unwrap();
        assert!(!text.contains("core") && !text.contains("--[[") && !text.contains("]]"), "{text}");
        let clean = certified(format!("{crt}{ca}").as_bytes(), key.as_bytes()).unwrap();
        assert_eq!(text.as_bytes(), clean.pem, "only the re-encoded blocks");
        assert!(text
            .lines()
            .all(|l| l.starts_with("-----") || l.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))));
    }

    #[test]
    fn a_missing_or_doubled_half_is_refused_by_kind() {
        let (crt, key) = pair("a.example");
        let (_, key2) = pair("b.example");
        // Key only: tls.crt holds a key.
        assert!(matches!(certified(key.as_bytes(), key.as_bytes()), Err(PemError::UnexpectedBlock { .. })));
        // Certificate only: tls.key holds a certificate.
        assert!(matches!(certified(crt.as_bytes(), crt.as_bytes()), Err(PemError::UnexpectedBlock { .. })));
        assert_eq!(certified(crt.as_bytes(), b""), Err(PemError::NotPem { key: "tls.key".into(), why: String::new() }));
        assert_eq!(certified(crt.as_bytes(), format!("{key}{key2}").as_bytes()), Err(PemError::TwoKeys));
        assert_eq!(certified(b"", key.as_bytes()), Err(PemError::NotPem { key: "tls.crt".into(), why: String::new() }));
    }

    #[test]
    fn garbage_is_refused() {
        let (crt, key) = pair("a.example");
        let junk = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(certified(junk.as_bytes(), key.as_bytes()), Err(PemError::BadCertificate { index: 0, .. })));
        let bad_b64 = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(matches!(certified(bad_b64.as_bytes(), key.as_bytes()), Err(PemError::NotPem { .. })));
        let unterminated = "-----BEGIN CERTIFICATE-----\nAAAA\n";
        assert!(matches!(certified(unterminated.as_bytes(), key.as_bytes()), Err(PemError::NotPem { .. })));
        let bad_key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(matches!(certified(crt.as_bytes(), bad_key.as_bytes()), Err(PemError::BadKey(_))));
        assert!(matches!(certified(b"lua code", key.as_bytes()), Err(PemError::NotPem { .. })));
    }

    #[test]
    fn a_ca_bundle_is_certificates_only() {
        let (ca, key) = pair("ca.example");
        let out = ca_bundle("ca.crt", format!("# comment\n{ca}").as_bytes()).unwrap();
        assert_eq!(parsed(&out.pem), parsed(ca.as_bytes()));
        assert!(matches!(ca_bundle("ca.crt", format!("{ca}{key}").as_bytes()), Err(PemError::UnexpectedBlock { .. })));
    }
}
