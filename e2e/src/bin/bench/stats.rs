//! Pure statistics over repeated measurements: median, p99, min. It must never time anything
//! itself or do I/O.

use std::time::Duration;

/// Repeated measurements of one quantity (already excluding warm-up).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<f64>,
}

impl Samples {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one measurement.
    pub fn push(&mut self, v: f64) {
        self.values.push(v);
    }

    /// Adds one duration in milliseconds.
    pub fn push_ms(&mut self, d: Duration) {
        self.push(d.as_secs_f64() * 1e3);
    }

    /// How many measurements.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) by the nearest-rank method; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.values.is_empty() {
            return None;
        }
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        let rank = (q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize;
        Some(v[rank.clamp(1, v.len()) - 1])
    }

    /// The median.
    pub fn p50(&self) -> Option<f64> {
        self.quantile(0.5)
    }

    /// The 99th percentile (the maximum below 100 samples).
    pub fn p99(&self) -> Option<f64> {
        self.quantile(0.99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut s = Samples::new();
        assert_eq!(s.p50(), None);
        for v in [5.0, 1.0, 4.0, 2.0, 3.0] {
            s.push(v);
        }
        assert_eq!(s.len(), 5);
        assert_eq!(s.p50(), Some(3.0));
        assert_eq!(s.p99(), Some(5.0));
        assert_eq!(s.quantile(0.0), Some(1.0));
        let mut big = Samples::new();
        for i in 1..=200 {
            big.push(f64::from(i));
        }
        assert_eq!(big.p50(), Some(100.0));
        assert_eq!(big.p99(), Some(198.0));
    }

    #[test]
    fn durations_in_ms() {
        let mut s = Samples::new();
        s.push_ms(Duration::from_micros(1500));
        assert_eq!(s.p50(), Some(1.5));
    }
}
