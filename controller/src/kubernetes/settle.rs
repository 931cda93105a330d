//! The settle policy: when a burst of watch events is rendered.
//!
//! Owns [`Change`] (what one event changed), [`Settle`] (the quiet windows) and [`Burst`], the
//! pure timekeeping of one burst: rendered a window after its last change, never later than
//! [`MAX_SETTLE_WINDOWS`] windows after its first, and a lone change to a cluster object (a new
//! route) after the short window only. It must never sleep, watch or render: the feed loop
//! ([`super::feed`]) asks it when, and waits.

use std::time::Duration;

use tokio::time::Instant;

/// What one watch event changed: only endpoints (an EndpointSlice), a cluster object render
/// mode reads, or the resource and what it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// An EndpointSlice: a render of it is at most runtime server changes.
    Endpoints,
    /// A cluster object render mode reads other than an EndpointSlice: an Ingress, a route, a
    /// Gateway, a Service... Each is whole in itself, so one alone is rendered soon.
    Cluster,
    /// The resource, or a ConfigMap or Secret it names: edits that often come together (a
    /// ConfigMap and the resource), so they always wait the long window.
    Objects,
}

/// The quiet windows before a burst of changes is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle {
    /// After a change to the resource or any object but an EndpointSlice (`--settle`): long
    /// enough that a ConfigMap and the resource edited together land in one render.
    pub objects: Duration,
    /// After a burst of EndpointSlice changes only, or one lone change to a cluster object
    /// (`--endpoint-settle`, never longer than `objects`): short, so a new endpoint or a new
    /// route serves soon.
    pub endpoints: Duration,
}

/// How many windows a burst of changes may hold a render back at most.
pub const MAX_SETTLE_WINDOWS: u32 = 2;

/// A burst of changes being settled: pure timekeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    first: Instant,
    last: Instant,
    endpoints_only: bool,
    /// The burst is one change to a cluster object so far.
    lone_cluster: bool,
}

impl Burst {
    /// A burst that began with `change` at `at`.
    pub fn new(at: Instant, change: Change) -> Self {
        Burst {
            first: at,
            last: at,
            endpoints_only: change == Change::Endpoints,
            lone_cluster: change == Change::Cluster,
        }
    }

    /// `change` joined the burst at `at`.
    pub fn add(&mut self, at: Instant, change: Change) {
        self.last = at;
        self.endpoints_only &= change == Change::Endpoints;
        self.lone_cluster = false;
    }

