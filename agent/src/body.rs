//! Streaming decode of a `POST /v1/apply` body (the JSON of [`haptic_protocol::ApplyRequest`], unchanged on the wire).
//!
//! Owns turning the body, as its bytes arrive, into an [`ApplyRequest`] without `parts` plus one
//! spool file per part under `ROOT/.incoming/<id>/`, decoded (`utf8` or `base64`) and hashed on
//! the way. An apply so holds at most one part's encoded text in memory (serde_json's string
//! buffer) and never the whole body, nor its decoded parts. It also owns the body's bounds while it
//! is read: `--max-body` (413), `--body-timeout` (408) and `--body-stall-timeout` (408: no new byte for that
//! long, so a client that stops sending frees its connection). It must never touch the live tree,
//! `.state` or HAProxy, and it never trusts a part: [`Spool::checked`] compares every part with
//! `files` before anything is staged.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use base64::Engine as _;
use futures::StreamExt as _;
use haptic_protocol::api::ApplyError;
use haptic_protocol::{ApplyRequest, Digest, FileEntry, Hasher, RelPath};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use tokio::sync::mpsc;

use crate::tree::PartData;

/// The directory of request spools, relative to the root.
pub const INCOMING_DIR: &str = ".incoming";

/// How many body chunks may wait between the socket and the decoder.
const CHANNEL_CHUNKS: usize = 8;

/// Base64 text decoded per step (a multiple of 4: only the last step may hold padding).
const B64_STEP: usize = 64 * 1024;

/// One part, decoded into its spool file.
#[derive(Debug, Clone)]
pub struct SpooledPart {
    /// The spool file (moved into the staged tree).
    pub file: PathBuf,
    /// The digest of its bytes.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
}

/// The parts of one request, decoded to files; the directory is removed when this is dropped.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    next: u64,
    parts: BTreeMap<RelPath, SpooledPart>,
    /// A local I/O failure while spooling (a 500, not the client's fault).
    io_error: Option<String>,
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Spool {
    /// A new, empty spool directory under `ROOT/.incoming`.
    pub fn create(root: &Path) -> io::Result<Self> {
        let base = root.join(INCOMING_DIR);
        fs::create_dir_all(&base)?;
        let dir = base.join(crate::tree::Tree::new_id());
        fs::create_dir(&dir)?;
        Ok(Self { dir, next: 0, parts: BTreeMap::new(), io_error: None })
    }

    /// Removes every spool left by an earlier run (nothing reads them after a restart).
    pub fn clear_leftovers(root: &Path) {
        let _ = fs::remove_dir_all(root.join(INCOMING_DIR));
    }

    /// The parts spooled so far.
    pub fn parts(&self) -> &BTreeMap<RelPath, SpooledPart> {
        &self.parts
    }

    /// Checks every part against `files` (listed, size, digest), like
    /// [`ApplyRequest::take_checked_parts`] does for parts held in memory, and hands them out for
    /// staging. The spool (its directory) must outlive the staging.
    pub fn checked(&self, files: &[FileEntry]) -> Result<BTreeMap<RelPath, PartData>, ApplyError> {
        let index: BTreeMap<&RelPath, &FileEntry> = files.iter().map(|f| (&f.path, f)).collect();
        let mut out = BTreeMap::new();
        for (path, part) in &self.parts {
            let entry = index.get(path).ok_or_else(|| ApplyError::UnlistedPart(path.clone()))?;
            if part.size != entry.size {
                return Err(ApplyError::PartSize { path: path.clone(), declared: entry.size, actual: part.size });
            }
            if part.digest != entry.digest {
                return Err(ApplyError::PartDigest { path: path.clone(), declared: entry.digest, actual: part.digest });
            }
            out.insert(path.clone(), PartData::Spooled { file: part.file.clone(), digest: part.digest });
        }
        Ok(out)
    }

    fn new_file(&mut self) -> io::Result<(PathBuf, File)> {
        self.next += 1;
        let p = self.dir.join(format!("p{}", self.next));
        let f = OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(&p)?;
        Ok((p, f))
    }

    /// Writes one part's text (decoding base64) into a new spool file.
    fn write_part(&mut self, path: RelPath, text: &str, b64: bool) -> Result<(), PartFail> {
        let (file, f) = self.new_file().map_err(|e| self.local(e))?;
        let mut w = io::BufWriter::with_capacity(64 * 1024, f);
        let mut h = Hasher::new();
        let mut put = |bytes: &[u8], w: &mut io::BufWriter<File>| {
            h.update(bytes);
            w.write_all(bytes)
        };
        let res: Result<(), PartFail> = if b64 {
            let mut buf = vec![0u8; B64_STEP / 4 * 3];
            let mut out = Ok(());
            for chunk in text.as_bytes().chunks(B64_STEP) {
                match base64::engine::general_purpose::STANDARD.decode_slice(chunk, &mut buf) {
                    Ok(n) => {
                        if let Err(e) = put(&buf[..n], &mut w) {
                            out = Err(PartFail::Local(e.to_string()));
                            break;
                        }
                    }
                    Err(e) => {
                        out = Err(PartFail::Client(ApplyError::BadBase64(e.to_string()).to_string()));
                        break;
                    }
                }
            }
            out
        } else {
            put(text.as_bytes(), &mut w).map_err(|e| PartFail::Local(e.to_string()))
        };
        let res = res.and_then(|()| w.flush().map_err(|e| PartFail::Local(e.to_string())));
        if let Err(e) = res {
            let _ = fs::remove_file(&file);
            if let PartFail::Local(m) = &e {
                self.io_error = Some(m.clone());
            }
            return Err(e);
        }
        let size = h.len();
        if let Some(old) = self.parts.insert(path, SpooledPart { file, digest: h.finish(), size }) {
            // A repeated key: the last one wins, as a map decoded in memory would have it.
            let _ = fs::remove_file(old.file);
        }
        Ok(())
    }

    fn local(&mut self, e: io::Error) -> PartFail {
        let m = format!("spooling a part under {}: {e}", self.dir.display());
        self.io_error = Some(m.clone());
        PartFail::Local(m)
    }
}

