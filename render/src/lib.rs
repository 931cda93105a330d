//! haptic-render: from cluster objects to HAProxy configuration.
//!
//! Owns the pure pipeline `objects + last slot map → Model → Render`: the [`model`] types, the
//! [`sources`] (the Ingress translator [`ingress`] and its [`annotations`], the Gateway API types
//! [`gateway_api`] and translator [`gateway`], and what they share), slot planning ([`slots`]), map building
//! ([`maps`]) and the names maps and config share ([`names`]), the templates ([`template`]), and the gate-narrowing decision ([`narrow`]: which
//! changed objects to leave out after the gate refuses a render), and host ownership
//! ([`ownership`]: which namespace may route a host), and [`Incremental`]: the Ingress render
//! that, while only EndpointSlices changed, redoes only the endpoints, slots and template. It
//! must never talk to a
//! cluster, spawn tasks or touch files: inputs
//! are plain typed objects, outputs are bytes by relative path plus per-object verdicts. Every
//! value from an object reaches `haproxy.cfg` only through `haptic_haproxy::quote` or as a map
//! entry; route semantics are decided in Rust here, never in template logic.

pub mod edge;
pub mod maps;
pub mod mirror;
pub mod model;
pub mod names;
pub mod narrow;
pub mod ownership;
pub mod pem;
pub mod skeleton;
pub mod slots;
pub mod sources;
pub mod template;

pub use sources::gateway::{self, api as gateway_api};
pub use sources::ingress::{self, annotations};

use std::collections::BTreeMap;

pub use ingress::{snippet_checks, translate_ingress, Incremental, IngressInput, SnippetCheck};
pub use model::{Cause, Model, ObjectRef, Refusal, Verdict, Why};
pub use slots::SlotMap;
pub use template::{Snippets, Templates};

/// Why a render failed as a whole (per-object problems are [`Verdict`]s, never this).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The template failed (syntax, undefined value, fuel or output cap).
    #[error("template: {0}")]
    Template(String),
    /// A value the translator accepted could not be written (a bug: the translator checks).
    #[error("quoting: {0}")]
    Quote(#[from] haptic_haproxy::quote::Inexpressible),
}

/// The rendered configuration tree: relative path → bytes (`haproxy.cfg`, `maps/…`, `certs/…`),
/// the per-object verdicts and the slot map to keep for the next render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Render {
    /// Files by path relative to the config directory.
    pub files: BTreeMap<String, Vec<u8>>,
    /// One verdict per considered object, sorted by object.
    pub verdicts: Vec<Verdict>,
    /// Endpoint → slot assignments of this render (input to the next one).
    pub slots: SlotMap,
    /// When each served TLS certificate expires, by the Secret it came from.
    pub certificates: Vec<CertExpiry>,
}

/// When a served certificate expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertExpiry {
    /// The Secret it came from.
    pub source: ObjectRef,
    /// Its earliest notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// The expiry of every certificate `model` serves to clients.
pub fn certificates(model: &Model) -> Vec<CertExpiry> {
    model.certs.iter().map(|c| CertExpiry { source: c.source.clone(), not_after: c.not_after }).collect()
}

/// Translates the Ingress input and renders it: the one entry the controller calls.
pub fn render(input: &IngressInput, templates: &Templates) -> Result<Render, RenderError> {
    let (model, verdicts, slots) = translate_ingress(input);
    render_model(&model, verdicts, slots, templates)
}

/// Translates the Gateway API input and renders it; the statuses come back beside the render.
pub fn render_gateway(
    input: &gateway::GatewayInput,
    templates: &Templates,
) -> Result<(Render, gateway::GatewayOutput), RenderError> {
    let mut out = gateway::translate_gateway(input);
    let render = render_model(&out.model, std::mem::take(&mut out.verdicts), out.slots.clone(), templates)?;
    out.verdicts = render.verdicts.clone();
    Ok((render, out))
}

/// Renders a translated Model.
pub fn render_model(
    model: &Model,
    verdicts: Vec<Verdict>,
    slots: SlotMap,
    templates: &Templates,
) -> Result<Render, RenderError> {
    let mut files = model_files(model)?;
    let cfg = template::render_cfg(model, templates)?;
    files.insert("haproxy.cfg".to_string(), cfg.into_bytes());
    Ok(Render { files, verdicts, slots, certificates: certificates(model) })
}

/// The files of a Model but `haproxy.cfg`: its maps, certificates and the mirror's script. None
/// of them depends on the Model's backends.
fn model_files(model: &Model) -> Result<BTreeMap<String, Vec<u8>>, RenderError> {
    let mut files = maps::build(model)?;
    for cert in model.certs.iter().chain(&model.upstream_certs) {
        files.insert(cert.path.clone(), cert.pem.clone());
    }
    if let Some(d) = &model.edge.default_certificate {
        files.insert(edge::DEFAULT_CERTIFICATE_PATH.to_string(), d.pem.clone());
    }
    if mirror::used(model) {
        files.insert(mirror::SCRIPT_PATH.to_string(), mirror::SCRIPT.as_bytes().to_vec());
    }
    Ok(files)
}
