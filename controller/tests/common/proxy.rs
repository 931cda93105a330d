//! A real HTTP/1.1 proxy on 127.0.0.1 between the controller and one agent, so tests can make
//! the network misbehave the way it does in a fleet: an apply that lands but whose answer is
//! lost, an apply held in flight, an agent that reports other capabilities. Every request is
//! forwarded to the real agent (one connection per request, `Connection: close` both ways);
//! nothing is answered by the proxy itself.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What the proxy does to requests right now.
#[derive(Debug, Default)]
pub struct Rules {
    /// Forward the next N `POST /v1/apply` to the agent, then close the controller's
    /// connection without its answer (the apply lands; the controller sees a reset).
    pub drop_apply_answers: usize,
    /// Hold every `POST /v1/apply` before forwarding it, until [`Proxy::release`].
    pub hold_applies: bool,
    /// Rewrites the JSON body of `GET /v1/state` answers.
    pub rewrite_state: Option<fn(&mut serde_json::Value)>,
    /// Another writer: before forwarding a controller's apply that would land (its baseline is
    /// the pod's applied plan), the next of these apply bodies is sent to the agent first, with
    /// the controller's own holder and epoch and the seq after the controller's (so it is
    /// accepted, and the controller's apply then meets a changed pod).
    pub inject: std::collections::VecDeque<serde_json::Value>,
}

#[derive(Debug, Default)]
struct Shared {
    rules: Mutex<Rules>,
    held: Mutex<usize>,
    applies_seen: Mutex<usize>,
    answers_dropped: Mutex<usize>,
    release: Notify,
}

/// The proxy; dropping it stops accepting.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Proxy {
    /// Starts a proxy in front of the agent at `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = serve(conn, upstream, &s).await;
                });
            }
        });
        Proxy { addr, shared, task }
    }

    /// The URL the controller uses for this agent.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the rules.
    pub fn rules(&self, f: impl FnOnce(&mut Rules)) {
        f(&mut lock(&self.shared.rules));
    }

    /// Applies held right now.
    pub fn held(&self) -> usize {
        *lock(&self.shared.held)
    }

    /// `POST /v1/apply` requests seen so far.
    pub fn applies_seen(&self) -> usize {
        *lock(&self.shared.applies_seen)
    }

    /// Apply answers dropped so far.
    pub fn answers_dropped(&self) -> usize {
        *lock(&self.shared.answers_dropped)
    }

    /// Injected applies not sent yet.
    pub fn inject_left(&self) -> usize {
        lock(&self.shared.rules).inject.len()
    }

    /// Stops holding applies and lets every held one through.
    pub fn release(&self) {
        lock(&self.shared.rules).hold_applies = false;
        self.shared.release.notify_waiters();
    }
}

/// Reads one HTTP/1.1 message head and its `content-length` body.
async fn read_message(conn: &mut TcpStream) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Some((head, body)))
}

/// The head with `connection: close` instead of any connection header, and a new length.
fn rewrite_head(head: &str, body_len: usize) -> String {
    let mut out = String::new();
    for (i, line) in head.trim_end().split("\r\n").enumerate() {
        let lower = line.to_ascii_lowercase();
        if i > 0 && (lower.starts_with("connection:") || lower.starts_with("content-length:")) {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!("connection: close\r\ncontent-length: {body_len}\r\n\r\n"));
    out
}

async fn serve(mut client: TcpStream, upstream: SocketAddr, s: &Shared) -> std::io::Result<()> {
    let Some((head, body)) = read_message(&mut client).await? else { return Ok(()) };
    let is_apply = head.starts_with("POST /v1/apply");
    let is_state = head.starts_with("GET /v1/state");
    let mut drop_answer = false;
    if is_apply {
        *lock(&s.applies_seen) += 1;
        let mut r = lock(&s.rules);
        if r.drop_apply_answers > 0 {
            r.drop_apply_answers -= 1;
            drop_answer = true;
        }
    }
    if is_apply {
        loop {
            let notified = s.release.notified();
            if !lock(&s.rules).hold_applies {
                break;
            }
            *lock(&s.held) += 1;
            notified.await;
            *lock(&s.held) -= 1;
        }
    }
    if is_apply && !lock(&s.rules).inject.is_empty() {
        inject(&head, &body, upstream, s).await?;
    }
    let mut up = TcpStream::connect(upstream).await?;
    up.write_all(rewrite_head(&head, body.len()).as_bytes()).await?;
    up.write_all(&body).await?;
    let Some((rhead, mut rbody)) = read_message(&mut up).await? else { return Ok(()) };
    if drop_answer {
        *lock(&s.answers_dropped) += 1;
        // The apply landed; the controller never hears of it.
        return Ok(());
    }
    if is_state {
        let rewrite = lock(&s.rules).rewrite_state;
        if let (Some(f), Ok(mut v)) = (rewrite, serde_json::from_slice::<serde_json::Value>(&rbody)) {
            f(&mut v);
            rbody = serde_json::to_vec(&v).unwrap();
        }
    }
    client.write_all(rewrite_head(&rhead, rbody.len()).as_bytes()).await?;
    client.write_all(&rbody).await?;
    client.shutdown().await
}

/// One request to the agent with the controller's credentials; the answer's status and body.
async fn call(
    upstream: SocketAddr,
    auth: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut up = TcpStream::connect(upstream).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {upstream}\r\n{auth}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    up.write_all(head.as_bytes()).await?;
    up.write_all(body).await?;
    let (rhead, rbody) = read_message(&mut up).await?.unwrap_or_default();
    let status = rhead.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, rbody))
}

/// Sends the next injected apply first when the controller's apply would land.
async fn inject(head: &str, body: &[u8], upstream: SocketAddr, s: &Shared) -> std::io::Result<()> {
    let auth = head.split("\r\n").find(|l| l.to_ascii_lowercase().starts_with("authorization:")).unwrap_or("");
    let ctl: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let (_, state) = call(upstream, auth, "GET", "/v1/state", b"").await?;
    let state: serde_json::Value = serde_json::from_slice(&state).unwrap_or_default();
    if ctl["baseline"].is_null() || ctl["baseline"] != state["applied"]["plan_id"] {
        return Ok(());
    }
    let Some(mut rogue) = lock(&s.rules).inject.pop_front() else { return Ok(()) };
    let fence = &ctl["fence"];
    rogue["fence"] = serde_json::json!({
        "epoch": fence["epoch"], "seq": fence["seq"].as_u64().unwrap_or(0) + 1, "holder": fence["holder"],
    });
    let (status, answer) = call(upstream, auth, "POST", "/v1/apply", &serde_json::to_vec(&rogue).unwrap()).await?;
    assert_eq!(status, 200, "the injected apply was refused: {}", String::from_utf8_lossy(&answer));
    Ok(())
}
