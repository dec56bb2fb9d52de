//! Scheduling: a claim's requirements checked ([`ClaimRequest`]), matched against the
//! prepared types of the [`Catalogue`] (resource fit, requirements, capacity, quota),
//! and the cheapest type that fits chosen ([`choose`]), with the zone it goes to.

use std::collections::BTreeMap;
use std::fmt;

use crate::catalogue::{Catalogue, PreparedType};
use crate::properties::{PROP_INSTANCE_TYPE, PROP_NODE_TYPE, PROP_NODE_TYPE_ALIAS};
use crate::requirements::{self, RequirementMiss};
use crate::resources::{ResourceAmounts, ResourceError};
use crate::zones;
use autonodes_api::{NodeClaimSpec, NodePoolSpec, Operator, Properties, Requirement};

/// Condition reason when no node type fits a claim.
pub(crate) const REASON_NO_MATCHING_NODE_TYPE: &str = "NoMatchingNodeType";
/// Reason: the tenant's quotas allow none of the fitting node types with capacity.
pub const REASON_QUOTA_EXCEEDED: &str = "QuotaExceeded";
/// Reason: no node of the host cluster has room for the VM of any fitting node type.
pub const REASON_HOST_CAPACITY_EXHAUSTED: &str = "HostCapacityExhausted";
/// Reason: every fitting node type hands out static addresses and has none left.
pub const REASON_ADDRESS_POOL_EXHAUSTED: &str = "AddressPoolExhausted";
/// Condition reason when fitting node types exist but none has capacity left.
pub const REASON_INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";

/// A requirement that is invalid in itself (wrong number of values, non-integer Gt/Lt).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A requirement is malformed.
    #[error("{field}: requirement on {key}: {message}")]
    InvalidRequirement {
        /// Where it is, e.g. `spec.requirements[2]`.
        field: String,
        /// The requirement key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A desired capacity quantity is invalid.
    #[error("spec.desiredCapacity: {source}")]
    InvalidDesiredCapacity {
        /// The parse error, naming the resource.
        source: ResourceError,
    },
}

/// A validated requirement: a [`requirements::Requirement`] and its text for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedRequirement {
    pub(crate) requirement: requirements::Requirement,
    text: String,
    /// `minValues`: how many distinct values of the key the fitting types must offer.
    pub(crate) min_values: Option<usize>,
}

/// The largest `minValues` (Karpenter's bound).
pub const MAX_MIN_VALUES: i64 = 50;

impl fmt::Display for CheckedRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl CheckedRequirement {
    /// Validates a requirement. `field` locates it for error messages.
    pub fn new(req: &Requirement, field: &str) -> Result<Self, RequestError> {
        let invalid = |message: String| RequestError::InvalidRequirement {
            field: field.to_string(),
            key: req.key.clone(),
            message,
        };
        if req.key.is_empty() {
            return Err(invalid("the key is empty".to_string()));
        }
        let one_integer = || -> Result<i64, RequestError> {
            match req.values.as_slice() {
                [v] => requirements::integer(v).ok_or_else(|| {
                    invalid(format!(
                        "{} needs an integer value, got {v:?}",
                        req.operator.as_str()
                    ))
                }),
                vs => Err(invalid(format!(
                    "{} needs exactly one integer value, got {}",
                    req.operator.as_str(),
                    vs.len()
                ))),
            }
        };
        let operator = match req.operator {
            Operator::In | Operator::NotIn if req.values.is_empty() => {
                return Err(invalid(format!(
                    "{} needs at least one value",
                    req.operator.as_str()
                )))
            }
            Operator::In => requirements::Operator::In(req.values.clone()),
            Operator::NotIn => requirements::Operator::NotIn(req.values.clone()),
            Operator::Exists | Operator::DoesNotExist | Operator::NotExists
                if !req.values.is_empty() =>
            {
                return Err(invalid(format!(
                    "{} takes no values",
                    req.operator.as_str()
                )))
            }
            Operator::Exists => requirements::Operator::Exists,
            Operator::DoesNotExist | Operator::NotExists => requirements::Operator::DoesNotExist,
            Operator::Gt => requirements::Operator::Gt(one_integer()?),
            Operator::Lt => requirements::Operator::Lt(one_integer()?),
            Operator::Gte => requirements::Operator::Gte(one_integer()?),
            Operator::Lte => requirements::Operator::Lte(one_integer()?),
        };
        let min_values = match req.min_values {
            None => None,
            Some(n @ 1..=MAX_MIN_VALUES) => usize::try_from(n).ok(),
            Some(n) => {
                return Err(invalid(format!(
                    "minValues must be 1 to {MAX_MIN_VALUES}, got {n}"
                )))
            }
        };
        let text = if req.values.is_empty() {
            format!("{} {}", req.key, req.operator.as_str())
        } else {
            format!(
                "{} {} [{}]",
                req.key,
                req.operator.as_str(),
                req.values.join(", ")
            )
        };
        Ok(Self {
            requirement: requirements::Requirement {
                key: req.key.clone(),
                operator,
            },
            text,
            min_values,
        })
    }

