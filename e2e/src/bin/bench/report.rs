//! Result rows: one per measured figure, printed as a fixed-width table line, collected into the
//! `--json` file and the `--markdown` table. It must never measure anything.

use serde::Serialize;

use crate::stats::Samples;

/// One measured figure of one case on one HAProxy version.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The case name (`runtime_apply`, …).
    pub case: String,
    /// Which figure of the case (a size, `bytes`, `time`, `agent_peak`, …).
    pub metric: String,
    /// The HAProxy version it ran against (`none` for pure cases).
    pub haproxy: String,
    /// haptic's figure (the median when repeated).
    pub haptic: f64,
    /// The floor's figure measured in the same run (the median when repeated).
    pub floor: Option<f64>,
    /// The unit of both figures.
    pub unit: String,
    /// haptic / floor.
    pub ratio: Option<f64>,
    /// Whether haptic's answer was verified right.
    pub correct: bool,
    /// haptic's median and 99th percentile.
    pub haptic_p50: Option<f64>,
    /// haptic's 99th percentile.
    pub haptic_p99: Option<f64>,
    /// The floor's median.
    pub floor_p50: Option<f64>,
    /// The floor's 99th percentile.
    pub floor_p99: Option<f64>,
    /// How many measured repetitions (warm-up excluded).
    pub n: usize,
    /// The goal from the issue, if this figure has one.
    pub goal: Option<String>,
    /// Whether the goal is met.
    pub meets_goal: Option<bool>,
    /// Anything a reader needs to interpret the figure (what was wrong, when not correct).
    pub note: String,
}

impl Row {
    /// A row for a single figure with an optional floor.
    pub fn single(case: &str, metric: &str, haproxy: &str, haptic: f64, floor: Option<f64>, unit: &str) -> Self {
        Self {
            case: case.into(),
            metric: metric.into(),
            haproxy: haproxy.into(),
            haptic,
            floor,
            unit: unit.into(),
            ratio: floor.filter(|f| *f > 0.0).map(|f| haptic / f),
            correct: true,
            haptic_p50: None,
            haptic_p99: None,
            floor_p50: None,
            floor_p99: None,
            n: 1,
            goal: None,
            meets_goal: None,
            note: String::new(),
        }
    }

    /// A row from repeated measurements (figures are medians).
    pub fn repeated(
        case: &str,
        metric: &str,
        haproxy: &str,
        haptic: &Samples,
        floor: Option<&Samples>,
        unit: &str,
    ) -> Self {
        let h = haptic.p50().unwrap_or(f64::NAN);
        let f = floor.and_then(Samples::p50);
        let mut r = Self::single(case, metric, haproxy, h, f, unit);
        r.haptic_p50 = haptic.p50();
        r.haptic_p99 = haptic.p99();
        r.floor_p50 = f;
        r.floor_p99 = floor.and_then(Samples::p99);
        r.n = haptic.len();
        r
    }

    /// Sets a floor figure computed from other measurements (e.g. a sum of two medians).
    pub fn with_floor(mut self, floor: f64) -> Self {
        self.floor = Some(floor);
        self.floor_p50 = Some(floor);
        self.ratio = (floor > 0.0).then(|| self.haptic / floor);
        self
    }

    /// Sets `correct` from a list of verification failures (empty = right).
    pub fn verified(mut self, failures: &[String]) -> Self {
        if !failures.is_empty() {
            self.correct = false;
            let shown: Vec<&str> = failures.iter().take(3).map(String::as_str).collect();
            self.add_note(format!("WRONG ({} failures): {}", failures.len(), shown.join("; ")));
        }
        self
    }

    /// Appends a note.
    pub fn add_note(&mut self, note: impl Into<String>) {
        let note = note.into();
        if note.is_empty() {
            return;
        }
        if !self.note.is_empty() {
            self.note.push_str("; ");
        }
        self.note.push_str(&note);
    }

    /// Sets a goal on the ratio: met when `ratio <= max`.
    pub fn goal_ratio(mut self, max: f64) -> Self {
        self.goal = Some(format!("ratio <= {max}"));
        self.meets_goal = self.ratio.map(|r| r <= max);
        self
    }

    /// Sets a goal on haptic's figure: met when `haptic <= max`.
    pub fn goal_max(mut self, max: f64) -> Self {
        self.goal = Some(format!("{} <= {max}", self.unit));
        self.meets_goal = Some(self.haptic <= max);
        self
    }

    /// Sets a free-form goal and whether it is met.
    pub fn goal(mut self, goal: &str, met: bool) -> Self {
        self.goal = Some(goal.into());
        self.meets_goal = Some(met);
        self
    }
}

