//! The GitHub Actions workflows under `.github/workflows/`, checked with the real `actionlint`
//! (expressions, job and step wiring, action inputs, runner labels, and each `run:` script through
//! shellcheck when shellcheck is on `PATH`, as `scripts/test.sh` makes sure), and the release
//! workflow's targets against the chart: it must push the images the chart's defaults pull.
//!
//! Needs `scripts/install-actionlint.sh` (or `HAPTIC_ACTIONLINT`) to have run.

use std::path::PathBuf;
use std::process::Command;

use haptic_e2e::bins::workspace_root;
use haptic_e2e::tools::{actionlint_bin, chart_dir};
use serde_json::Value;

fn workflows() -> Vec<PathBuf> {
    let dir = workspace_root().join(".github/workflows");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    files
}

fn yaml(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn actionlint_passes_on_every_workflow() {
    let files = workflows();
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for expected in ["e2e-kind.yml", "release.yml"] {
        assert!(names.iter().any(|n| n == expected), "no .github/workflows/{expected} (found {names:?})");
    }
    let out = Command::new(actionlint_bin())
        .arg("-no-color")
        .args(&files)
        .current_dir(workspace_root())
        .output()
        .expect("actionlint runs");
    assert!(
        out.status.success(),
        "actionlint refused the workflows:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_release_pushes_what_the_chart_pulls() {
    let release = yaml(&workspace_root().join(".github/workflows/release.yml"));
    let values = yaml(&chart_dir().join("values.yaml"));
    let prefix = release["env"]["IMAGE_PREFIX"].as_str().expect("release.yml env.IMAGE_PREFIX");
    let components = &release["jobs"]["image"]["strategy"]["matrix"]["component"];
    for component in ["agent", "controller"] {
        assert!(
            components.as_array().unwrap().iter().any(|c| c == component),
            "release.yml builds no {component} image: {components}"
        );
        let repository = values["images"][component]["repository"].as_str().unwrap();
        assert_eq!(
            repository,
            format!("{prefix}-{component}"),
            "the chart pulls {repository}; the release pushes another"
        );
        let dockerfile = workspace_root().join(format!("Dockerfile.{component}"));
        assert!(dockerfile.is_file(), "{} is missing", dockerfile.display());
    }
    // Both platforms, SBOM and provenance on every image build.
    let platforms = &release["jobs"]["image"]["strategy"]["matrix"]["platform"];
    for platform in ["linux/amd64", "linux/arm64"] {
        assert!(platforms.as_array().unwrap().iter().any(|p| p == platform), "release.yml builds no {platform}");
    }
    let build = release["jobs"]["image"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("docker/build-push-action@")))
        .expect("release.yml builds with docker/build-push-action");
    assert_eq!(build["with"]["sbom"], Value::Bool(true), "the image build has no SBOM");
    assert_eq!(build["with"]["provenance"], "mode=max", "the image build has no max-mode provenance");
    // The chart is packaged by the project's script and pushed to the OCI repository.
    let chart_steps = release["jobs"]["chart"]["steps"].to_string();
    assert!(chart_steps.contains("scripts/package-chart.sh"), "the chart job does not run scripts/package-chart.sh");
    assert!(chart_steps.contains("push"), "the chart job pushes nothing");
    assert_eq!(release["env"]["CHART_REPO"], "oci://ghcr.io/haptic/charts");
}