    /// Whether `types` offer at least `minValues` distinct values of the key that meet the
    /// requirement (a type offering several values counts each; one offering any value
    /// meets any `minValues`); if not, a message naming what they offer.
    pub fn min_values_met<'t>(
        &self,
        types: impl IntoIterator<Item = &'t Properties>,
    ) -> Result<(), String> {
        let Some(want) = self.min_values else {
            return Ok(());
        };
        let mut values: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for properties in types {
            let Some(value) = properties.get(self.key()) else {
                continue;
            };
            match requirements::Offer::parse(value) {
                requirements::Offer::Any => return Ok(()),
                requirements::Offer::One => {
                    values.insert(value.clone());
                }
                requirements::Offer::Several(choices) => {
                    for c in choices {
                        let single = Properties::from([(self.key().to_string(), c.to_string())]);
                        if self.requirement.matches(&single).is_ok() {
                            values.insert(c.to_string());
                        }
                    }
                }
            }
        }
        if values.len() >= want {
            return Ok(());
        }
        let offered: Vec<&str> = values.iter().map(String::as_str).collect();
        Err(format!(
            "{self} asks for at least {want} distinct values of {} among the fitting node types; they offer {} ({})",
            self.key(),
            values.len(),
            offered.join(", ")
        ))
    }

    /// The property key.
    pub fn key(&self) -> &str {
        &self.requirement.key
    }

    /// Checks the requirement against properties.
    /// Node type properties may offer several values (`a,b`) or any (`*`); see
    /// [`requirements::Requirement::matches_offer`].
    pub fn matches(&self, properties: &Properties) -> Result<(), RequirementMiss> {
        self.requirement.matches_offer(properties)
    }

    /// Whether this requirement names `t` explicitly (`node-type In [...]` or
    /// `instance-type In [...]` listing it).
    fn names_type(&self, t: &PreparedType) -> bool {
        match &self.requirement.operator {
            requirements::Operator::In(values) => match self.key() {
                PROP_NODE_TYPE | PROP_NODE_TYPE_ALIAS => values.contains(&t.short_name),
                PROP_INSTANCE_TYPE => values.contains(&t.name),
                _ => false,
            },
            _ => false,
        }
    }
}

/// What a claim asks of a node type: its (and its pool's) requirements, desired
/// capacity, provider and pinned type. Validated once, then matched against many types.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest {
    /// Only types of this provider.
    pub provider_ref: Option<String>,
    /// Only this type (NodeType name, or short name when unambiguous).
    pub type_ref: Option<String>,
    requirements: Vec<CheckedRequirement>,
    desired: ResourceAmounts,
}

impl ClaimRequest {
    /// Builds the request of a claim, with the requirements of its pool (if it has one and
    /// they were not copied into the claim) also applying. Errors name the field.
    pub fn new(claim: &NodeClaimSpec, pool: Option<&NodePoolSpec>) -> Result<Self, RequestError> {
        let mut requirements = Vec::new();
        if let Some(pool) = pool {
            for (i, r) in pool.requirements.iter().enumerate() {
                let checked =
                    CheckedRequirement::new(r, &format!("NodePool spec.requirements[{i}]"))?;
                if !requirements.contains(&checked) {
                    requirements.push(checked);
                }
            }
        }
        for (i, r) in claim.requirements.iter().enumerate() {
            let checked = CheckedRequirement::new(r, &format!("spec.requirements[{i}]"))?;
            if !requirements.contains(&checked) {
                requirements.push(checked);
            }
        }
        let desired = ResourceAmounts::from_list(&claim.desired_capacity)
            .map_err(|source| RequestError::InvalidDesiredCapacity { source })?;
        Ok(Self {
            provider_ref: claim
                .provider_ref
                .clone()
                .or_else(|| pool.and_then(|p| p.provider_ref.clone())),
            type_ref: claim.type_ref.clone(),
            requirements,
            desired,
        })
    }

