//! Websockets through the real cluster's HAProxy Service: an echo server on the host's address
//! in the cluster network (a Service without selector whose EndpointSlice names it, so HAProxy
//! pods connect to it like to any endpoint), and clients that exchange one message every
//! [`EVERY`] until told to stop.
//!
//! Owns the server, the clients and the Service + EndpointSlice. It must never listen beyond the
//! cluster network's host address nor connect anywhere but the HAProxy Service; the server stops
//! when dropped.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::real::{RealCluster, NAMESPACE, SERVICE_PORT};
use super::real_steps::apply_params;
use super::{Cluster, ClusterError, Result};

/// How often a client sends a message.
const EVERY: Duration = Duration::from_millis(200);
/// How long a client waits for the echo of one message.
const ECHO_WITHIN: Duration = Duration::from_secs(10);

/// A websocket echo server: each text message comes back as `<peer address> <message>`, the
/// peer being the HAProxy pod that carries the connection. Stopped when dropped.
pub(super) struct EchoServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EchoServer {
    /// Listens on `ip` (a port the kernel picks).
    pub(super) async fn start(ip: IpAddr) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .map_err(|e| ClusterError::of(&format!("listen on {ip} for websockets"), e))?;
        let addr = listener.local_addr().map_err(|e| ClusterError::of("the websocket server's address", e))?;
        let task = tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
                    while let Some(Ok(m)) = ws.next().await {
                        if let Message::Text(t) = m {
                            if ws.send(Message::text(format!("{} {}", peer.ip(), t.as_str()))).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Ok(EchoServer { addr, task })
    }

    /// The Service `name` (port 80) in the release's namespace whose one endpoint is this server.
    pub(super) async fn publish(&self, c: &RealCluster, name: &str) -> Result<()> {
        let client = c.client();
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                         "spec": {"ports": [{"name": "http", "port": 80, "targetPort": self.addr.port()}]}});
        Api::<Service>::namespaced(client.clone(), NAMESPACE)
            .patch(name, &apply_params(), &Patch::Apply(&svc))
            .await
            .map_err(|e| ClusterError::of(&format!("apply the Service {name}"), e))?;
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                           "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name}},
                           "addressType": "IPv4", "ports": [{"name": "http", "port": self.addr.port()}],
                           "endpoints": [{"addresses": [self.addr.ip().to_string()], "conditions": {"ready": true}}]});
        Api::<EndpointSlice>::namespaced(client, NAMESPACE)
            .patch(name, &apply_params(), &Patch::Apply(&slice))
            .await
            .map_err(|e| ClusterError::of(&format!("apply the EndpointSlice {name}"), e))?;
        Ok(())
    }
}

/// What one websocket did.
#[derive(Debug, Clone)]
pub(super) struct Exchanged {
    /// The HAProxy pod address that carried it (from the server's echoes).
    pub pod_ip: String,
    /// Messages sent and echoed.
    pub messages: usize,
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// An open websocket through the HAProxy Service, its first message echoed.
pub(super) struct Open {
    ws: Socket,
    pod_ip: String,
}

impl Open {
    /// Opens `ws://host/path` through the HAProxy Service at `svc_ip` and exchanges message 0.
    pub(super) async fn new(svc_ip: &str, host: &str, path: &str) -> Result<Open> {
        let tcp = tokio::net::TcpStream::connect((svc_ip, SERVICE_PORT))
            .await
            .map_err(|e| ClusterError::of("connect a websocket to the Service", e))?;
        let req = format!("ws://{host}{path}")
            .into_client_request()
            .map_err(|e| ClusterError::of("a websocket request", e))?;
        let (mut ws, _) = tokio::time::timeout(ECHO_WITHIN, tokio_tungstenite::client_async(req, tcp))
            .await
            .map_err(|_| ClusterError("no websocket handshake within 10 s".into()))?
            .map_err(|e| ClusterError::of("the websocket handshake", e))?;
        let first = round_trip(&mut ws, 0).await?;
        let pod_ip = first.strip_suffix(" 0").ok_or_else(|| ClusterError(format!("first echo {first:?}")))?.to_string();
        Ok(Open { ws, pod_ip })
    }

    /// Exchanges one message every [`EVERY`], each echoed through the same HAProxy pod, until
    /// `stop` is set and `after_stop` more were exchanged; then closes cleanly. Fails on the
    /// first message lost, garbled or late, or when the connection ends early.
    pub(super) async fn exchange(mut self, stop: Arc<AtomicBool>, after_stop: usize) -> Result<Exchanged> {
        let (mut n, mut left) = (0, after_stop);
        while !stop.load(Ordering::Relaxed) || left > 0 {
            if stop.load(Ordering::Relaxed) {
                left -= 1;
            }
            tokio::time::sleep(EVERY).await;
            n += 1;
            let echo =
                round_trip(&mut self.ws, n).await.map_err(|e| ClusterError(format!("websocket message {n}: {e}")))?;
            if echo != format!("{} {n}", self.pod_ip) {
                return Err(ClusterError(format!(
                    "websocket message {n}: echoed {echo:?} (first through {})",
                    self.pod_ip
                )));
            }
        }
        self.ws.close(None).await.map_err(|e| ClusterError::of("close a websocket", e))?;
        while let Some(Ok(_)) = self.ws.next().await {}
        Ok(Exchanged { pod_ip: self.pod_ip, messages: n })
    }
}

/// Sends message `n` and returns the next text the server answers, within [`ECHO_WITHIN`].
async fn round_trip(ws: &mut Socket, n: usize) -> Result<String> {
    ws.send(Message::text(n.to_string())).await.map_err(|e| ClusterError::of("send", e))?;
    loop {
        let next = tokio::time::timeout(ECHO_WITHIN, ws.next())
            .await
            .map_err(|_| ClusterError("no echo within 10 s".into()))?;
        match next {
            Some(Ok(Message::Text(t))) => return Ok(t.as_str().to_string()),
            Some(Ok(Message::Close(f))) => return Err(ClusterError(format!("closed by the other side: {f:?}"))),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(ClusterError::of("receive", e)),
            None => return Err(ClusterError("the connection ended".into())),
        }
    }
}
