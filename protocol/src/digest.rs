//! File digests: `sha256:<64 lowercase hex>` of a file's bytes.
//!
//! Owns parsing, printing and computing digests (in memory or streaming over `Read`).
//! It must never accept upper-case hex, another algorithm or a truncated digest.

use std::fmt;
use std::io::Read;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Digest as _;

/// The textual prefix of every digest.
pub const PREFIX: &str = "sha256:";

/// A SHA-256 digest, printed as `sha256:<64 lowercase hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

/// Why a digest text could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// The text does not start with `sha256:`.
    #[error("digest must start with \"sha256:\"")]
    Prefix,
    /// The hex part is not 64 lowercase hex characters.
    #[error("digest must be \"sha256:\" followed by 64 lowercase hex characters")]
    Hex,
}

impl Digest {
    /// Hashes a byte slice.
    pub fn of(bytes: &[u8]) -> Self {
        let mut h = Hasher::new();
        h.update(bytes);
        h.finish()
    }

    /// Hashes everything a reader yields and returns the digest and the byte count.
    pub fn from_reader<R: Read>(mut reader: R) -> std::io::Result<(Self, u64)> {
        let mut h = Hasher::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            h.update(&buf[..n]);
        }
        let len = h.len;
        Ok((h.finish(), len))
    }

    /// Builds a digest from its 32 raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex characters, without the prefix.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// A streaming SHA-256 hasher that yields a [`Digest`].
#[derive(Clone, Default)]
pub struct Hasher {
    inner: sha2::Sha256,
    len: u64,
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hasher").field("len", &self.len).finish()
    }
}

impl Hasher {
    /// Starts an empty hash.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds more bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.inner.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// The number of bytes fed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ends the hash.
    pub fn finish(self) -> Digest {
        Digest(self.inner.finalize().into())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s.strip_prefix(PREFIX).ok_or(DigestError::Prefix)?;
        if hex_part.len() != 64 || !hex_part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Hex);
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| DigestError::Hex)?;
        Ok(Self(out))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        let d = Digest::of(b"abc");
        assert_eq!(d.to_string(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
    }

    #[test]
    fn streaming_matches_slice() {
        let data = vec![7u8; 200_000];
        let (d, n) = Digest::from_reader(&data[..]).unwrap();
        assert_eq!(n, 200_000);
        assert_eq!(d, Digest::of(&data));
    }

    #[test]
    fn rejects_bad_text() {
        let good = Digest::of(b"").to_string();
        assert_eq!("md5:00".parse::<Digest>(), Err(DigestError::Prefix));
        assert_eq!(good.to_uppercase().replace("SHA256", "sha256").parse::<Digest>(), Err(DigestError::Hex));
        assert_eq!(good[..good.len() - 1].parse::<Digest>(), Err(DigestError::Hex));
        assert_eq!(format!("{good}0").parse::<Digest>(), Err(DigestError::Hex));
    }
}
