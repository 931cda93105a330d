//! Finding the HAProxy binaries tests run against (`HAPTIC_HAPROXY_BINS` or the installed defaults).

use std::path::{Path, PathBuf};
use std::process::Command;

use haptic_haproxy::cli::{parse_version, Version};

/// One HAProxy binary and the version it reports with `haproxy -v`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaproxyBin {
    /// Path of the executable.
    pub path: PathBuf,
    /// `(major, minor, patch)` parsed from `haproxy -v`.
    pub version: Version,
    /// The full version token, e.g. `2.6.12-1+deb12u4`.
    pub version_string: String,
}

impl HaproxyBin {
    /// Runs `path -v` and parses its version.
    pub fn probe(path: impl AsRef<Path>) -> Result<Self, String> {
        let path = path.as_ref().to_path_buf();
        let out =
            Command::new(&path).arg("-v").output().map_err(|e| format!("cannot run {} -v: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let version = parse_version(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let version_string =
            text.lines().next().and_then(|l| l.split_whitespace().nth(2)).unwrap_or_default().to_string();
        Ok(Self { path, version, version_string })
    }

    /// Whether the master CLI `reload` answers `Success=0|1` (HAProxy ≥ 2.7).
    pub fn has_reload_status(&self) -> bool {
        self.version >= (2, 7, 0)
    }

    /// A short label such as `haproxy 2.6.12`.
    pub fn label(&self) -> String {
        let (a, b, c) = self.version;
        format!("haproxy {a}.{b}.{c}")
    }
}

/// The workspace root (the parent of this crate's folder).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The default binaries: Debian's 2.6 and the 3.0, 3.2 and 3.4 installed by
/// `scripts/install-haproxy.sh`.
pub fn default_bin_paths() -> Vec<PathBuf> {
    let installed = ["3.0", "3.2", "3.4"].map(|v| workspace_root().join(format!("target/haproxy/{v}/haproxy")));
    std::iter::once(PathBuf::from("/usr/sbin/haproxy")).chain(installed).collect()
}

/// Every HAProxy binary to test against, from `HAPTIC_HAPROXY_BINS` (colon-separated) or the defaults.
///
/// Panics when a binary is missing or does not run, so no version is skipped silently.
pub fn haproxy_bins() -> Vec<HaproxyBin> {
    let (paths, from_env) = match std::env::var("HAPTIC_HAPROXY_BINS") {
        Ok(v) if !v.trim().is_empty() => {
            (v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect::<Vec<_>>(), true)
        }
        _ => (default_bin_paths(), false),
    };
    paths
        .into_iter()
        .map(|p| {
            if !p.exists() {
                if from_env {
                    panic!("HAProxy binary {} (from HAPTIC_HAPROXY_BINS) does not exist", p.display());
                }
                panic!(
                    "HAProxy binary {} is missing: run scripts/install-haproxy.sh (or set HAPTIC_HAPROXY_BINS)",
                    p.display()
                );
            }
            HaproxyBin::probe(&p).unwrap_or_else(|e| {
                panic!("HAProxy binary {} is unusable ({e}): run scripts/install-haproxy.sh", p.display())
            })
        })
        .collect()
}

/// The HAProxy binary of version `major.minor` among the test binaries (`HAPTIC_HAPROXY_BINS`);
/// panics when there is none, so no version is skipped silently.
pub fn haproxy_bin(major: u32, minor: u32) -> HaproxyBin {
    haproxy_bins()
        .into_iter()
        .find(|b| (b.version.0, b.version.1) == (major, minor))
        .unwrap_or_else(|| panic!("no HAProxy {major}.{minor} among the test binaries (HAPTIC_HAPROXY_BINS)"))
}

/// Makes `fn $name(bin: HaproxyBin)` one test case per HAProxy version, `$name::on_2_6`,
/// `$name::on_3_0`, `$name::on_3_2` and `$name::on_3_4`, so one version's failure cannot hide
/// another's result.
///
/// `on_each_version!(name)` for an `async fn` (a 2-thread tokio runtime),
/// `on_each_version!(name, worker_threads = N)` for more threads, `on_each_version!(sync name)`
/// for a plain `fn`.
#[macro_export]
macro_rules! on_each_version {
    ($name:ident) => {
        $crate::on_each_version!($name, worker_threads = 2);
    };
    ($name:ident, worker_threads = $n:literal) => {
        mod $name {
            $crate::on_each_version!(@async $name, $n, on_2_6 = (2, 6), on_3_0 = (3, 0), on_3_2 = (3, 2), on_3_4 = (3, 4));
        }
    };
    (sync $name:ident) => {
        mod $name {
            $crate::on_each_version!(@sync $name, on_2_6 = (2, 6), on_3_0 = (3, 0), on_3_2 = (3, 2), on_3_4 = (3, 4));
        }
    };
    (@async $name:ident, $n:literal, $($case:ident = ($major:literal, $minor:literal)),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = $n)]
            async fn $case() {
                super::$name($crate::haproxy_bin($major, $minor)).await
            }
        )*
    };
    (@sync $name:ident, $($case:ident = ($major:literal, $minor:literal)),*) => {
        $(
            #[test]
            fn $case() {
                super::$name($crate::haproxy_bin($major, $minor))
            }
        )*
    };
}
