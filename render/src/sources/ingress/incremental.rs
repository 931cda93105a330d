//! The Ingress render that redoes only what endpoints change: [`Incremental`] keeps what its
//! last render translated (the Model but its backends, the verdicts, what each backend wants,
//! the map and certificate files) and, while every input but the EndpointSlices and the
//! previous slot map is the same, redoes only the backends' endpoints and slots and the
//! template.
//!
//! Owns the proof that the kept translation still holds: every Ingress, Service and Secret the
//! same `Arc` ([`Arc::ptr_eq`], in the same order) as last time, and the class, settings, allowed
//! annotations, refused snippets, left-out objects and host sharing equal (`==`); anything else
//! is a full translation. It must never serve a translation whose inputs it has not proven
//! unchanged, nor give other bytes, verdicts or slots than [`crate::render`] of the same input.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

use super::annotations::Allowed;
use super::{translate_routes, IngressInput, Settings, Translated};
use crate::model::ObjectRef;
use crate::narrow::Exclusion;
use crate::ownership::HostSharing;
use crate::{model_files, template, Render, RenderError, Templates};

/// A stateful Ingress render: [`Incremental::render`] gives what [`crate::render`] gives, reusing
/// the last translation when only endpoints (or the previous slot map) changed.
#[derive(Debug, Default)]
pub struct Incremental {
    last: Option<Kept>,
    reused: bool,
}

/// The last translation and the inputs it holds for.
#[derive(Debug)]
struct Kept {
    of: Key,
    translated: Translated,
    /// The maps and certificates of `translated` (none depends on backends).
    files: BTreeMap<String, Vec<u8>>,
}

/// Every input a translation reads but the EndpointSlices and the previous slot map. The
/// objects are held (not only their addresses), so an `Arc` equal by pointer is the same,
/// unchanged object.
#[derive(Debug)]
struct Key {
    class: IngressClass,
    ingresses: Vec<Arc<Ingress>>,
    services: Vec<Arc<Service>>,
    secrets: Vec<Arc<Secret>>,
    settings: Settings,
    allowed: Allowed,
    refused_snippets: BTreeMap<String, String>,
    excluded: BTreeMap<ObjectRef, Exclusion>,
    sharing: HostSharing,
}

impl Key {
    fn of(input: &IngressInput) -> Self {
        Key {
            class: input.class.clone(),
            ingresses: input.ingresses.clone(),
            services: input.services.clone(),
            secrets: input.secrets.clone(),
            settings: input.settings.clone(),
            allowed: input.allowed,
            refused_snippets: input.refused_snippets.clone(),
            excluded: input.excluded.clone(),
            sharing: input.sharing,
        }
    }

    /// Whether `input` has the very objects and equal settings this key was taken of.
    fn holds(&self, input: &IngressInput) -> bool {
        same(&self.ingresses, &input.ingresses)
            && same(&self.services, &input.services)
            && same(&self.secrets, &input.secrets)
            && self.settings == input.settings
            && self.allowed == input.allowed
            && self.sharing == input.sharing
            && self.excluded == input.excluded
            && self.refused_snippets == input.refused_snippets
            && self.class == input.class
    }
}

/// Whether `a` and `b` hold the same objects (by pointer) in the same order.
fn same<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

impl Incremental {
    /// A render keeping nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Renders `input` as [`crate::render`] does, translating its routes again only when an input
    /// other than the EndpointSlices and the previous slot map changed.
    pub fn render(&mut self, input: &IngressInput, templates: &Templates) -> Result<Render, RenderError> {
        let kept = match self.last.take() {
            Some(k) if k.of.holds(input) => {
                self.reused = true;
                k
            }
            _ => {
                self.reused = false;
                let translated = translate_routes(input);
                let files = model_files(&translated.model)?;
                Kept { of: Key::of(input), translated, files }
            }
        };
        let kept = self.last.insert(kept);
        let t = &mut kept.translated;
        let (backends, slots) = t.wants.backends(input);
        t.model.backends = backends;
        let cfg = template::render_cfg(&t.model, templates)?;
        let mut files = kept.files.clone();
        files.insert("haproxy.cfg".to_string(), cfg.into_bytes());
        Ok(Render { files, verdicts: t.verdicts.clone(), slots })
    }

    /// Whether the last [`Incremental::render`] reused the translation before it.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Forgets the kept translation: the next render translates in full.
    pub fn clear(&mut self) {
        self.last = None;
    }
}