    /// When the burst is rendered: a window after its last change, and never later than
    /// [`MAX_SETTLE_WINDOWS`] windows after its first, so changes that never pause still render.
    /// The window is `settle.endpoints` while the burst holds EndpointSlice changes only, and
    /// while it is one change to a cluster object: a lone new route renders after the short
    /// window; a second change within it turns the burst into an ordinary one, which coalesces.
    pub fn due(&self, settle: Settle) -> Instant {
        let short = settle.endpoints.min(settle.objects);
        if self.lone_cluster {
            return self.first + short;
        }
        let window = if self.endpoints_only { short } else { settle.objects };
        (self.last + window).min(self.first + window * MAX_SETTLE_WINDOWS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_burst_settles_after_its_last_change_but_a_stream_within_two_windows() {
        let ms = |n: u64| Duration::from_millis(n);
        let settle = Settle { objects: ms(300), endpoints: ms(50) };
        let t0 = tokio::time::Instant::now();
        let burst = |changes: &[(u64, Change)]| {
            let mut b = Burst::new(t0 + ms(changes[0].0), changes[0].1);
            for (at, c) in &changes[1..] {
                b.add(t0 + ms(*at), *c);
            }
            b.due(settle)
        };
        use Change::{Endpoints as E, Objects as O};
        // One change: a window after it.
        assert_eq!(burst(&[(0, O)]), t0 + ms(300));
        // A second change 100 ms later: a window after that one.
        assert_eq!(burst(&[(0, O), (100, O)]), t0 + ms(400));
        // Changes that never pause: at most two windows after the first.
        assert_eq!(burst(&[(0, O), (550, O)]), t0 + ms(600));
        assert_eq!(burst(&[(0, O), (5000, O)]), t0 + ms(600));
        // EndpointSlices only: the short window, also for a stream of them.
        assert_eq!(burst(&[(0, E)]), t0 + ms(50));
        assert_eq!(burst(&[(0, E), (30, E)]), t0 + ms(80));
        assert_eq!(burst(&[(0, E), (90, E)]), t0 + ms(100));
        // Any other change in the burst: the long window again, from the burst's start.
        assert_eq!(burst(&[(0, E), (30, O)]), t0 + ms(330));
        assert_eq!(burst(&[(0, O), (30, E)]), t0 + ms(330));
        // The endpoint window never exceeds the other.
        let slow = Settle { objects: ms(20), endpoints: ms(50) };
        assert_eq!(Burst::new(t0, E).due(slow), t0 + ms(20));
    }

    #[test]
    fn a_lone_cluster_change_renders_after_the_short_window_and_a_second_one_coalesces() {
        let ms = |n: u64| Duration::from_millis(n);
        let settle = Settle { objects: ms(300), endpoints: ms(50) };
        let t0 = tokio::time::Instant::now();
        use Change::{Cluster as C, Endpoints as E, Objects as O};
        let burst = |changes: &[(u64, Change)]| {
            let mut b = Burst::new(t0 + ms(changes[0].0), changes[0].1);
            for (at, c) in &changes[1..] {
                b.add(t0 + ms(*at), *c);
            }
            b.due(settle)
        };
        // A new route alone: the short window.
        assert_eq!(burst(&[(0, C)]), t0 + ms(50));
        // A Service and its route together: one render, the long window after the last.
        assert_eq!(burst(&[(0, C), (20, C)]), t0 + ms(320));
        assert_eq!(burst(&[(0, C), (20, E)]), t0 + ms(320));
        // The resource or what it names is never rendered early, alone or with a route.
        assert_eq!(burst(&[(0, O)]), t0 + ms(300));
        assert_eq!(burst(&[(0, O), (10, C)]), t0 + ms(310));
        // Nor an EndpointSlice burst that a route joins.
        assert_eq!(burst(&[(0, E), (10, C)]), t0 + ms(310));
        // The short window never exceeds the long one.
        let slow = Settle { objects: ms(20), endpoints: ms(50) };
        assert_eq!(Burst::new(t0, C).due(slow), t0 + ms(20));
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![Just(Change::Endpoints), Just(Change::Cluster), Just(Change::Objects)]
    }

    proptest! {
        /// For any burst (changes at non-decreasing offsets) and any windows: the render is due
        /// at least a window after its first change, no later than a window after its last,
        /// never later than the cap after its first, and with the long window whenever any
        /// change was not an EndpointSlice, unless it is one lone change to a cluster object.
        #[test]
        fn a_burst_is_due_within_its_windows(
            objects in 0u64..2_000,
            endpoints in 0u64..2_000,
            first in change(),
            rest in proptest::collection::vec((0u64..1_000, change()), 0..20),
        ) {
            let ms = Duration::from_millis;
            let settle = Settle { objects: ms(objects), endpoints: ms(endpoints) };
            let t0 = Instant::now();
            let mut b = Burst::new(t0, first);
            let mut at = t0;
            let mut only_endpoints = first == Change::Endpoints;
            for (gap, c) in &rest {
                at += ms(*gap);
                b.add(at, *c);
                only_endpoints &= *c == Change::Endpoints;
            }
            let lone = rest.is_empty() && first == Change::Cluster;
            let window = if only_endpoints || lone { ms(endpoints.min(objects)) } else { ms(objects) };
            let due = b.due(settle);
            prop_assert!(due <= at + window);
            prop_assert!(due <= t0 + window * MAX_SETTLE_WINDOWS);
            prop_assert!(due >= t0 + window);
            // The endpoint window never exceeds the other.
            prop_assert!(due <= (at + ms(objects)).min(t0 + ms(objects) * MAX_SETTLE_WINDOWS));
        }

        /// One more change never makes a burst due earlier.
        #[test]
        fn a_later_change_never_brings_the_render_forward(
            objects in 0u64..2_000,
            endpoints in 0u64..2_000,
            first in change(),
            gaps in proptest::collection::vec((0u64..1_000, change()), 1..20),
        ) {
            let ms = Duration::from_millis;
            let settle = Settle { objects: ms(objects), endpoints: ms(endpoints) };
            let t0 = Instant::now();
            let mut b = Burst::new(t0, first);
            let mut at = t0;
            for (gap, c) in &gaps {
                let before = b.due(settle);
                at += ms(*gap);
                b.add(at, *c);
                prop_assert!(b.due(settle) >= before);
            }
        }
    }
}