enum PartFail {
    Client(String),
    Local(String),
}

impl fmt::Display for PartFail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartFail::Client(m) | PartFail::Local(m) => f.write_str(m),
        }
    }
}

/// Why a body could not be turned into a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Over `--max-body` (413).
    TooLarge(usize),
    /// Did not arrive within `--body-timeout` (408).
    TimedOut(Duration),
    /// No new byte within `--body-stall-timeout` (408).
    Stalled(Duration),
    /// The connection failed while reading (400).
    Read(String),
    /// Not a valid apply request (400).
    Malformed(String),
    /// The agent could not spool it (500).
    Local(String),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::TooLarge(max) => write!(f, "body is over the limit of {max} bytes"),
            BodyError::TimedOut(d) => write!(f, "the body did not arrive within {d:?}"),
            BodyError::Stalled(d) => write!(f, "the body made no progress for {d:?}"),
            BodyError::Read(m) => write!(f, "cannot read body: {m}"),
            BodyError::Malformed(m) => write!(f, "malformed apply request: {m}"),
            BodyError::Local(m) => write!(f, "cannot spool the request: {m}"),
        }
    }
}

/// How long a body may take to arrive: all of it, and each next chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimes {
    /// The whole body (`--body-timeout`).
    pub whole: Duration,
    /// Between two chunks, and before the first (`--body-stall-timeout`).
    pub stall: Duration,
}

