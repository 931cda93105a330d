//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: the agent serves HTTPS (`--tls-cert-file`,
//! `--tls-key-file`) with a certificate from a CA generated here (openssl); a client trusting that
//! CA reads the state and applies; a client that does not trust it, or speaks plain HTTP, gets
//! nothing. Replacing the files with a certificate of another CA (as a renewed Secret does) makes
//! the same agent process serve the new one.

mod common;
use haptic_e2e::on_each_version;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use haptic_e2e::{free_port, Haproxy, HaproxyBin, HaproxyOpts};
use haptic_protocol::Mode;

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

on_each_version!(agent_serves_https_with_a_generated_ca);
async fn agent_serves_https_with_a_generated_ca(bin: HaproxyBin) {
    let pki = tempfile::tempdir().unwrap();
    make_ca(pki.path());
    let ca = reqwest::Certificate::from_pem(&std::fs::read(pki.path().join("ca.pem")).unwrap()).unwrap();
    let label = bin.label();
    let dir = tempfile::tempdir().unwrap();
    let (root, run) = (dir.path().join("root"), dir.path().join("run"));
    std::fs::create_dir_all(&run).unwrap();
    let health = format!("127.0.0.1:{}", free_port());
    let agent_bin = env!("CARGO_BIN_EXE_haptic-agent");
    let st =
        Command::new(agent_bin).arg("init").arg("--root").arg(&root).args(["--health-bind", &health]).status().unwrap();
    assert!(st.success());
    let mut hopts = HaproxyOpts::new(&run);
    hopts.cfg = root.join("current/haproxy.cfg");
    let hap = Haproxy::start(&bin, hopts).await.unwrap();
    std::fs::write(dir.path().join("creds"), "haptic:s3cret\n").unwrap();
    let port = free_port();
    let _agent = Agent(
        Command::new(agent_bin)
            .args(["run", "--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(&root)
            .arg("--master-socket")
            .arg(hap.master_socket())
            .arg("--haproxy-bin")
            .arg(&bin.path)
            .arg("--credentials-file")
            .arg(dir.path().join("creds"))
            .arg("--tls-cert-file")
            .arg(pki.path().join("agent.pem"))
            .arg("--tls-key-file")
            .arg(pki.path().join("agent.key"))
            .args(["--tls-poll", "200ms"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("https://127.0.0.1:{port}");
    let trusting = reqwest::Client::builder().tls_backend_rustls().tls_certs_only([ca.clone()]).build().unwrap();
    eventually(&format!("{label}: the agent answering over https"), Duration::from_secs(30), || async {
        match trusting.get(format!("{url}/readyz")).send().await {
            Ok(r) if r.status() == 200 => Ok(()),
            got => Err(format!("{got:?}")),
        }
    })
    .await;

    // Trusted: state and an apply over https.
    let st = trusting.get(format!("{url}/v1/state")).basic_auth("haptic", Some("s3cret")).send().await.unwrap();
    assert_eq!(st.status(), 200, "{label}");
    let files = only_cfg(&cfg(&health, free_port(), &[("s1", 9001)], ""));
    let resp = trusting
        .post(format!("{url}/v1/apply"))
        .basic_auth("haptic", Some("s3cret"))
        .json(&request((1, 1), None, Mode::Reload, &files, |_| true, vec![]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{label}: {}", resp.text().await.unwrap());

    // Untrusted (no roots at all) and plain http: nothing.
    let untrusting = reqwest::Client::builder().tls_backend_rustls().tls_certs_only(Vec::new()).build().unwrap();
    assert!(untrusting.get(format!("{url}/healthz")).send().await.is_err(), "{label}: untrusted certificate accepted");
    let plain = reqwest::Client::new();
    assert!(
        plain.get(format!("http://127.0.0.1:{port}/healthz")).send().await.map(|r| r.status() != 200).unwrap_or(true),
        "{label}: plain http answered"
    );

    // The files replaced by a certificate of another CA: served without a restart.
    let pid = _agent.0.id();
    let next = tempfile::tempdir().unwrap();
    make_ca(next.path());
    let ca2 = reqwest::Certificate::from_pem(&std::fs::read(next.path().join("ca.pem")).unwrap()).unwrap();
    for f in ["agent.key", "agent.pem"] {
        std::fs::copy(next.path().join(f), pki.path().join(f)).unwrap();
    }
    let trusting2 = reqwest::Client::builder().tls_backend_rustls().tls_certs_only([ca2]).build().unwrap();
    eventually(&format!("{label}: the agent serving the renewed certificate"), Duration::from_secs(30), || async {
        match trusting2.get(format!("{url}/readyz")).send().await {
            Ok(r) if r.status() == 200 => Ok(()),
            got => Err(format!("{got:?}")),
        }
    })
    .await;
    let fresh = reqwest::Client::builder().tls_backend_rustls().tls_certs_only([ca]).build().unwrap();
    assert!(
        fresh.get(format!("{url}/healthz")).send().await.is_err(),
        "{label}: the replaced certificate still served"
    );
    assert_eq!(_agent.0.id(), pid);
    println!("{label}: https with a generated CA ok, renewed certificate served without a restart");
}
