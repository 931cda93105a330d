//! Relative paths inside a config tree, validated when built and when deserialized.
//!
//! Owns the `/v1` path rules: relative, `/`-separated, components `[A-Za-z0-9._-]+`,
//! never `.` or `..`, ≤ 255 bytes a component, ≤ 1024 bytes in all, ≤ 8 levels. It must never
//! let an invalid path exist as a [`RelPath`] value.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most bytes a whole path may have.
pub const MAX_PATH_BYTES: usize = 1024;
/// The most bytes one component may have.
pub const MAX_COMPONENT_BYTES: usize = 255;
/// The most components a path may have.
pub const MAX_DEPTH: usize = 8;
/// The one file every plan must contain.
pub const HAPROXY_CFG: &str = "haproxy.cfg";

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path is empty.
    #[error("path is empty")]
    Empty,
    /// The path starts with `/`.
    #[error("path {0:?} is absolute; paths must be relative to the tree")]
    Absolute(String),
    /// The path has an empty component (`a//b` or a trailing `/`).
    #[error("path {0:?} has an empty component")]
    EmptyComponent(String),
    /// The path has a `.` or `..` component.
    #[error("path {0:?} has a '.' or '..' component")]
    Traversal(String),
    /// A component has a byte outside `[A-Za-z0-9._-]`.
    #[error("path {0:?} has a character outside [A-Za-z0-9._-]")]
    BadChar(String),
    /// A component is longer than 255 bytes.
    #[error("path {0:?} has a component longer than 255 bytes")]
    ComponentTooLong(String),
    /// The path is longer than 1024 bytes.
    #[error("path is longer than 1024 bytes ({0} bytes)")]
    TooLong(usize),
    /// The path has more than 8 components.
    #[error("path {0:?} is deeper than 8 levels")]
    TooDeep(String),
}

/// A validated relative path such as `maps/hosts.map`; ordered bytewise.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(String);

impl RelPath {
    /// Validates `s` against the path rules.
    pub fn new(s: impl Into<String>) -> Result<Self, PathError> {
        let s = s.into();
        validate(&s)?;
        Ok(Self(s))
    }

    /// The path text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path's components.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// Whether this is the main `haproxy.cfg`.
    pub fn is_haproxy_cfg(&self) -> bool {
        self.0 == HAPROXY_CFG
    }

    /// The path of the main config file.
    pub fn haproxy_cfg() -> Self {
        Self(HAPROXY_CFG.to_string())
    }
}

fn validate(s: &str) -> Result<(), PathError> {
    if s.is_empty() {
        return Err(PathError::Empty);
    }
    if s.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong(s.len()));
    }
    if s.starts_with('/') {
        return Err(PathError::Absolute(s.to_string()));
    }
    let mut depth = 0;
    for comp in s.split('/') {
        depth += 1;
        if comp.is_empty() {
            return Err(PathError::EmptyComponent(s.to_string()));
        }
        if comp == "." || comp == ".." {
            return Err(PathError::Traversal(s.to_string()));
        }
        if !comp.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return Err(PathError::BadChar(s.to_string()));
        }
        if comp.len() > MAX_COMPONENT_BYTES {
            return Err(PathError::ComponentTooLong(s.to_string()));
        }
    }
    if depth > MAX_DEPTH {
        return Err(PathError::TooDeep(s.to_string()));
    }
    Ok(())
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl FromStr for RelPath {
    type Err = PathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl AsRef<str> for RelPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Serialize for RelPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_normal_paths() {
        for p in ["haproxy.cfg", "maps/hosts.map", "certs/a-b_c.pem", "a/b/c/d/e/f/g/h", "..a", "a.."] {
            assert!(RelPath::new(p).is_ok(), "{p}");
        }
    }

    #[test]
    fn rejects_each_rule() {
        assert_eq!(RelPath::new(""), Err(PathError::Empty));
        assert!(matches!(RelPath::new("/etc/passwd"), Err(PathError::Absolute(_))));
        assert!(matches!(RelPath::new("a//b"), Err(PathError::EmptyComponent(_))));
        assert!(matches!(RelPath::new("a/"), Err(PathError::EmptyComponent(_))));
        assert!(matches!(RelPath::new("../x"), Err(PathError::Traversal(_))));
        assert!(matches!(RelPath::new("a/./b"), Err(PathError::Traversal(_))));
        assert!(matches!(RelPath::new("a\0b"), Err(PathError::BadChar(_))));
        assert!(matches!(RelPath::new("a b"), Err(PathError::BadChar(_))));
        assert!(matches!(RelPath::new("a\\b"), Err(PathError::BadChar(_))));
        assert!(matches!(RelPath::new("x".repeat(256)), Err(PathError::ComponentTooLong(_))));
        assert!(matches!(RelPath::new("a/".repeat(600) + "a"), Err(PathError::TooLong(_))));
        assert!(matches!(RelPath::new("a/b/c/d/e/f/g/h/i"), Err(PathError::TooDeep(_))));
    }

    #[test]
    fn deserialize_enforces_rules() {
        assert!(serde_json::from_str::<RelPath>("\"../x\"").is_err());
        assert_eq!(serde_json::from_str::<RelPath>("\"maps/a.map\"").unwrap().as_str(), "maps/a.map");
    }
}
