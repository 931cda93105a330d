//! Offline render input: a directory of YAML manifests (what a GitOps repository holds) read
//! into the objects render mode reads, for `haptic-controller render` and `migrate`.
//!
//! Owns reading `*.yaml` / `*.yml` files (several documents each, `kind: List` unwrapped),
//! sorting the documents by `kind` (Ingress, IngressClass, GatewayClass, Gateway, HTTPRoute, GRPCRoute,
//! TLSRoute, TCPRoute, ReferenceGrant, Namespace, Service, EndpointSlice, Secret, ConfigMap, exactly one
//! HAProxyConfig; other kinds are skipped and named) and the lookup of
//! ConfigMaps and Secrets a render names. It must never talk to a cluster or write files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::{IngressClass, IngressClassSpec};

use crate::kubernetes::config_source::Lookup;
use crate::kubernetes::crd::HAProxyConfig;
use crate::kubernetes::routes::Objects;

/// Why a manifest directory cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A file or the directory cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A document does not parse as the kind it names.
    #[error("{path}: document {doc}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The document's index in the file (from 1).
        doc: usize,
        /// What is wrong.
        why: String,
    },
    /// Not exactly one HAProxyConfig.
    #[error("{0}")]
    Config(String),
}

/// What a manifest directory holds.
#[derive(Debug, Clone)]
pub struct Manifests {
    /// The one HAProxyConfig.
    pub config: HAProxyConfig,
    /// The objects render mode reads (every Secret of the directory; the translator reads only
    /// those that Ingresses name).
    pub objects: Objects,
    /// ConfigMaps (a template override).
    pub config_maps: Vec<Arc<ConfigMap>>,
    /// Documents of other kinds, as `Kind name (file)`.
    pub skipped: Vec<String>,
}

impl Lookup for Manifests {
    fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>> {
        let ns = self.config.metadata.namespace.as_deref();
        self.config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name) && same_ns(c.metadata.namespace.as_deref(), ns))
            .cloned()
    }
    fn secret(&self, name: &str) -> Option<Arc<Secret>> {
        let ns = self.config.metadata.namespace.as_deref();
        self.objects
            .secrets
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name) && same_ns(c.metadata.namespace.as_deref(), ns))
            .cloned()
    }
}

/// Namespaces match, an unset one being `default` (as `kubectl apply` would place it).
fn same_ns(a: Option<&str>, b: Option<&str>) -> bool {
    a.unwrap_or("default") == b.unwrap_or("default")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let io = |source| ManifestError::Io { path: dir.to_path_buf(), source };
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).map_err(io)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>().map_err(io)?;
    entries.sort();
    for p in entries {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if crate::bundle::is_ignored_name(&name) {
            continue;
        }
        if p.is_dir() {
            yaml_files(&p, out)?;
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.push(p);
        }
    }
    Ok(())
}

/// An object of a namespaced kind gets `default` when it names no namespace.
fn with_ns(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.entry("namespace").or_insert_with(|| "default".into());
    }
    v
}

/// The documents of a directory, sorted by kind.
struct Docs {
    objects: Objects,
    configs: Vec<(HAProxyConfig, PathBuf)>,
    config_maps: Vec<Arc<ConfigMap>>,
    skipped: Vec<String>,
}

/// Reads every YAML file below `dir`.
pub fn load(dir: &Path) -> Result<Manifests, ManifestError> {
    let Docs { objects, mut configs, config_maps, skipped } = read_docs(dir)?;
    let config = match configs.len() {
        1 => configs.remove(0).0,
        0 => return Err(ManifestError::Config(format!("{}: no HAProxyConfig", dir.display()))),
        _ => {
            let at: Vec<String> = configs
                .iter()
                .map(|(c, p)| format!("{} ({})", c.metadata.name.as_deref().unwrap_or("?"), p.display()))
                .collect();
            return Err(ManifestError::Config(format!("more than one HAProxyConfig: {}", at.join(", "))));
        }
    };
    Ok(Manifests { config, objects, config_maps, skipped })
}

