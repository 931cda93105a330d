//! TLS for the agent's HTTP server (`--tls-cert-file`, `--tls-key-file`): applies carry private
//! keys, so they should not cross the network in clear.
//!
//! Owns loading a PEM certificate chain and private key into a rustls server configuration
//! (aws-lc-rs provider, TLS 1.2 and 1.3, HTTP/1.1 by ALPN). It must never serve anything itself nor
//! log key material.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::AgentError;

/// A TLS acceptor for `cert_file` (PEM chain, leaf first) and `key_file` (PEM private key).
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<tokio_rustls::TlsAcceptor, AgentError> {
    let bad = |what: &str, p: &Path, e: &dyn std::fmt::Display| AgentError::Tls(format!("{what} {}: {e}", p.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| bad("read certificates", cert_file, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad("parse certificates", cert_file, &e))?;
    if certs.is_empty() {
        return Err(AgentError::Tls(format!("no certificate in {}", cert_file.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| bad("read private key", key_file, &e))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| AgentError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| AgentError::Tls(format!("certificate and key do not fit: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_empty_files_are_clear_errors() {
        let d = tempfile::tempdir().unwrap();
        let e = acceptor(&d.path().join("nope.pem"), &d.path().join("nope.key")).err().unwrap();
        assert!(e.to_string().contains("nope.pem"), "{e}");
        std::fs::write(d.path().join("empty.pem"), b"").unwrap();
        let e = acceptor(&d.path().join("empty.pem"), &d.path().join("nope.key")).err().unwrap();
        assert!(e.to_string().contains("no certificate"), "{e}");
    }
}
