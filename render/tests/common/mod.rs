//! What the render crate's integration tests share: the fixture set as a translator input, and
//! a render written out as a config tree.

use std::path::Path;

use haptic_render::ingress::{IngressInput, Settings, INGRESS_CONTROLLER};
use haptic_render::Render;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, IngressClassSpec};

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Fixture {
    ingresses: Vec<Ingress>,
    services: Vec<Service>,
    endpoint_slices: Vec<EndpointSlice>,
    secrets: Vec<Secret>,
}

/// `fixtures/basic.yaml` under the class `haptic` (ours), with `settings`.
#[allow(dead_code)]
pub fn basic_input(settings: Settings) -> IngressInput {
    input(include_str!("../fixtures/basic.yaml"), settings)
}

/// A fixture's objects under the class `haptic` (ours), with `settings`.
#[allow(dead_code)]
pub fn input(yaml: &str, settings: Settings) -> IngressInput {
    let f: Fixture = serde_saphyr::from_str(yaml).unwrap();
    let mut class = IngressClass::default();
    class.metadata.name = Some("haptic".into());
    class.spec = Some(IngressClassSpec { controller: Some(INGRESS_CONTROLLER.into()), ..Default::default() });
    IngressInput {
        class,
        ingresses: f.ingresses.into_iter().map(std::sync::Arc::new).collect(),
        services: f.services.into_iter().map(std::sync::Arc::new).collect(),
        endpoint_slices: f.endpoint_slices.into_iter().map(std::sync::Arc::new).collect(),
        secrets: f.secrets.into_iter().map(std::sync::Arc::new).collect(),
        previous_slots: Default::default(),
        settings,
        allowed: Default::default(),
        refused_snippets: Default::default(),
        excluded: Default::default(),
        sharing: Default::default(),
    }
}

/// Writes every file of `render` under `dir`.
#[allow(dead_code)]
pub fn write_tree(render: &Render, dir: &Path) {
    for (path, bytes) in &render.files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
}

/// A backend answering every request with `name` (a thread per listener, ended with the test
/// process).
#[allow(dead_code)]
pub fn backend(name: &'static str) -> u16 {
    backend_by_path(move |_| (200, name.to_string()))
}

/// A backend answering each request with the status and body `answer` gives for its path (a
/// thread per listener, ended with the test process).
#[allow(dead_code)]
pub fn backend_by_path(answer: impl Fn(&str) -> (u16, String) + Send + 'static) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let (code, body) = answer(req.split(' ').nth(1).unwrap_or("/"));
            let reason = if code == 200 { "OK" } else { "Answer" };
            let _ = write!(
                s,
                "HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// The status code of a raw response.
#[allow(dead_code)]
pub fn status(resp: &str) -> u16 {
    resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("no status in {resp:?}"))
}

/// A backend answering every request with `name`, a newline and the request's head as it
/// arrived (request line and header lines, names lowercased), so a test sees what HAProxy sent.
#[allow(dead_code)]
pub fn echo_backend(name: &'static str) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = vec![0u8; 16384];
            let mut n = 0;
            while n < buf.len() {
                match s.read(&mut buf[n..]) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k,
                }
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]).split("\r\n\r\n").next().unwrap_or_default().to_string();
            let head: Vec<String> = head
                .lines()
                .enumerate()
                .map(|(i, l)| match l.split_once(':') {
                    Some((k, v)) if i > 0 => format!("{}:{v}", k.to_ascii_lowercase()),
                    _ => l.to_string(),
                })
                .collect();
            let body = format!("{name}\n{}", head.join("\n"));
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    port
}

/// Sends `req` and returns the whole response as text.
#[allow(dead_code)]
pub async fn raw(addr: std::net::SocketAddr, req: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Points every EndpointSlice of `input` at 127.0.0.1 on the port `port_of` gives for its Service.
#[allow(dead_code)]
pub fn endpoints_on_loopback(input: &mut IngressInput, port_of: impl Fn(&str) -> u16) {
    for s in &mut input.endpoint_slices {
        let s = std::sync::Arc::make_mut(s);
        let svc =
            s.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).cloned().unwrap_or_default();
        let port = port_of(&svc);
        for p in s.ports.iter_mut().flatten() {
            p.port = Some(port.into());
        }
        for e in &mut s.endpoints {
            e.addresses = vec!["127.0.0.1".into()];
        }
    }
}

/// A `kubernetes.io/tls` Secret `ns/name` with a fresh self-signed certificate (openssl) for
/// `site.example.com` and `*.site.example.com`.
#[allow(dead_code)]
pub fn tls_secret(dir: &std::path::Path, ns: &str, name: &str) -> k8s_openapi::api::core::v1::Secret {
    let (c, k) = self_signed(dir, name, "site.example.com", &["site.example.com", "*.site.example.com"]);
    let mut s = k8s_openapi::api::core::v1::Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(ns.into());
    s.type_ = Some("kubernetes.io/tls".into());
    s.data = Some(
        [("tls.crt".to_string(), k8s_openapi::ByteString(c)), ("tls.key".to_string(), k8s_openapi::ByteString(k))]
            .into(),
    );
    s
}