/// The Ingresses of every YAML file below `dir` (no HAProxyConfig needed).
pub fn load_ingresses(dir: &Path) -> Result<Vec<Arc<k8s_openapi::api::networking::v1::Ingress>>, ManifestError> {
    Ok(read_docs(dir)?.objects.ingresses)
}

fn read_docs(dir: &Path) -> Result<Docs, ManifestError> {
    let mut files = Vec::new();
    yaml_files(dir, &mut files)?;
    let mut objects = Objects::default();
    let mut configs: Vec<(HAProxyConfig, PathBuf)> = Vec::new();
    let mut config_maps = Vec::new();
    let mut skipped = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Io { path: path.clone(), source })?;
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).map_err(|e| ManifestError::Parse {
            path: path.clone(),
            doc: 1,
            why: e.to_string(),
        })?;
        let mut flat = Vec::new();
        for (i, d) in docs.into_iter().enumerate() {
            match d.get("kind").and_then(|k| k.as_str()) {
                Some("List") => {
                    for item in d.get("items").and_then(|v| v.as_array()).cloned().unwrap_or_default() {
                        flat.push((i + 1, item));
                    }
                }
                _ if d.is_null() => {}
                _ => flat.push((i + 1, d)),
            }
        }
        for (doc, d) in flat {
            let parse = |why: serde_json::Error| ManifestError::Parse { path: path.clone(), doc, why: why.to_string() };
            let kind = d.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string();
            match kind.as_str() {
                "Ingress" => objects.ingresses.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "IngressClass" => objects.classes.push(Arc::new(serde_json::from_value(d).map_err(parse)?)),
                "GatewayClass" => objects.gateway_classes.push(Arc::new(serde_json::from_value(d).map_err(parse)?)),
                "Gateway" => objects.gateways.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "HTTPRoute" => objects.routes.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "ListenerSet" => {
                    objects.listener_sets.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?))
                }
                "GRPCRoute" => objects.grpc_routes.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "TLSRoute" => objects.tls_routes.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "TCPRoute" => objects.tcp_routes.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "BackendTLSPolicy" => {
                    objects.backend_tls_policies.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?))
                }
                "ReferenceGrant" => objects.grants.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "Namespace" => objects.namespaces.push(Arc::new(serde_json::from_value(d).map_err(parse)?)),
                "Service" => objects.services.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "EndpointSlice" => {
                    objects.endpoint_slices.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?))
                }
                "Secret" => objects.secrets.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "ConfigMap" => config_maps.push(Arc::new(serde_json::from_value(with_ns(d)).map_err(parse)?)),
                "HAProxyConfig" => configs.push((serde_json::from_value(with_ns(d)).map_err(parse)?, path.clone())),
                other => {
                    let name = d.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or("?");
                    skipped.push(format!("{other} {name} ({})", path.display()));
                }
            }
        }
    }
    // The ConfigMaps serve as the spec's lookups and as BackendTLSPolicies' CA certificates.
    objects.config_maps = config_maps.clone();
    Ok(Docs { objects, configs, config_maps, skipped })
}

/// The GatewayClass the chart creates (`gateway.enabled`), for a directory that holds none of
/// that name: `name`, our controller.
pub fn chart_gateway_class(name: &str) -> haptic_render::gateway_api::GatewayClass {
    let mut c = haptic_render::gateway_api::GatewayClass::default();
    c.metadata.name = Some(name.into());
    c.spec.controller_name = haptic_render::gateway::GATEWAY_CONTROLLER.into();
    c
}

/// The IngressClass the chart creates (`ingress.enabled`), for a directory that holds none of
/// that name: `name`, our controller, not the default class.
pub fn chart_class(name: &str) -> IngressClass {
    let mut c = IngressClass::default();
    c.metadata.name = Some(name.into());
    c.spec = Some(IngressClassSpec {
        controller: Some(haptic_render::ingress::INGRESS_CONTROLLER.into()),
        ..Default::default()
    });
    c
}