    /// The validated requirements.
    pub fn requirements(&self) -> &[CheckedRequirement] {
        &self.requirements
    }

    fn pins(&self, t: &PreparedType) -> bool {
        self.type_ref
            .as_deref()
            .is_some_and(|r| r == t.name || r == t.short_name)
    }

    /// Whether the claim considers the type at all (provider and pinned type).
    pub fn considers(&self, t: &PreparedType) -> bool {
        self.provider_ref.as_deref().is_none_or(|p| p == t.provider)
            && self.type_ref.as_ref().is_none_or(|_| self.pins(t))
    }
}

/// One reason a type does not fit a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// The type cannot be used at all.
    Failed(String),
    /// A requirement does not hold.
    Requirement {
        /// The requirement, e.g. `autonodes.io/node-type In [gpu]`.
        requirement: String,
        /// How it failed.
        miss: RequirementMiss,
    },
    /// The type lacks a desired resource.
    Resources(String),
    /// The type has an extended resource the claim did not ask for.
    UnrequestedExtended(String),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Failed(why) => write!(f, "the type is Failed ({why})"),
            Mismatch::Requirement {
                requirement,
                miss: RequirementMiss::NotMet { actual: Some(a) },
            } => write!(f, "requirement `{requirement}` not met (the type has {a:?})"),
            Mismatch::Requirement {
                requirement,
                miss: RequirementMiss::NotMet { actual: None },
            } => write!(f, "requirement `{requirement}` not met (the type has no such property)"),
            Mismatch::Requirement {
                requirement,
                miss: RequirementMiss::NotAnInteger { actual },
            } => write!(
                f,
                "requirement `{requirement}` cannot be checked: the type's value {actual:?} is not an integer"
            ),
            Mismatch::Resources(s) => write!(f, "desiredCapacity not covered: {s}"),
            Mismatch::UnrequestedExtended(r) => write!(
                f,
                "the type has {r}, which the claim does not request (extended resources are only chosen when requested)"
            ),
        }
    }
}

/// Every reason `t` does not fit `req` (empty when it fits). Capacity is not checked here.
pub(crate) fn mismatches(t: &PreparedType, req: &ClaimRequest) -> Vec<Mismatch> {
    let mut out = Vec::new();
    if let Some(p) = &t.problem {
        out.push(Mismatch::Failed(p.to_string()));
        return out;
    }
    for r in &req.requirements {
        if let Err(miss) = r.matches(&t.properties) {
            out.push(Mismatch::Requirement {
                requirement: r.to_string(),
                miss,
            });
        }
    }
    if let Some(s) = t.amounts.shortfall(&req.desired) {
        out.push(Mismatch::Resources(s.to_string()));
    }
    let named = req.pins(t) || req.requirements.iter().any(|r| r.names_type(t));
    if !named {
        for (name, _) in t.amounts.extended() {
            if req.desired.milli(name) == 0 {
                out.push(Mismatch::UnrequestedExtended(name.to_string()));
            }
        }
    }
    out
}

/// Whether `t` fits `req` (requirements, resources, extended resources); capacity aside.
pub fn fits(t: &PreparedType, req: &ClaimRequest) -> bool {
    t.problem.is_none()
        && req
            .requirements
            .iter()
            .all(|r| r.matches(&t.properties).is_ok())
        && t.amounts.shortfall(&req.desired).is_none()
        && (req.pins(t)
            || req.requirements.iter().any(|r| r.names_type(t))
            || t.amounts
                .extended()
                .all(|(name, _)| req.desired.milli(name) > 0))
}

