//! Test PKI: a throwaway CA and server certificates (for 127.0.0.1, or a DNS name) made with
//! openssl, for the agent's TLS, the controller's `--agent-ca-file` and the TLS Ingress tests. Nothing here is used by products.

use std::path::Path;

/// Makes a CA and a server certificate for 127.0.0.1 signed by it, with openssl, in `dir`:
/// `ca.pem`/`ca.key`, and `<name>.key`/`<name>.pem` for the server. Panics on failure.
pub fn make_ca(dir: &Path, name: &str) {
    make_ca_for(dir, name, "IP:127.0.0.1");
}

/// [`make_ca`] with the server certificate's subjectAltName `san` (`IP:…` or `DNS:…`).
pub fn make_ca_for(dir: &Path, name: &str, san: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=haptic test CA",
        ],
    );
    let cn = san.split_once(':').map_or(san, |(_, v)| v);
    sign(dir, name, cn, san);
}

/// Makes `<name>.key`/`<name>.pem` in `dir`: a certificate for the DNS name `host` signed by the
/// CA [`make_ca`] made there (the TLS Ingress tests' Secrets). Panics on failure.
pub fn make_host_cert(dir: &Path, name: &str, host: &str) {
    sign(dir, name, host, &format!("DNS:{host}"));
}

/// A key and a certificate with common name `cn` and the subject alternative name `san`, signed
/// by `ca.pem`/`ca.key` in `dir`.
fn sign(dir: &Path, name: &str, cn: &str, san: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    std::fs::write(dir.join("ext.cnf"), format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\n")).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// Runs `openssl ARGS` in `dir`; panics when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A TLS server on 127.0.0.1 (the PEM chain `cert`, the PEM key `key`) answering every request,
/// once its head is read, with the raw HTTP/1.1 `response`, until the task is aborted. Panics on
/// bad PEM.
pub async fn answering_server(
    cert: &[u8],
    key: &[u8],
    response: String,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use rustls_pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>().unwrap();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let Ok(mut s) = acceptor.accept(s).await else { continue };
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65536];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(response.as_bytes()).await;
            let _ = s.shutdown().await;
        }
    });
    (addr, task)
}