/// Reads the body of an apply as it arrives and decodes it off the async runtime: at most `max`
/// bytes within `times.whole`, never `times.stall` without a new chunk. Returns the request
/// (with no `parts`) and its spooled parts. On an error the unread rest of the body is dropped,
/// so the server closes the connection after its answer.
pub async fn decode_apply(
    root: &Path,
    body: axum::body::Body,
    max: usize,
    times: BodyTimes,
) -> Result<(ApplyRequest, Spool), BodyError> {
    let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
    let failed: Arc<Mutex<Option<BodyError>>> = Arc::new(Mutex::new(None));
    let spool = Spool::create(root).map_err(|e| BodyError::Local(e.to_string()))?;
    let decoder = {
        let failed = failed.clone();
        tokio::task::spawn_blocking(move || {
            let reader = ChannelReader { rx, cur: Bytes::new(), failed };
            decode_from(BufReader::with_capacity(64 * 1024, reader), spool)
        })
    };
    let pump = async {
        let mut stream = body.into_data_stream();
        let mut total = 0usize;
        loop {
            let Ok(next) = tokio::time::timeout(times.stall, stream.next()).await else {
                return Err(BodyError::Stalled(times.stall));
            };
            let Some(chunk) = next else { break };
            match chunk {
                Err(e) => return Err(BodyError::Read(e.to_string())),
                Ok(b) => {
                    total += b.len();
                    if total > max {
                        return Err(BodyError::TooLarge(max));
                    }
                    if tx.send(b).await.is_err() {
                        // The decoder stopped (a malformed body): its error is the answer.
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    };
    let pumped = match tokio::time::timeout(times.whole, pump).await {
        Err(_) => Err(BodyError::TimedOut(times.whole)),
        Ok(r) => r,
    };
    if let Err(e) = pumped {
        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
    drop(tx);
    let decoded = decoder.await.map_err(|e| BodyError::Local(format!("decoder task failed: {e}")))?;
    // A failure of the body itself (size, time, connection) is the answer, whatever the decoder
    // made of the truncated text.
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    decoded
}

/// A blocking [`Read`] over the chunks the pump sends; after the last one, an error if the pump
/// recorded one (so a cut body is never decoded as if complete).
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
    failed: Arc<Mutex<Option<BodyError>>>,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => {
                    return match self.failed.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                        Some(e) => Err(io::Error::other(e.to_string())),
                        None => Ok(0),
                    };
                }
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// Decodes one apply body from `reader` into `spool`. Blocking.
pub fn decode_from(reader: impl Read, mut spool: Spool) -> Result<(ApplyRequest, Spool), BodyError> {
    let mut de = serde_json::Deserializer::from_reader(reader);
    let fields = RequestSeed { spool: &mut spool }.deserialize(&mut de).and_then(|f| de.end().map(|()| f));
    let fields = match fields {
        Ok(f) => f,
        Err(e) => {
            return Err(match spool.io_error.take() {
                Some(m) => BodyError::Local(m),
                None => BodyError::Malformed(e.to_string()),
            })
        }
    };
    let req: ApplyRequest =
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| BodyError::Malformed(e.to_string()))?;
    Ok((req, spool))
}

/// The request object: `parts` is spooled; every other field is kept (small) and decoded by
/// [`ApplyRequest`]'s own rules afterwards, so the field names, defaults and checks stay the
/// protocol crate's.
struct RequestSeed<'a> {
    spool: &'a mut Spool,
}

impl<'de> DeserializeSeed<'de> for RequestSeed<'_> {
    type Value = serde_json::Map<String, serde_json::Value>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RequestSeed<'_> {
    type Value = serde_json::Map<String, serde_json::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an apply request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "parts" {
                map.next_value_seed(PartsSeed { spool: &mut *self.spool })?;
            } else {
                let v: serde_json::Value = map.next_value()?;
                if fields.insert(key.clone(), v).is_some() {
                    return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
                }
            }
        }
        Ok(fields)
    }
}

/// `parts`: `{ "<path>": {"utf8": "..."} | {"base64": "..."}, ... }`.
struct PartsSeed<'a> {
    spool: &'a mut Spool,
}

impl<'de> DeserializeSeed<'de> for PartsSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PartsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of path to part")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(path) = map.next_key::<RelPath>()? {
            map.next_value_seed(PartSeed { spool: &mut *self.spool, path })?;
        }
        Ok(())
    }
}

/// One part: exactly one of `utf8` or `base64`.
struct PartSeed<'a> {
    spool: &'a mut Spool,
    path: RelPath,
}

