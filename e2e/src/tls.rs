//! Test PKI: a throwaway CA and server certificates (for 127.0.0.1, or a DNS name) made with
//! openssl, for the agent's TLS, the controller's `--agent-ca-file` and the TLS Ingress tests. Nothing here is used by products.

use std::path::Path;

/// Makes a CA and a server certificate for 127.0.0.1 signed by it, with openssl, in `dir`:
/// `ca.pem`/`ca.key`, and `<name>.key`/`<name>.pem` for the server. Panics on failure.
pub fn make_ca(dir: &Path, name: &str) {
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
    sign(dir, name, "127.0.0.1", "IP:127.0.0.1");
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
