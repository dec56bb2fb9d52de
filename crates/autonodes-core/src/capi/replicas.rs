//! The two-way replica rule (see the module documentation of [`crate::capi`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use autonodes_api::capi::ANNOTATION_SYNCED_REPLICAS;
use autonodes_api::Autoscaling;

/// Why `spec.autoscaling` cannot be handed to the cluster-autoscaler, if it cannot: the
/// provider needs `0 ≤ min ≤ max` and refuses groups with `max − min < 1`.
pub fn bounds_problem(a: &Autoscaling) -> Option<String> {
    if a.min_replicas < 0 || a.max_replicas < 0 {
        return Some(format!(
            "spec.autoscaling: minReplicas {} and maxReplicas {} must not be negative",
            a.min_replicas, a.max_replicas
        ));
    }
    if a.max_replicas < a.min_replicas {
        return Some(format!(
            "spec.autoscaling: maxReplicas {} is below minReplicas {}",
            a.max_replicas, a.min_replicas
        ));
    }
    if a.max_replicas - a.min_replicas < 1 {
        return Some(format!(
            "spec.autoscaling: maxReplicas {} must exceed minReplicas {} by at least 1 (the cluster-autoscaler ignores a group that cannot scale)",
            a.max_replicas, a.min_replicas
        ));
    }
    None
}

/// Which object's replica value wins a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaSource {
    /// Both already agree.
    Agreed,
    /// The NodePool's value goes to the MachinePool (also: the MachinePool is new).
    NodePool,
    /// The MachinePool's value goes to the NodePool.
    MachinePool,
    /// Both changed concurrently; the NodePool wins.
    ConflictNodePoolWins,
}

/// The outcome of [`sync_replicas`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaSync {
    /// The value both objects get.
    pub target: i32,
    /// Whose value it is.
    pub source: ReplicaSource,
}

/// Decides the replicas of a NodePool (`np`, with its marker `np_synced`) and its
/// MachinePool (`mp`, `mp_synced`; `None` when there is no MachinePool yet). See the
/// module documentation of [`crate::capi`] for the rule.
pub fn sync_replicas(
    np: i32,
    np_synced: Option<i32>,
    mp: Option<i32>,
    mp_synced: Option<i32>,
) -> ReplicaSync {
    let Some(mp) = mp else {
        return ReplicaSync {
            target: np,
            source: ReplicaSource::NodePool,
        };
    };
    if mp == np {
        return ReplicaSync {
            target: np,
            source: ReplicaSource::Agreed,
        };
    }
    let np_changed = np_synced != Some(np);
    let mp_changed = mp_synced != Some(mp);
    let (target, source) = match (np_changed, mp_changed) {
        (false, true) => (mp, ReplicaSource::MachinePool),
        (true, false) | (false, false) => (np, ReplicaSource::NodePool),
        (true, true) if mp_synced == Some(np) => (mp, ReplicaSource::MachinePool),
        (true, true) if np_synced == Some(mp) => (np, ReplicaSource::NodePool),
        (true, true) => (np, ReplicaSource::ConflictNodePoolWins),
    };
    ReplicaSync { target, source }
}

/// The replica marker (`capi.autonodes.io/synced-replicas`) of a NodePool or MachinePool,
/// when it carries a number.
pub fn parse_marker(meta: &ObjectMeta) -> Option<i32> {
    meta.annotations
        .as_ref()?
        .get(ANNOTATION_SYNCED_REPLICAS)?
        .parse()
        .ok()
}

/// What a replica sync writes to the NodePool (the MachinePool always gets the target and
/// its marker with the rest of its spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodePoolWrite {
    /// Nothing: the NodePool carries the target and its marker already.
    UpToDate,
    /// The target and its marker, in one write *before* the MachinePool is written: the
    /// MachinePool's value won.
    Scale,
    /// Only the marker, *after* the MachinePool is written: the NodePool's value won (or
    /// both agree) and its marker lags.
    Mark,
}

