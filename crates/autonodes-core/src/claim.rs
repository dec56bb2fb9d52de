//! A NodeClaim's phase ladder: the phase is the first of its conditions, in the order a
//! claim reaches them, that is not True.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use autonodes_api::conditions;
use autonodes_api::reasons::ClaimCondition;
use autonodes_api::{NodeClaim, NodeClaimPhase, Power};

/// Whether the claim is powered off (`spec.power: Off`): its node is kept stopped, and
/// nothing consolidates, rolls or repairs it.
pub fn powered_off(claim: &NodeClaim) -> bool {
    claim.spec.power == Some(Power::Off)
}

/// The phase a claim with `conditions` is in (a claim that is Failed or Terminating says so
/// itself; this is the ladder of a claim on its way).
pub fn phase(c: &[Condition]) -> NodeClaimPhase {
    let reached = |type_: ClaimCondition| conditions::is_true(c, type_);
    if !reached(ClaimCondition::Scheduled) {
        NodeClaimPhase::Pending
    } else if !reached(ClaimCondition::Provisioned) {
        NodeClaimPhase::Provisioning
    } else if !reached(ClaimCondition::Joined)
        || !reached(ClaimCondition::Initialized)
        || !reached(ClaimCondition::Ready)
    {
        NodeClaimPhase::Joining
    } else {
        NodeClaimPhase::Available
    }
}

/// The reason of the first condition of the ladder (`Scheduled`, `Provisioned`, `Joined`,
/// `Initialized`, `Ready`) that is not True: why a claim is not Available, in one word.
/// `None` once all of them are True.
pub fn reason(c: &[Condition]) -> Option<String> {
    [
        ClaimCondition::Scheduled,
        ClaimCondition::Provisioned,
        ClaimCondition::Joined,
        ClaimCondition::Initialized,
        ClaimCondition::Ready,
    ]
    .into_iter()
    .find(|t| !conditions::is_true(c, t))
    .and_then(|t| conditions::get(c, t))
    .map(|c| c.reason.clone())
    .filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn the_reason_is_that_of_the_first_condition_that_is_not_true_and_none_once_available() {
        let mut cs: Vec<Condition> = Vec::new();
        assert_eq!(reason(&cs), None);
        let set = |cs: &mut Vec<Condition>, t: ClaimCondition, ok: bool, r: &str| {
            conditions::set(
                cs,
                t,
                conditions::status_of(ok),
                r,
                "m",
                None,
                Timestamp::UNIX_EPOCH,
            );
        };
        set(
            &mut cs,
            ClaimCondition::Scheduled,
            false,
            "InsufficientCapacity",
        );
        assert_eq!(reason(&cs).as_deref(), Some("InsufficientCapacity"));
        set(&mut cs, ClaimCondition::Scheduled, true, "Scheduled");
        set(&mut cs, ClaimCondition::Provisioned, false, "Booting");
        set(&mut cs, ClaimCondition::Ready, false, "WaitingForNode");
        assert_eq!(reason(&cs).as_deref(), Some("Booting"));
        for t in [
            ClaimCondition::Provisioned,
            ClaimCondition::Joined,
            ClaimCondition::Initialized,
            ClaimCondition::Ready,
        ] {
            set(&mut cs, t, true, "Done");
        }
        // Drifted is not part of the ladder.
        set(&mut cs, ClaimCondition::Drifted, true, "NodeTypeChanged");
        assert_eq!(reason(&cs), None);
    }

    #[test]
    fn the_phase_is_the_first_condition_that_is_not_true() {
        let mut cs: Vec<Condition> = Vec::new();
        assert_eq!(phase(&cs), NodeClaimPhase::Pending);
        let reach = |cs: &mut Vec<Condition>, t: ClaimCondition| {
            conditions::set(
                cs,
                t,
                conditions::TRUE,
                "R",
                "",
                None,
                Timestamp::UNIX_EPOCH,
            );
        };
        reach(&mut cs, ClaimCondition::Scheduled);
        assert_eq!(phase(&cs), NodeClaimPhase::Provisioning);
        reach(&mut cs, ClaimCondition::Provisioned);
        assert_eq!(phase(&cs), NodeClaimPhase::Joining);
        reach(&mut cs, ClaimCondition::Ready);
        assert_eq!(phase(&cs), NodeClaimPhase::Joining, "Ready without Joined");
        reach(&mut cs, ClaimCondition::Joined);
        assert_eq!(
            phase(&cs),
            NodeClaimPhase::Joining,
            "Ready without Initialized"
        );
        reach(&mut cs, ClaimCondition::Initialized);
        assert_eq!(phase(&cs), NodeClaimPhase::Available);
    }
}
