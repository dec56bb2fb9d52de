//! A NodeClaim's phase ladder: the phase is the first of its conditions, in the order a
//! claim reaches them, that is not True.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::conditions;
use crate::api::reasons::ClaimCondition;
use crate::api::NodeClaimPhase;

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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

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
