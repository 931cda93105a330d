//! Test PKI: a throwaway CA and a 127.0.0.1 server certificate made with openssl, for the
//! agent's TLS and the controller's `--agent-ca-file` tests. Nothing here is used by products.

use std::path::Path;

/// Makes a CA and a server certificate for 127.0.0.1 signed by it, with openssl, in `dir`:
/// `ca.pem`/`ca.key`, and `<name>.key`/`<name>.pem` for the server. Panics on failure.
pub fn make_ca(dir: &Path, name: &str) {
    make_ca_for(dir, name, "IP:127.0.0.1");
}

/// [`make_ca`] with the server certificate's subjectAltName `san` (`IP:…` or `DNS:…`).
pub fn make_ca_for(dir: &Path, name: &str, san: &str) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
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
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &format!("{name}.key"),
        "-out",
        &format!("{name}.csr"),
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext.cnf"), format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\n")).unwrap();
    run(&[
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
    ]);
}
