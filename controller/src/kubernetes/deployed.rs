//! The Normal `Deployed` Event: "deployed plan … to 3/3 pods: runtime", so `kubectl describe
//! hapc` shows the history of what reached the fleet beside the Warnings.
//!
//! Owns the pure decision of when two consecutive fleet views call for it and its words. It
//! must never publish anything itself (the status writer does) and never fire twice for the
//! same plan on the same pod count.

use std::collections::BTreeMap;

use crate::status::FleetStatus;

/// The note of a `Deployed` Event when `now` has every pod on its target and `prev` did not
/// (a new plan, or more pods on the same one); `None` otherwise.
pub fn deployed_note(prev: Option<&FleetStatus>, now: &FleetStatus) -> Option<String> {
    let done = |f: &FleetStatus| f.total > 0 && f.converged == f.total && f.controller.target.is_some();
    let target = now.controller.target?;
    if !done(now) {
        return None;
    }
    if prev.is_some_and(|p| done(p) && p.controller.target == Some(target) && p.total == now.total) {
        return None;
    }
    let mut modes: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &now.pods {
        *modes.entry(p.mode.map_or("unknown", |m| m.as_str())).or_default() += 1;
    }
    let how = if modes.len() == 1 {
        modes.keys().next().copied().unwrap_or("unknown").to_string()
    } else {
        modes.iter().map(|(m, n)| format!("{n} {m}")).collect::<Vec<_>>().join(", ")
    };
    Some(format!("deployed plan {} to {}/{} pods: {how}", target.short(), now.converged, now.total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{ControllerStatus, GateStatus, PodStatus};
    use haptic_protocol::{Digest, Mode, PlanId};

    fn fleet(target: Option<PlanId>, modes: &[Option<Mode>], converged: usize) -> FleetStatus {
        FleetStatus {
            pods: modes
                .iter()
                .enumerate()
                .map(|(i, m)| PodStatus { pod: format!("p{i}"), mode: *m, ..Default::default() })
                .collect(),
            converged,
            total: modes.len(),
            gate: GateStatus {
                mode: crate::gate::GateMode::Optimistic,
                pinned: false,
                last_good: target,
                last_refused: None,
                render_error: None,
            },
            controller: ControllerStatus { target, ..Default::default() },
        }
    }

    #[test]
    fn once_per_plan_and_pod_count_with_the_modes() {
        let a = PlanId(Digest::of(b"a"));
        let b = PlanId(Digest::of(b"b"));
        let rt = Some(Mode::Runtime);
        let deploying = fleet(Some(a), &[rt, rt, rt], 2);
        assert_eq!(deployed_note(None, &deploying), None, "not every pod yet");
        let done = fleet(Some(a), &[rt, rt, rt], 3);
        let note = deployed_note(Some(&deploying), &done).unwrap();
        assert_eq!(note, format!("deployed plan {} to 3/3 pods: runtime", a.short()));
        assert_eq!(deployed_note(Some(&done), &done), None, "the same view again");
        let mixed = fleet(Some(b), &[Some(Mode::Reload), rt, Some(Mode::Reload)], 3);
        assert_eq!(
            deployed_note(Some(&done), &mixed).unwrap(),
            format!("deployed plan {} to 3/3 pods: 2 reload, 1 runtime", b.short())
        );
        let grown = fleet(Some(b), &[Some(Mode::Reload), rt, Some(Mode::Reload), rt], 4);
        assert_eq!(
            deployed_note(Some(&mixed), &grown).unwrap(),
            format!("deployed plan {} to 4/4 pods: 2 reload, 2 runtime", b.short()),
            "a pod joined"
        );
        assert_eq!(deployed_note(None, &fleet(None, &[], 0)), None);
    }
}
