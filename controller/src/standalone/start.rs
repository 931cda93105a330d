//! Standalone start-up: the config directory, the `--agent` list and the epoch file as seams.
//!
//! Owns [`StandaloneSettings`], the default state dir and [`start_standalone`], which checks the
//! settings, claims a new fence term in the epoch file and hands the seams to
//! [`crate::app::start`]. It must never hold deployment logic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::{ConfigDir, EpochFile, StaticEndpoints};
use crate::app::{Running, Settings};
use crate::error::Error;
use crate::seams::FenceHolder;

/// Standalone settings.
#[derive(Debug, Clone)]
pub struct StandaloneSettings {
    /// Common settings.
    pub common: Settings,
    /// The watched render directory.
    pub config_dir: PathBuf,
    /// The agents' URLs.
    pub agents: Vec<String>,
    /// The fence holder identity (default: persisted `<hostname>-<random>`).
    pub identity: Option<String>,
    /// Where the epoch file lives (default: next to the config dir).
    pub state_dir: Option<PathBuf>,
    /// Quiet window before a directory change is read.
    pub settle: Duration,
}

/// The default state dir: `<parent of config dir>/.haptic-controller-<config dir name>`.
pub fn default_state_dir(config_dir: &Path) -> PathBuf {
    let abs = std::path::absolute(config_dir).unwrap_or_else(|_| config_dir.to_path_buf());
    let name = abs.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "render".into());
    abs.parent().unwrap_or(Path::new("/")).join(format!(".haptic-controller-{name}"))
}

/// Starts a standalone controller: the config dir, the `--agent` list and the epoch file.
pub async fn start_standalone(s: StandaloneSettings) -> Result<Running, Error> {
    if !s.config_dir.is_dir() {
        let e = Error::ConfigDir { dir: s.config_dir.clone(), why: "not a directory".into() };
        return Err(Error::flag("--config-dir")(e));
    }
    let endpoints = StaticEndpoints::new(&s.agents).map_err(|e| Error::flag("--agent")(Error::Client(e)))?;
    let state_dir = s.state_dir.clone().unwrap_or_else(|| default_state_dir(&s.config_dir));
    let fence = Arc::new(EpochFile::open(&state_dir, s.identity.clone()).map_err(Error::flag("--state-dir"))?);
    info!(state = %fence.path().display(), identity = %fence.identity(), epoch = fence.epoch(), "claimed a new fence term");
    let renders = ConfigDir::new(&s.config_dir, s.settle);
    crate::app::start(s.common, Box::new(renders), Box::new(endpoints), fence).await
}
