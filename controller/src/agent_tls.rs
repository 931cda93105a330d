//! Verifying the agents' TLS certificates.
//!
//! Owns the rustls client configuration the agent client uses: trust only the agents' CA bundle
//! (never the system's roots), verify one fixed DNS name in every agent's certificate instead of
//! the pod IP its URL names (pod IPs change; the certificate carries a stable name such as
//! `<release>-agent.<namespace>.svc`), and take on a new CA bundle without a restart. It must
//! never make or store certificates (Kubernetes mode's issuer does) nor talk to an agent itself.

use std::sync::{Arc, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::Error;

/// The scheme of the agents' URLs: `https` when the agents serve TLS.
pub fn scheme(tls: bool) -> &'static str {
    if tls {
        "https"
    } else {
        "http"
    }
}

/// `<scheme>://<ip>:<port>`, with an IPv6 address in brackets.
pub fn agent_url(tls: bool, ip: &str, port: u16) -> String {
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() };
    format!("{}://{host}:{port}", scheme(tls))
}

/// The certificates of a PEM bundle (an error when it holds none or does not parse).
pub fn parse_bundle(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Client(format!("agent CA: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Client("agent CA: no certificate in the bundle".into()));
    }
    Ok(certs)
}

/// The trust towards the agents: a CA bundle that can be replaced while connections are made,
/// and the name every agent certificate must carry (`None`: the URL's host, as usual).
#[derive(Debug)]
pub struct AgentTrust {
    provider: Arc<CryptoProvider>,
    name: Option<ServerName<'static>>,
    /// The current verifier and the bundle it was built from (`None`: no CA yet, every agent is
    /// refused).
    current: RwLock<Option<(Vec<u8>, Arc<WebPkiServerVerifier>)>>,
}

impl AgentTrust {
    /// Trust for `name` (a DNS name) with no CA yet.
    pub fn new(name: Option<&str>) -> Result<Arc<Self>, Error> {
        let name = match name {
            Some(n) => Some(
                ServerName::try_from(n.to_string())
                    .map_err(|e| Error::Client(format!("agent TLS server name {n:?}: {e}")))?,
            ),
            None => None,
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        Ok(Arc::new(Self { provider, name, current: RwLock::new(None) }))
    }

    /// Trusts exactly the CA bundle `pem` from now on; `Ok(false)` when it is the bundle already
    /// trusted. A bad bundle is an error and changes nothing.
    pub fn set_ca(&self, pem: &[u8]) -> Result<bool, Error> {
        if self.current.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|(p, _)| p == pem) {
            return Ok(false);
        }
        let mut roots = RootCertStore::empty();
        for c in parse_bundle(pem)? {
            roots.add(c).map_err(|e| Error::Client(format!("agent CA: {e}")))?;
        }
        let v = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| Error::Client(format!("agent CA: {e}")))?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some((pem.to_vec(), v));
        Ok(true)
    }

    /// Whether a CA is trusted.
    pub fn has_ca(&self) -> bool {
        self.current.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// A rustls client configuration verifying through this trust (HTTP/1.1 by ALPN).
    pub fn client_config(self: &Arc<Self>) -> Result<rustls::ClientConfig, Error> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Client(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(self.clone())
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

/// The verifier's error for a handshake before any agent CA is loaded.
#[derive(Debug, thiserror::Error)]
#[error("no agent CA loaded yet: every agent is refused")]
pub struct NoAgentCa;

impl ServerCertVerifier for AgentTrust {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let v = self.current.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(_, v)| v.clone());
        let Some(v) = v else {
            let none = rustls::OtherError(std::sync::Arc::new(NoAgentCa));
            return Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(none)));
        };
        let name = self.name.as_ref().unwrap_or(server_name);
        v.verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(agent_url(true, "10.0.0.5", 9080), "https://10.0.0.5:9080");
        assert_eq!(agent_url(false, "10.0.0.5", 9080), "http://10.0.0.5:9080");
        assert_eq!(agent_url(true, "fd00::1", 9080), "https://[fd00::1]:9080");
    }

    #[test]
    fn a_bad_bundle_changes_nothing() {
        let t = AgentTrust::new(Some("haptic-agent.edge.svc")).unwrap();
        assert!(t.set_ca(b"junk").is_err());
        assert!(!t.has_ca());
        assert!(AgentTrust::new(Some("not a name")).is_err());
    }
}
