//! Small networking helpers: free ports, a minimal HTTP/1.1 GET client and a tiny HTTP backend.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP port on 127.0.0.1 that nothing listened on a moment ago and that this process has not
/// handed out before, nor any of the [`PORT_BLOCK`]` - 1` ports after it (a Gateway binds its
/// listeners from a first port upwards).
///
/// Hand-written rather than `bind(0)`: the kernel may give a released port to the next
/// `bind(0)` or outgoing connection, and HAProxy binds with `SO_REUSEPORT`, so two HAProxies of
/// one test process handed one port both bind it and share its connections. Ports come from
/// below the kernel's ephemeral range, where neither `bind(0)` nor a client lands, in blocks
/// through a counter (no block twice in one process) walked in an order taken from the process
/// id; a block is this process's while it holds the block's lock file (`flock`, released when
/// the process ends), so two test processes running at once never share one.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static WALK: OnceLock<(u32, u32, u32)> = OnceLock::new();
    let (blocks, start, step) = *WALK.get_or_init(|| {
        let blocks = (ephemeral_low().max(LOW + 1_000) - LOW) / PORT_BLOCK;
        let pid = u64::from(std::process::id());
        // A step coprime with the number of blocks visits every block once per round.
        let step = [7_919u64, 7_907, 7_901, 7_883, 7_879, 7_877]
            .into_iter()
            .map(|p| (p * (1 + pid % 97)) % u64::from(blocks))
            .find(|s| *s > 0 && gcd(*s, u64::from(blocks)) == 1)
            .unwrap_or(1);
        (blocks, (pid.wrapping_mul(7_919) % u64::from(blocks)) as u32, step as u32)
    });
    for _ in 0..blocks {
        let k = u64::from(NEXT.fetch_add(1, Ordering::Relaxed));
        let block = (u64::from(start) + k * u64::from(step)) % u64::from(blocks);
        let first = LOW + block as u32 * PORT_BLOCK;
        if !claim(first) {
            continue;
        }
        let held: Vec<_> =
            (first..first + PORT_BLOCK).map_while(|p| TcpListener::bind(("127.0.0.1", p as u16)).ok()).collect();
        if held.len() == PORT_BLOCK as usize {
            return first as u16;
        }
    }
    panic!("no {PORT_BLOCK} free ports in a row from {LOW} on 127.0.0.1")
}

/// How many consecutive ports [`free_port`] hands out at a time.
pub const PORT_BLOCK: u32 = 16;

/// Takes the lock of the block starting at `first` for the rest of this process; false when
/// another process holds it. Without a lock directory every block is taken.
fn claim(first: u32) -> bool {
    use std::sync::Mutex;
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("haptic-test-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let Ok(f) = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(first.to_string()))
    else {
        return true;
    };
    match f.try_lock() {
        Ok(()) => {
            HELD.lock().unwrap_or_else(|p| p.into_inner()).push(f);
            true
        }
        Err(_) => false,
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`; 32768 when unread).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32_768)
        .min(u32::from(u16::MAX))
}

/// Sends `GET path` (with `Connection: close`) to `addr` and returns `(status, body)`; 5 s timeout.
pub async fn http_get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    http_request(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")).await
}

/// Sends one raw HTTP/1.1 request (which must say `Connection: close`) to `addr` and returns
/// `(status, body)`; 5 s timeout.
pub async fn http_request(addr: SocketAddr, request: &str) -> io::Result<(u16, String)> {
    http_request_within(addr, request, Duration::from_secs(5)).await
}

/// [`http_request`] with its own timeout.
pub async fn http_request_within(addr: SocketAddr, request: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(request.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        parse_http_response(&buf)
    };
    let line = request.lines().next().unwrap_or_default().to_string();
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("{addr} {line}: timed out")))?
}

/// Splits a raw HTTP/1.x response into status and body (no chunked decoding).
pub fn parse_http_response(buf: &[u8]) -> io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(buf);
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad HTTP response: {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status =
        head.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    Ok((status, body.to_string()))
}

/// Polls `GET path` until it answers 200 with `body`, or panics after `timeout`.
pub async fn wait_http_body(addr: SocketAddr, path: &str, body: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got = http_get(addr, path).await;
        if matches!(&got, Ok((200, b)) if b == body) {
            return;
        }
        if Instant::now() >= deadline {
            panic!("GET {addr}{path}: wanted 200 {body:?}, last got {got:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks handed out in one process never overlap, lie below the ephemeral range and stay
    /// locked.
    #[test]
    fn free_ports_come_in_blocks_that_never_overlap() {
        let firsts: Vec<u32> = (0..200).map(|_| u32::from(free_port())).collect();
        let mut sorted = firsts.clone();
        sorted.sort();
        assert!(sorted.windows(2).all(|w| w[1] >= w[0] + PORT_BLOCK), "{sorted:?}");
        assert!(sorted.iter().all(|p| p + PORT_BLOCK <= ephemeral_low()), "{sorted:?}");
        // Held: another open file (as another process would open it) cannot take the lock.
        assert!(!claim(firsts[0]));
    }

    #[test]
    fn parses_response() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\n\r\nhello";
        assert_eq!(parse_http_response(raw).unwrap(), (200, "hello".to_string()));
        assert!(parse_http_response(b"garbage").is_err());
    }

    #[test]
    fn free_port_is_nonzero() {
        assert_ne!(free_port(), 0);
    }
}

/// A tiny HTTP backend on 127.0.0.1 answering `200 <name>` (and `connection: close`) to every
/// request; it stops when dropped.
#[derive(Debug)]
pub struct Responder {
    /// The port it listens on.
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Responder {
    /// Binds 127.0.0.1:0 and starts answering.
    pub async fn start(name: &str) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local_addr").port();
        let body = name.to_string();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else { return };
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        Responder { port, task }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
