//! Small networking helpers: free ports, a minimal HTTP/1.1 GET client and a tiny HTTP backend.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, release it).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
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