/// Sets the "near linear" goal on the last of `rows` (one per size, smallest first): met when the
/// cost per `unit` (`per_unit`, one per row) grew at most `slack` times from the smallest size.
pub fn linear_goal(rows: &mut [Row], per_unit: &[f64], slack: f64, unit: &str) {
    let (lo, hi) = (per_unit.first().copied().unwrap_or(0.0), per_unit.last().copied().unwrap_or(0.0));
    let linear = lo > 0.0 && hi / lo <= slack;
    if let Some(last) = rows.last_mut() {
        let growth = if lo > 0.0 { hi / lo } else { f64::NAN };
        *last = last.clone().goal(&format!("linear (per-{unit} cost within {slack}x across sizes)"), linear);
        last.add_note(format!("per-{unit} cost grew {growth:.2}x from the smallest size"));
    }
}

/// Formats a figure compactly.
pub fn num(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), num)
}

fn pair(a: Option<f64>, b: Option<f64>) -> String {
    if a.is_none() && b.is_none() {
        "-".into()
    } else {
        format!("{}/{}", opt(a), opt(b))
    }
}

fn goal_text(r: &Row) -> String {
    if cfg!(debug_assertions) && r.goal.is_some() {
        // A debug build's timings say nothing about the goals.
        return "not judged (debug build)".into();
    }
    match (&r.goal, r.meets_goal) {
        (Some(g), Some(true)) => format!("ok ({g})"),
        (Some(g), Some(false)) => format!("MISSED ({g})"),
        (Some(g), None) => format!("? ({g})"),
        (None, _) => "-".into(),
    }
}

/// The header of the console table.
pub fn header() -> String {
    format!(
        "{:<20} {:<9} {:<14} {:>10} {:>10} {:>6} {:>7} {:>17} {:>17} {:>4} {:<7} {}",
        "case",
        "haproxy",
        "metric",
        "haptic",
        "floor",
        "unit",
        "ratio",
        "haptic p50/p99",
        "floor p50/p99",
        "n",
        "correct",
        "goal"
    )
}

/// A row's cells, in table order; `no` is how a wrong answer reads.
fn cells(r: &Row, no: &str) -> [String; 12] {
    [
        r.case.to_string(),
        r.haproxy.to_string(),
        r.metric.to_string(),
        num(r.haptic),
        opt(r.floor),
        r.unit.to_string(),
        opt(r.ratio),
        pair(r.haptic_p50, r.haptic_p99),
        pair(r.floor_p50, r.floor_p99),
        r.n.to_string(),
        if r.correct { "yes".to_string() } else { no.to_string() },
        goal_text(r),
    ]
}

/// One console table line.
pub fn line(r: &Row) -> String {
    let c = cells(r, "NO");
    format!(
        "{:<20} {:<9} {:<14} {:>10} {:>10} {:>6} {:>7} {:>17} {:>17} {:>4} {:<7} {}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]
    )
}

/// A Markdown table of every row.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| case | haproxy | metric | haptic | floor | unit | ratio | haptic p50 / p99 | floor p50 / p99 | n | correct | goal |\n\
         |---|---|---|---:|---:|---|---:|---:|---:|---:|---|---|\n",
    );
    for r in rows {
        let mut c = cells(r, "**NO**");
        c[0] = format!("`{}`", c[0]);
        s.push_str(&format!("| {} |\n", c.join(" | ")));
    }
    let notes: Vec<&Row> = rows.iter().filter(|r| !r.note.is_empty()).collect();
    if !notes.is_empty() {
        s.push_str("\nNotes:\n\n");
        for r in notes {
            s.push_str(&format!("- `{}` {} {}: {}\n", r.case, r.haproxy, r.metric, r.note));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_goal_and_correctness() {
        let mut h = Samples::new();
        let mut f = Samples::new();
        for i in 1..=5 {
            h.push(f64::from(i) * 2.0);
            f.push(f64::from(i));
        }
        let r = Row::repeated("runtime_apply", "1 op", "3.0.11", &h, Some(&f), "ms").goal_ratio(3.0);
        assert_eq!(r.ratio, Some(2.0));
        assert_eq!(r.meets_goal, Some(true));
        assert!(r.correct);
        let r = r.verified(&["show servers: wrong addr".into()]);
        assert!(!r.correct);
        assert!(r.note.contains("wrong addr"));
        assert!(line(&r).contains("NO"));
        assert!(markdown(&[r]).contains("**NO**"));
    }

    #[test]
    fn numbers_are_compact() {
        assert_eq!(num(1234.5), "1234");
        assert_eq!(num(12.345), "12.3");
        assert_eq!(num(1.2345), "1.23");
        assert_eq!(num(0.012345), "0.0123");
        assert_eq!(num(f64::NAN), "-");
        assert_eq!(Row::single("x", "m", "h", 1.0, Some(0.0), "ms").ratio, None);
    }
}
