//! What haptic knows about HAProxy, shared by the agent, the controller and the test harness.
//!
//! This crate owns the `haproxy.cfg` section parser and the files a config makes HAProxy read
//! (`cfg`), the structural runtime-claim comparison of two configs (`claim`), and the parsers of
//! HAProxy's master CLI and runtime API replies (`cli`). It is pure: it must never do I/O, spawn
//! processes or depend on an async runtime. The wire contract itself lives in `haptic-protocol`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cfg;
pub mod claim;
pub mod cli;
pub mod paths;