/// The NodePool write of `sync` for a NodePool with `np_replicas` and the marker
/// `np_marker`.
pub fn node_pool_write(
    np_replicas: i32,
    np_marker: Option<i32>,
    sync: ReplicaSync,
) -> NodePoolWrite {
    if sync.target != np_replicas {
        NodePoolWrite::Scale
    } else if np_marker != Some(sync.target) {
        NodePoolWrite::Mark
    } else {
        NodePoolWrite::UpToDate
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn bounds_that_would_hide_or_disable_the_group_are_refused() {
        let b = |min, max| Autoscaling {
            min_replicas: min,
            max_replicas: max,
        };
        assert_eq!(bounds_problem(&b(0, 5)), None);
        assert_eq!(bounds_problem(&b(2, 3)), None);
        assert!(bounds_problem(&b(3, 2)).is_some_and(|m| m.contains("below")));
        assert!(bounds_problem(&b(2, 2)).is_some_and(|m| m.contains("at least 1")));
        assert!(bounds_problem(&b(-1, 2)).is_some_and(|m| m.contains("negative")));
    }

    #[test]
    fn a_change_on_either_side_is_copied_to_the_other() {
        // kubectl scale npool 3 → 5.
        let s = sync_replicas(5, Some(3), Some(3), Some(3));
        assert_eq!((s.target, s.source), (5, ReplicaSource::NodePool));
        // The autoscaler's PUT on /scale 3 → 4.
        let s = sync_replicas(3, Some(3), Some(4), Some(3));
        assert_eq!((s.target, s.source), (4, ReplicaSource::MachinePool));
        // A new MachinePool takes the NodePool's value.
        let s = sync_replicas(2, None, None, None);
        assert_eq!((s.target, s.source), (2, ReplicaSource::NodePool));
        // Equal values: nothing to pass on.
        let s = sync_replicas(4, Some(3), Some(4), Some(3));
        assert_eq!((s.target, s.source), (4, ReplicaSource::Agreed));
    }

    #[test]
    fn the_later_write_wins_when_the_earlier_one_was_already_passed_on() {
        // NodePool 3 → 5 was copied to the MachinePool (marker 5), then the autoscaler set
        // 6 before the NodePool's marker was written: the autoscaler's 6 is newer.
        let s = sync_replicas(5, Some(3), Some(6), Some(5));
        assert_eq!((s.target, s.source), (6, ReplicaSource::MachinePool));
        // The autoscaler's 1 was copied to the NodePool (marker 1), then someone scaled
        // the NodePool to 7 before the MachinePool's marker was written: 7 is newer.
        let s = sync_replicas(7, Some(1), Some(1), Some(0));
        assert_eq!((s.target, s.source), (7, ReplicaSource::NodePool));
        // Truly concurrent changes: the NodePool wins.
        let s = sync_replicas(5, Some(3), Some(4), Some(3));
        assert_eq!(
            (s.target, s.source),
            (5, ReplicaSource::ConflictNodePoolWins)
        );
    }

    #[test]
    fn a_sync_is_stable_once_both_sides_carry_the_target() {
        for (np, nps, mp, mps) in [
            (5, Some(3), Some(3), Some(3)),
            (3, Some(3), Some(4), Some(3)),
            (5, Some(2), Some(4), Some(3)),
        ] {
            let s = sync_replicas(np, nps, mp, mps);
            let again = sync_replicas(s.target, Some(s.target), Some(s.target), Some(s.target));
            assert_eq!(again.source, ReplicaSource::Agreed);
            assert_eq!(again.target, s.target);
        }
    }

    #[test]
    fn the_marker_is_read_only_when_it_is_a_number() {
        let meta = |v: &str| ObjectMeta {
            annotations: Some(BTreeMap::from([(
                ANNOTATION_SYNCED_REPLICAS.to_string(),
                v.to_string(),
            )])),
            ..ObjectMeta::default()
        };
        assert_eq!(parse_marker(&meta("3")), Some(3));
        assert_eq!(parse_marker(&meta("three")), None);
        assert_eq!(parse_marker(&ObjectMeta::default()), None);
    }

    #[test]
    fn the_node_pool_is_scaled_first_when_the_machine_pool_won_and_marked_after_otherwise() {
        // The autoscaler's 4 wins: the NodePool gets 4 (with its marker) before anything else.
        let s = sync_replicas(3, Some(3), Some(4), Some(3));
        assert_eq!(node_pool_write(3, Some(3), s), NodePoolWrite::Scale);
        // kubectl scale npool 3 → 5: the MachinePool gets 5, then the NodePool's marker.
        let s = sync_replicas(5, Some(3), Some(3), Some(3));
        assert_eq!(node_pool_write(5, Some(3), s), NodePoolWrite::Mark);
        // A new MachinePool for a NodePool never synced: its marker follows.
        let s = sync_replicas(2, None, None, None);
        assert_eq!(node_pool_write(2, None, s), NodePoolWrite::Mark);
        // Both carry the target and their markers: nothing to write.
        let s = sync_replicas(4, Some(4), Some(4), Some(4));
        assert_eq!(node_pool_write(4, Some(4), s), NodePoolWrite::UpToDate);
    }
}