/// Why no node type was chosen: the `Scheduled=False` reason and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct NoFit {
    /// [`REASON_NO_MATCHING_NODE_TYPE`], [`REASON_INSUFFICIENT_CAPACITY`],
    /// [`REASON_QUOTA_EXCEEDED`], [`REASON_HOST_CAPACITY_EXHAUSTED`] or
    /// [`REASON_ADDRESS_POOL_EXHAUSTED`].
    pub reason: &'static str,
    /// Human-readable detail: the nearest type and what failed, or the exhausted types.
    pub message: String,
}

/// Chooses the node type for a claim: the cheapest type (ties by name) that the claim
/// considers, that fits, and that has capacity (`claimed` maps NodeType names to the
/// number of claims scheduled to them, see [`crate::catalogue::count_claimed`]).
///
/// When nothing fits: [`REASON_NO_MATCHING_NODE_TYPE`] naming the nearest type (fewest
/// failed checks, then cheapest) and every check it failed; when fitting types are all
/// full: [`REASON_INSUFFICIENT_CAPACITY`] listing them.
pub fn choose<'c>(
    catalogue: &'c Catalogue,
    req: &ClaimRequest,
    claimed: &BTreeMap<String, i64>,
) -> Result<&'c PreparedType, NoFit> {
    choose_within(catalogue, req, claimed, |_| Ok(()))
}

/// [`choose`] among the types `admit` allows (the tenant's quotas, [`crate::quota`]; the
/// host's room, [`crate::host_capacity`]): a fitting type with capacity that `admit`
/// refuses is passed over for the next one. When every fitting type with capacity is
/// refused: the first refusal, its reason kept ([`REASON_QUOTA_EXCEEDED`],
/// [`REASON_HOST_CAPACITY_EXHAUSTED`]).
pub fn choose_within<'c>(
    catalogue: &'c Catalogue,
    req: &ClaimRequest,
    claimed: &BTreeMap<String, i64>,
    mut admit: impl FnMut(&PreparedType) -> Result<(), NoFit>,
) -> Result<&'c PreparedType, NoFit> {
    let count = |t: &PreparedType| claimed.get(&t.name).copied().unwrap_or(0);
    // `minValues`: the fitting types must offer enough values (a claim pinned to its type
    // by its pool was checked by the pool, among the pool's types).
    if req.type_ref.is_none() {
        for r in req.requirements().iter().filter(|r| r.min_values.is_some()) {
            let fitting = catalogue
                .types()
                .iter()
                .filter(|t| req.considers(t) && fits(t, req))
                .map(|t| &t.properties);
            if let Err(message) = r.min_values_met(fitting) {
                return Err(NoFit {
                    reason: REASON_NO_MATCHING_NODE_TYPE,
                    message,
                });
            }
        }
    }
    let mut full: Vec<&PreparedType> = Vec::new();
    let mut refused: Vec<NoFit> = Vec::new();
    for t in catalogue.types().iter().filter(|t| req.considers(t)) {
        if fits(t, req) {
            if !t.has_capacity(count(t)) {
                full.push(t);
                continue;
            }
            match admit(t) {
                Ok(()) => return Ok(t),
                Err(why) => refused.push(why),
            }
        }
    }
    let others = refused.len().saturating_sub(1);
    if let Some(first) = refused.into_iter().next() {
        let more = match others {
            0 => String::new(),
            n => format!(" (and {n} more fitting node type(s) refused)"),
        };
        return Err(NoFit {
            reason: first.reason,
            message: format!("{}{more}", first.message),
        });
    }
    if !full.is_empty() {
        let list: Vec<String> = full
            .iter()
            .map(|t| {
                format!(
                    "{} ({}/{} claimed)",
                    t.name,
                    count(t),
                    t.max_capacity.unwrap_or_default()
                )
            })
            .collect();
        return Err(NoFit {
            reason: REASON_INSUFFICIENT_CAPACITY,
            message: format!(
                "every fitting node type is at maxCapacity: {}",
                list.join(", ")
            ),
        });
    }
    let considered: Vec<&PreparedType> = catalogue
        .types()
        .iter()
        .filter(|t| req.considers(t))
        .collect();
    if considered.is_empty() {
        let message = match (&req.type_ref, &req.provider_ref) {
            (Some(t), Some(p)) => format!("node type {t} of provider {p} does not exist"),
            (Some(t), None) => format!("node type {t} does not exist"),
            (None, Some(p)) => format!("provider {p} offers no node types"),
            (None, None) => "there are no node types".to_string(),
        };
        return Err(NoFit {
            reason: REASON_NO_MATCHING_NODE_TYPE,
            message,
        });
    }
    // Nearest: fewest mismatches; usable before Failed; then catalogue order (cost, name).
    let (nearest, misses) = considered
        .iter()
        .map(|t| (*t, mismatches(t, req)))
        .min_by_key(|(t, m)| (t.problem.is_some(), m.len()))
        .ok_or_else(|| NoFit {
            reason: REASON_NO_MATCHING_NODE_TYPE,
            message: "there are no node types".to_string(),
        })?;
    let details: Vec<String> = misses.iter().map(ToString::to_string).collect();
    Err(NoFit {
        reason: REASON_NO_MATCHING_NODE_TYPE,
        message: format!(
            "none of {} node type(s) fits; nearest is {}: {}",
            considered.len(),
            nearest.name,
            details.join("; ")
        ),
    })
}

