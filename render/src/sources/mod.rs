//! The sources: each API haptic serves routes from, translated into the [`crate::model`].
//!
//! Owns the split between the sources ([`ingress`], [`gateway`]) and what they share
//! ([`common`]: host and path parsing, endpoints, TLS Secrets). Each source reads its own
//! objects and hands back a Model and per-object verdicts. A source must never import another
//! source: what two sources need lives in [`common`] or in the model.

pub mod common;
pub mod gateway;
pub mod ingress;
