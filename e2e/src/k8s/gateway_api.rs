//! The Gateway API standard-channel CRDs on a test control plane.
//!
//! Owns finding them (the `config/crd/standard` directory of the `sigs.k8s.io/gateway-api`
//! module that the Go module `conformance/tools` pins, fetched into the Go module cache when it
//! is missing) and applying them to an apiserver until every one is Established. It must never
//! apply anything but the CustomResourceDefinitions of that directory, and never wait unbounded.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::Value;

/// A replacement for the built-in template's frontend bind loop that binds each local pod's own
/// `${POD_IP}` on the bind ports the Gateway translator hands out (local pods share one host).
pub const POD_IP_BINDS: &str = "{% for b in f.binds %}    bind {{ b | replace(\"'0.0.0.0:\", \"\\\"${POD_IP}:\") | replace(\"'\", \"\\\"\") }}\n{% endfor %}";

/// How long `go mod download` may take (it fetches the module when the cache lacks it).
const GO_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the CRDs may take to be Established.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the CRDs could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayCrdsError {
    /// `go mod download` failed, timed out or printed no module directory.
    #[error("go mod download sigs.k8s.io/gateway-api (in conformance/tools): {0}")]
    Go(String),
    /// Reading or parsing a CRD file failed.
    #[error("{0}")]
    File(String),
    /// The apiserver refused a CRD.
    #[error("apply CRD {name}: {source}")]
    Kube {
        /// The CRD.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Not every CRD was Established in time.
    #[error("the Gateway API CRDs were not Established within {ESTABLISH_TIMEOUT:?}: {0:?} still missing")]
    Timeout(Vec<String>),
}

/// The directory of the standard-channel CRDs of the gateway-api module `conformance/tools` pins.
pub async fn crd_dir() -> Result<PathBuf, GatewayCrdsError> {
    let tools = crate::workspace_root().join("conformance/tools");
    let mut cmd = tokio::process::Command::new("go");
    cmd.args(["mod", "download", "-json", "sigs.k8s.io/gateway-api"])
        .current_dir(&tools)
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .kill_on_drop(true);
    let out = tokio::time::timeout(GO_TIMEOUT, cmd.output())
        .await
        .map_err(|_| GatewayCrdsError::Go(format!("no answer within {GO_TIMEOUT:?}")))?
        .map_err(|e| GatewayCrdsError::Go(e.to_string()))?;
    if !out.status.success() {
        return Err(GatewayCrdsError::Go(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| GatewayCrdsError::Go(e.to_string()))?;
    match v["Dir"].as_str() {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir).join("config/crd/standard")),
        _ => Err(GatewayCrdsError::Go(format!("no Dir in {v}"))),
    }
}

/// Applies every CRD of [`crd_dir`] by server-side apply and waits until each is Established.
pub async fn install_gateway_crds(client: &Client) -> Result<(), GatewayCrdsError> {
    let dir = crd_dir().await?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| GatewayCrdsError::File(format!("{}: {e}", dir.display())))?;
    for entry in entries {
        let path = entry.map_err(|e| GatewayCrdsError::File(format!("{}: {e}", dir.display())))?.path();
        let text =
            std::fs::read_to_string(&path).map_err(|e| GatewayCrdsError::File(format!("{}: {e}", path.display())))?;
        let docs = serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text)
            .map_err(|e| GatewayCrdsError::File(format!("{}: {e}", path.display())))?;
        for v in docs.into_iter().filter(|v| v["kind"] == "CustomResourceDefinition") {
            let name = v["metadata"]["name"].as_str().unwrap_or_default().to_string();
            api.patch(&name, &PatchParams::apply("haptic-e2e").force(), &Patch::Apply(&v))
                .await
                .map_err(|source| GatewayCrdsError::Kube { name: name.clone(), source })?;
            names.push(name);
        }
    }
    let deadline = Instant::now() + ESTABLISH_TIMEOUT;
    loop {
        let mut missing = Vec::new();
        for name in &names {
            let established = api
                .get(name)
                .await
                .ok()
                .and_then(|c| c.status)
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
            if !established {
                missing.push(name.clone());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(GatewayCrdsError::Timeout(missing));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
