//! The record of one step of the bench's `sweep` case (routes swept up and back down under
//! load), shared by the bench, which measures and writes the steps as a JSON array, and by
//! `sweep-plot`, which draws them. It owns the record's shape and the step labels; it must never
//! measure or draw anything.

use serde::{Deserialize, Serialize};

/// Whether a step added routes or removed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Routes were created to reach the step's count (the first step too).
    Up,
    /// Routes were deleted to reach it.
    Down,
}

/// One step of the sweep, measured once every pod served its routes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Up or down.
    pub direction: Direction,
    /// HTTPRoutes in the cluster during the step.
    pub routes: usize,
    /// From the step's last create or delete until every pod answered as it must, ms.
    pub propagate_ms: f64,
    /// Latency of the requests timed during the step (each a new connection), median, ms.
    pub p50_ms: f64,
    /// Their 99th percentile, ms.
    pub p99_ms: f64,
    /// How many requests were timed.
    pub requests: usize,
    /// The controller's resident memory at the end of the step, MiB.
    pub controller_mib: f64,
    /// Each pod's HAProxy (master and worker) resident memory at the end of the step, MiB.
    pub haproxy_mib: Vec<f64>,
}

impl Step {
    /// The label a table or plot gives the step: `300↑`, `300↓`.
    pub fn label(&self) -> String {
        let arrow = match self.direction {
            Direction::Up => '↑',
            Direction::Down => '↓',
        };
        format!("{}{arrow}", self.routes)
    }

    /// The largest pod's HAProxy memory, MiB (0 without pods).
    pub fn haproxy_max_mib(&self) -> f64 {
        self.haproxy_mib.iter().copied().fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_reads_back_what_was_written_and_labels_its_direction() {
        let s = Step {
            direction: Direction::Down,
            routes: 300,
            propagate_ms: 120.5,
            p50_ms: 0.8,
            p99_ms: 2.5,
            requests: 2000,
            controller_mib: 61.0,
            haproxy_mib: vec![20.0, 22.5, 21.0],
        };
        let text = serde_json::to_string(std::slice::from_ref(&s)).expect("serialize");
        assert!(text.contains(r#""direction":"down""#), "{text}");
        let back: Vec<Step> = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, vec![s.clone()]);
        assert_eq!(s.label(), "300↓");
        assert!((s.haproxy_max_mib() - 22.5).abs() < f64::EPSILON);
    }
}
