//! What haptic knows about HAProxy, shared by the agent, the controller and the test harness.
//!
//! This crate owns the bootstrap config (`bootstrap`), the `haproxy.cfg` section parser (`cfg`), the files a config makes HAProxy
//! read and how it loads them (`paths`), the structural runtime-claim comparison of two configs
//! (`claim`), the master CLI and runtime API commands and the parsers of their replies (`cli`),
//! the summary of a `haproxy -c` run (`check_output`), the statuses HAProxy has an error page
//! for (`http`), which section, header and sample-fetch argument names go unquoted (`names`), the quoting that turns any string into config, log-format, map and regex text (`quote`), which
//! regular expressions from objects are accepted (`regex`), and
//! what a snippet from an object may contain (`snippet`), and how HAProxy splits a config line into
//! words (`words`). It is pure: it must never do I/O, spawn
//! processes or depend on an async runtime. The wire contract itself lives in `haptic-protocol`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bootstrap;
pub mod cfg;
pub mod check_output;
pub mod claim;
pub mod cli;
pub mod http;
pub mod names;
pub mod paths;
pub mod quote;
pub mod regex;
pub mod snippet;
pub mod words;