/// The zone a claim scheduled to `t` goes to: the claim's own `topology.kubernetes.io/zone`
/// property when it sets one, else [`zones::choose_zone`] over the type's zones, the
/// claim's requirements on the zone key and `in_use` (the type's claims per zone).
pub fn zone_for(
    t: &PreparedType,
    claim: &NodeClaimSpec,
    request: &ClaimRequest,
    in_use: &BTreeMap<String, i64>,
) -> Option<String> {
    zone_for_where(t, claim, request, in_use, |_| true)
}

/// [`zone_for`] among the zones `allowed` accepts (those where the host has room): `None`
/// when the claim's own zone, or every zone the type offers it, is refused.
pub fn zone_for_where(
    t: &PreparedType,
    claim: &NodeClaimSpec,
    request: &ClaimRequest,
    in_use: &BTreeMap<String, i64>,
    allowed: impl Fn(&str) -> bool,
) -> Option<String> {
    if let Some(zone) = claim.properties.get(crate::properties::PROP_ZONE) {
        return Some(zone.clone()).filter(|z| allowed(z));
    }
    let on_zone: Vec<&requirements::Requirement> = request
        .requirements()
        .iter()
        .map(|r| &r.requirement)
        .filter(|r| r.key == crate::properties::PROP_ZONE)
        .collect();
    zones::choose_zone_where(
        t.properties
            .get(crate::properties::PROP_ZONE)
            .map(String::as_str),
        &on_zone,
        in_use,
        allowed,
    )
}

/// The single value a property offering several (`a,b`) or any (`*`) takes under
/// `requirements` on its key: the first value an `In` requirement lists that every
/// requirement accepts, else (for `a,b`) the first choice every requirement accepts.
/// `None` leaves the property as it is: a single value, or no choice fits (then the type
/// did not fit either), or `*` that nothing pins (it stays `*`, which is no label value,
/// so the node gets no label for it).
pub(crate) fn narrow_offer(
    value: &str,
    requirements: &[&requirements::Requirement],
) -> Option<String> {
    let offer = requirements::Offer::parse(value);
    let accepted = |candidate: &str| {
        requirements.iter().all(|r| {
            let single = BTreeMap::from([(r.key.clone(), candidate.to_string())]);
            r.matches(&single).is_ok()
        })
    };
    let offers = |candidate: &str| match &offer {
        requirements::Offer::Any => true,
        requirements::Offer::Several(choices) => choices.contains(&candidate),
        requirements::Offer::One => false,
    };
    if offer == requirements::Offer::One {
        return None;
    }
    let listed = requirements.iter().flat_map(|r| match &r.operator {
        requirements::Operator::In(values) => values.as_slice(),
        _ => &[],
    });
    for v in listed {
        if offers(v) && accepted(v) {
            return Some(v.clone());
        }
    }
    match offer {
        requirements::Offer::Several(choices) => choices
            .into_iter()
            .find(|c| accepted(c))
            .map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