impl<'de> DeserializeSeed<'de> for PartSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PartSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a part: {\"utf8\": text} or {\"base64\": text}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some(kind) = map.next_key::<String>()? else {
            return Err(de::Error::custom(format_args!("part {}: expected utf8 or base64", self.path)));
        };
        let b64 = match kind.as_str() {
            "utf8" => false,
            "base64" => true,
            other => return Err(de::Error::unknown_variant(other, &["utf8", "base64"])),
        };
        map.next_value_seed(TextSink { spool: self.spool, path: self.path.clone(), b64 })?;
        if let Some(extra) = map.next_key::<String>()? {
            let _: IgnoredAny = map.next_value()?;
            return Err(de::Error::custom(format_args!("part {}: unexpected second key `{extra}`", self.path)));
        }
        Ok(())
    }
}

/// A part's text, written to its spool file as soon as it is read.
struct TextSink<'a> {
    spool: &'a mut Spool,
    path: RelPath,
    b64: bool,
}

impl<'de> DeserializeSeed<'de> for TextSink<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TextSink<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.spool.write_part(self.path, s, self.b64).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_protocol::Part;

    fn spool() -> (tempfile::TempDir, Spool) {
        let d = tempfile::tempdir().unwrap();
        let s = Spool::create(d.path()).unwrap();
        (d, s)
    }

    fn body(parts: serde_json::Value) -> String {
        serde_json::json!({
            "fence": {"epoch": 1, "seq": 1, "holder": "t"},
            "baseline": null,
            "plan_id": format!("sha256:{}", "0".repeat(64)),
            "mode": "reload",
            "files": [],
            "parts": parts,
            "future_field": {"ignored": [1, 2]},
        })
        .to_string()
    }

    #[test]
    fn parts_are_decoded_to_files_with_their_digests() {
        let bin: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
        let parts = serde_json::json!({
            "haproxy.cfg": Part::from_bytes(b"global\n"),
            "files/bin": Part::from_bytes(&bin),
        });
        let (_d, s) = spool();
        let (req, s) = decode_from(body(parts).as_bytes(), s).unwrap();
        assert!(req.parts.is_empty());
        assert_eq!(req.fence.holder, "t");
        let got = s.parts();
        assert_eq!(got.len(), 2);
        let b = &got[&RelPath::new("files/bin").unwrap()];
        assert_eq!((b.digest, b.size), (Digest::of(&bin), bin.len() as u64));
        assert_eq!(fs::read(&b.file).unwrap(), bin);
        let c = &got[&RelPath::haproxy_cfg()];
        assert_eq!(fs::read(&c.file).unwrap(), b"global\n");
    }

    #[test]
    fn bad_parts_are_malformed_and_leave_no_file() {
        for parts in [
            serde_json::json!({"a": {"base64": "!!!!"}}),
            serde_json::json!({"a": {"base64": "QQ"}}),
            serde_json::json!({"a": {"hex": "00"}}),
            serde_json::json!({"a": {"utf8": "x", "base64": "eA=="}}),
            serde_json::json!({"../a": {"utf8": "x"}}),
            serde_json::json!({"a": "x"}),
        ] {
            let (d, s) = spool();
            let err = decode_from(body(parts.clone()).as_bytes(), s).unwrap_err();
            assert!(matches!(err, BodyError::Malformed(_)), "{parts}: {err:?}");
            assert!(fs::read_dir(d.path().join(INCOMING_DIR)).unwrap().next().is_none(), "{parts}: spool removed");
        }
        let (_d, s) = spool();
        assert!(matches!(decode_from(&b"{\"fence\": "[..], s), Err(BodyError::Malformed(_))));
    }

    #[test]
    fn base64_in_steps_equals_a_whole_decode() {
        let bin: Vec<u8> = (0..B64_STEP * 2 + 7).map(|i| (i * 31 % 251) as u8).collect();
        let (_d, mut s) = spool();
        let text = base64::engine::general_purpose::STANDARD.encode(&bin);
        assert!(s.write_part(RelPath::new("x").unwrap(), &text, true).is_ok());
        let p = &s.parts()[&RelPath::new("x").unwrap()];
        assert_eq!(fs::read(&p.file).unwrap(), bin);
    }
}