/// A fresh self-signed certificate for `cn` (and `names`, when any) valid for a day, written
/// by openssl under `dir` as `file.crt` and `file.key`: (certificate PEM, key PEM).
#[allow(dead_code)]
pub fn self_signed(dir: &std::path::Path, file: &str, cn: &str, names: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let (c, k) = (dir.join(format!("{file}.crt")), dir.join(format!("{file}.key")));
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj"]).arg(format!("/CN={cn}"));
    if !names.is_empty() {
        let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
        cmd.arg("-addext").arg(format!("subjectAltName={}", sans.join(",")));
    }
    let ok = cmd.arg("-keyout").arg(&k).arg("-out").arg(&c).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    (std::fs::read(c).unwrap(), std::fs::read(k).unwrap())
}

/// curl over TLS with SNI `host` to 127.0.0.1:`port`, trusting only `ca`: its exit code and
/// what it printed.
#[allow(dead_code)]
pub async fn curl_tls(host: &str, port: u16, ca: &Path) -> (Option<i32>, String) {
    let (host, ca) = (host.to_string(), ca.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert"])
            .arg(&ca)
            .arg("--resolve")
            .arg(format!("{host}:{port}:127.0.0.1"))
            .arg(format!("https://{host}:{port}/"))
            .output()
            .unwrap();
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    })
    .await
    .unwrap()
}

/// A `kubernetes.io/tls` Secret `ns/name` holding `<file>.pem` and `<file>.key` of `dir` (as
/// `haptic_e2e::tls` writes them).
#[allow(dead_code)]
pub fn tls_secret_from(dir: &Path, file: &str, ns: &str, name: &str) -> Secret {
    let read = |ext: &str| k8s_openapi::ByteString(std::fs::read(dir.join(format!("{file}.{ext}"))).unwrap());
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(ns.into());
    s.type_ = Some("kubernetes.io/tls".into());
    s.data = Some([("tls.crt".to_string(), read("pem")), ("tls.key".to_string(), read("key"))].into());
    s
}

/// A ConfigMap `ns/name` whose `ca.crt` is `pem` (the CA certificates BackendTLSPolicies and
/// Gateways' client validation name).
#[allow(dead_code)]
pub fn ca_config_map(ns: &str, name: &str, pem: &[u8]) -> k8s_openapi::api::core::v1::ConfigMap {
    let mut c = k8s_openapi::api::core::v1::ConfigMap::default();
    c.metadata.namespace = Some(ns.into());
    c.metadata.name = Some(name.into());
    c.data = Some([("ca.crt".to_string(), String::from_utf8(pem.to_vec()).unwrap())].into());
    c
}

/// Gateway settings binding 127.0.0.1 from `first_bind_port`, two slots per backend.
#[allow(dead_code)]
pub fn loopback_gateway(first_bind_port: u16) -> haptic_render::gateway::GatewaySettings {
    haptic_render::gateway::GatewaySettings {
        bind_address: std::net::IpAddr::from([127, 0, 0, 1]),
        first_bind_port,
        min_slots: 2,
        ..Default::default()
    }
}

/// The Accepted condition of route `name`'s first parent in `out`.
#[allow(dead_code)]
pub fn accepted(out: &haptic_render::gateway::GatewayOutput, name: &str) -> haptic_render::gateway::Cond {
    let r = out.routes.iter().find(|r| r.object.name == name).unwrap_or_else(|| panic!("no route {name}"));
    r.parents[0].conditions.iter().find(|c| c.type_ == "Accepted").unwrap().clone()
}

/// A TLS backend (HAProxy) on a free port with the certificate `srv` of `pki` (as
/// `haptic_e2e::tls` writes it) and `ca.pem` of `pki` copied beside it, its bind taking
/// `bind_extra` (e.g. `ca-file ca.pem verify required`), answering 200 with the log-format
/// `answer`; the process and its port.
#[allow(dead_code)]
pub async fn tls_backend(
    bin: &haptic_e2e::HaproxyBin,
    pki: &Path,
    dir: &Path,
    (bind_extra, answer): (&str, &str),
) -> (haptic_e2e::process::Haproxy, u16) {
    let mut bundle = std::fs::read(pki.join("srv.pem")).unwrap();
    bundle.extend(std::fs::read(pki.join("srv.key")).unwrap());
    std::fs::write(dir.join("srv.pem"), bundle).unwrap();
    std::fs::copy(pki.join("ca.pem"), dir.join("ca.pem")).unwrap();
    let port = haptic_e2e::net::free_port();
    std::fs::write(
        dir.join("haproxy.cfg"),
        format!(
            "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
             frontend tls\n    bind 127.0.0.1:{port} ssl crt srv.pem {bind_extra}\n\
             \x20   http-request return status 200 content-type text/plain lf-string \"{answer}\"\n"
        ),
    )
    .unwrap();
    let opts = haptic_e2e::process::HaproxyOpts::new(dir);
    (haptic_e2e::process::Haproxy::start(bin, opts).await.unwrap(), port)
}
