//! TLS for the agent's HTTP server (`--tls-cert-file`, `--tls-key-file`): applies carry private
//! keys, so they should not cross the network in clear.
//!
//! Owns loading a PEM certificate chain and private key into a rustls server configuration
//! (aws-lc-rs provider, TLS 1.2 and 1.3, HTTP/1.1 by ALPN), and taking on changed files without a
//! restart ([`ServingCert::spawn_watch`]: a mounted Secret that cert-manager or the controller
//! renewed; unusable files keep the last good certificate). It must never serve anything itself
//! nor log key material.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::info;

use crate::error::AgentError;

/// The certificate the server presents: the files' last good contents.
#[derive(Debug)]
pub struct ServingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    /// The files' bytes and the key they made.
    current: RwLock<(Vec<u8>, Arc<CertifiedKey>)>,
}

fn read(cert_file: &Path, key_file: &Path) -> Result<Vec<u8>, AgentError> {
    let bad = |p: &Path, e: std::io::Error| AgentError::Tls(format!("read {}: {e}", p.display()));
    let mut bytes = std::fs::read(cert_file).map_err(|e| bad(cert_file, e))?;
    bytes.extend_from_slice(&std::fs::read(key_file).map_err(|e| bad(key_file, e))?);
    Ok(bytes)
}

fn load(cert_file: &Path, key_file: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, AgentError> {
    let bad = |what: &str, p: &Path, e: &dyn std::fmt::Display| AgentError::Tls(format!("{what} {}: {e}", p.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| bad("read certificates", cert_file, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad("parse certificates", cert_file, &e))?;
    if certs.is_empty() {
        return Err(AgentError::Tls(format!("no certificate in {}", cert_file.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| bad("read private key", key_file, &e))?;
    CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| AgentError::Tls(format!("certificate and key do not fit: {e}")))
}

impl ServingCert {
    /// Loads `cert_file` (PEM chain, leaf first) and `key_file` (PEM private key).
    pub fn open(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, AgentError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let bytes = read(cert_file, key_file)?;
        let key = load(cert_file, key_file, &provider)?;
        Ok(Arc::new(Self {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            provider,
            current: RwLock::new((bytes, Arc::new(key))),
        }))
    }

    /// Reads the files again: `Ok(true)` when they changed and now serve, `Ok(false)` when
    /// unchanged; an error (unreadable, or a certificate and key that do not fit, as while a
    /// Secret is half written) keeps the current certificate.
    pub fn reload(&self) -> Result<bool, AgentError> {
        let bytes = read(&self.cert_file, &self.key_file)?;
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == bytes {
            return Ok(false);
        }
        let key = load(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (bytes, Arc::new(key));
        Ok(true)
    }

    /// A TLS acceptor presenting the current certificate of this handle at each handshake.
    pub fn acceptor(self: &Arc<Self>) -> Result<tokio_rustls::TlsAcceptor, AgentError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| AgentError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
    }

    /// Re-reads the files every `every` (at least 100 ms) until aborted.
    pub fn spawn_watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        crate::poll::spawn_poll(every, "TLS files unusable, keeping the last good certificate", move || {
            if me.reload().map_err(|e| e.to_string())? {
                info!(file = %me.cert_file.display(), "TLS certificate changed: serving the new one");
            }
            Ok(())
        })
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|e| e.into_inner()).1.clone())
    }
}

/// A TLS acceptor for `cert_file` and `key_file` as they are now (no reload).
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<tokio_rustls::TlsAcceptor, AgentError> {
    ServingCert::open(cert_file, key_file)?.acceptor()
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
        std::fs::write(d.path().join("empty.key"), b"").unwrap();
        let e = acceptor(&d.path().join("empty.pem"), &d.path().join("empty.key")).err().unwrap();
        assert!(e.to_string().contains("no certificate"), "{e}");
    }
}
