//! Status writes of every kind, one rule: the status is written with one conditional
//! server-side apply ([`crate::controller::status::apply_status`]), and only once that write succeeded is each
//! condition that changed reported — an Event and, for a problem, a log line. A reconcile
//! that worked on a stale copy loses its write to a conflict and reports nothing, so every
//! change is reported once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::Serialize;

use super::context::{Context, FIELD_MANAGER};
use super::error::Error;
use autonodes_api::conditions;

/// When each object's status was last written, by name: what keeps a burst of changes to
/// counts alone (a claim more or less on a NodeType, in a NodeQuota's namespace) to one
/// status write per gap. Whatever else changes is written at once.
#[derive(Debug, Default)]
pub(crate) struct WriteGap {
    written: Mutex<HashMap<String, Instant>>,
}

impl WriteGap {
    /// How long the status write of `name` still waits: the rest of `gap` since its last
    /// write when only counts changed (`counts_only`), else `None` (write now).
    pub(crate) fn wait(&self, name: &str, gap: Duration, counts_only: bool) -> Option<Duration> {
        if !counts_only {
            return None;
        }
        let last = self.written.lock().ok()?.get(name).copied()?;
        Some(gap.saturating_sub(last.elapsed())).filter(|wait| !wait.is_zero())
    }

    /// The status of `name` was just written.
    pub(crate) fn wrote(&self, name: &str) {
        if let Ok(mut w) = self.written.lock() {
            w.insert(name.to_string(), Instant::now());
        }
    }
}

/// The conditions of `new` that differ from `old` in status or reason (or are new), each
/// with its earlier version.
pub(crate) fn changed<'a>(
    old: &'a [Condition],
    new: &'a [Condition],
) -> impl Iterator<Item = (&'a Condition, Option<&'a Condition>)> + 'a {
    new.iter().filter_map(move |c| {
        let before = conditions::get(old, &c.type_);
        let same = before.is_some_and(|b| b.status == c.status && b.reason == c.reason);
        (!same).then_some((c, before))
    })
}

/// Records the Events for the conditions that changed from `old` to `new`, after their
/// status write succeeded: `classify` says which changes are worth an Event and of which
/// type (`None`: none, only a debug line). A Warning is also logged with the object's kind
/// and name, the condition, its reason and message.
pub(crate) async fn report_changes<K>(
    ctx: &Context,
    obj: &K,
    action: &str,
    old: &[Condition],
    new: &[Condition],
    classify: impl Fn(&Condition, Option<&Condition>) -> Option<EventType>,
) where
    K: Resource<DynamicType = ()>,
{
    for (c, before) in changed(old, new) {
        let Some(kind) = classify(c, before) else {
            tracing::debug!(
                kind = %K::kind(&()), name = %obj.name_any(),
                condition = %c.type_, reason = %c.reason, message = %c.message,
                "condition changed"
            );
            continue;
        };
        if kind == EventType::Warning {
            tracing::info!(
                kind = %K::kind(&()), name = %obj.name_any(),
                namespace = %obj.namespace().unwrap_or_default(),
                condition = %c.type_, reason = %c.reason, message = %c.message,
                "condition not true"
            );
        }
        let action = if action.is_empty() { &c.type_ } else { action };
        ctx.event(obj, kind, &c.reason, action, c.message.clone())
            .await;
    }
}

/// Normal when a condition turned True, Warning otherwise: the rule of conditions that have
/// no progress reasons.
pub(crate) fn true_is_normal(c: &Condition, _before: Option<&Condition>) -> Option<EventType> {
    Some(if c.status == conditions::TRUE {
        EventType::Normal
    } else {
        EventType::Warning
    })
}

/// Writes `status` of `obj` with server-side apply on the status subresource; returns the
/// object as written.
pub(crate) async fn apply_status<K, S>(api: &Api<K>, obj: &K, status: &S) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    apply_status_as(api, obj, status, FIELD_MANAGER).await
}

/// [`apply_status`] with another field manager (a controller whose status fields must not
/// be taken over by the others').
pub(crate) async fn apply_status_as<K, S>(
    api: &Api<K>,
    obj: &K,
    status: &S,
    manager: &str,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let name = obj.name_any();
    // The object's resourceVersion makes the write conditional: a reconcile that worked on
    // a stale copy (the cache lags behind our own writes) gets a conflict instead of
    // overwriting newer status, and runs again on the current object.
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"resourceVersion": obj.resource_version()},
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| match e {
        // Expected: the cache was behind our own last write. Not a failure.
        kube::Error::Api(s) if s.code == 409 => Error::Conflict(format!("{} {name}", K::kind(&()))),
        e => Error::kube(format!("writing status of {} {name}", K::kind(&())))(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn set(cs: &mut Vec<Condition>, type_: &str, ok: bool, reason: &str, message: &str) {
        conditions::set(
            cs,
            type_,
            conditions::status_of(ok),
            reason,
            message,
            None,
            Timestamp::UNIX_EPOCH,
        );
    }

    #[test]
    fn a_condition_changed_when_it_is_new_or_its_status_or_reason_differs_not_its_message() {
        let mut old = Vec::new();
        set(&mut old, "A", true, "Fine", "one");
        set(&mut old, "B", false, "Broken", "one");
        set(&mut old, "C", false, "Broken", "one");
        let mut new = old.clone();
        set(&mut new, "A", true, "Fine", "another message");
        set(&mut new, "B", true, "Fine", "one");
        set(&mut new, "C", false, "Worse", "one");
        set(&mut new, "D", false, "New", "one");
        let types: Vec<&str> = changed(&old, &new).map(|(c, _)| c.type_.as_str()).collect();
        assert_eq!(types, ["B", "C", "D"]);
    }
}
