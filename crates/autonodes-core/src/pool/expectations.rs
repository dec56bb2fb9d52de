//! What this process wrote to NodeClaims and the claim store does not show yet — the
//! "expectations" of Kubernetes' ReplicaSet controller and controller-runtime.
//!
//! The pool controller reads a pool's claims from the shared claim store (no LIST per
//! reconcile). The store shows a write a watch event later; a reconcile in between would
//! see a claim it just created missing (and create another), a claim it just deleted still
//! live (and delete another in its place), or an annotation it just wrote still absent.
//! So each write is remembered here and laid over the store's claims ([`ClaimExpectations::view`])
//! until the store shows it:
//! - a created claim counts as it was created until the store holds its UID;
//! - a deleted claim counts as being deleted (a deletion timestamp) until the store shows
//!   it being deleted or no longer holds it;
//! - a written annotation counts with the value written until the store's copy has it.
//!
//! An expectation the store never meets (the object went and came back between two looks)
//! is dropped after [`EXPECTATION_TTL`], as controller-runtime does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use autonodes_api::NodeClaim;

/// How long an expectation waits for the store at most (controller-runtime's
/// `ExpectationsTimeout`).
pub(crate) const EXPECTATION_TTL: Duration = Duration::from_secs(300);

/// Writes to NodeClaims this process made that the claim store does not show yet, by UID.
#[derive(Debug, Default)]
pub struct ClaimExpectations {
    by_uid: HashMap<String, Expected>,
}

/// What is expected of one claim.
#[derive(Debug)]
struct Expected {
    /// The claim's namespace.
    namespace: String,
    /// Created by this process: the claim as the API server returned it, and when.
    created: Option<(Arc<NodeClaim>, Instant)>,
    /// Deleted by this process: the deletion time written onto the claim, and when.
    deleted: Option<(Timestamp, Instant)>,
    /// Annotations written (`None`: removed), and when.
    annotations: BTreeMap<String, (Option<String>, Instant)>,
}

impl Expected {
    fn new(namespace: String) -> Self {
        Expected {
            namespace,
            created: None,
            deleted: None,
            annotations: BTreeMap::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.created.is_none() && self.deleted.is_none() && self.annotations.is_empty()
    }

    /// Forgets what the store's copy `stored` shows already.
    fn settle(&mut self, stored: &NodeClaim) {
        self.created = None;
        if stored.metadata.deletion_timestamp.is_some() {
            self.deleted = None;
        }
        self.annotations
            .retain(|key, (value, _)| annotation(stored, key) != value.as_deref());
    }

    /// Forgets what is older than `ttl` at `now`.
    fn expire(&mut self, now: Instant, ttl: Duration) {
        let fresh = |at: &Instant| now.saturating_duration_since(*at) < ttl;
        if self.created.as_ref().is_some_and(|(_, at)| !fresh(at)) {
            self.created = None;
        }
        if self.deleted.as_ref().is_some_and(|(_, at)| !fresh(at)) {
            self.deleted = None;
        }
        self.annotations.retain(|_, (_, at)| fresh(at));
    }

    /// `claim` as this process's writes left it.
    fn apply(&self, claim: Arc<NodeClaim>) -> Arc<NodeClaim> {
        if self.deleted.is_none() && self.annotations.is_empty() {
            return claim;
        }
        let mut c = (*claim).clone();
        if let Some((at, _)) = &self.deleted {
            c.metadata.deletion_timestamp.get_or_insert(Time(*at));
        }
        if !self.annotations.is_empty() {
            let annotations = c.metadata.annotations.get_or_insert_with(BTreeMap::new);
            for (key, (value, _)) in &self.annotations {
                match value {
                    Some(v) => annotations.insert(key.clone(), v.clone()),
                    None => annotations.remove(key),
                };
            }
        }
        Arc::new(c)
    }
}

fn annotation<'c>(claim: &'c NodeClaim, key: &str) -> Option<&'c str> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

impl ClaimExpectations {
    fn entry(&mut self, claim: &NodeClaim) -> Option<&mut Expected> {
        let uid = claim.metadata.uid.clone()?;
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        Some(
            self.by_uid
                .entry(uid)
                .or_insert_with(|| Expected::new(namespace)),
        )
    }

    /// Remembers a claim this process created (as the API server returned it, with its UID).
    pub fn created(&mut self, claim: NodeClaim, now: Instant) {
        if let Some(e) = self.entry(&claim) {
            e.created = Some((Arc::new(claim), now));
        }
    }

    /// Remembers that this process deleted `claim` at `at`.
    pub fn deleted(&mut self, claim: &NodeClaim, at: Timestamp, now: Instant) {
        if let Some(e) = self.entry(claim) {
            e.deleted = Some((at, now));
        }
    }

    /// Remembers that this process set the annotation `key` of `claim` to `value` (`None`:
    /// removed it).
    pub fn annotated(&mut self, claim: &NodeClaim, key: &str, value: Option<&str>, now: Instant) {
        if let Some(e) = self.entry(claim) {
            e.annotations
                .insert(key.to_string(), (value.map(str::to_string), now));
        }
    }

    /// How many claims have a write the store does not show yet.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// True when the store shows every write.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// The claims of `namespace` as they are: the store's copies (`stored`, that namespace's
    /// claims) with this process's writes the store does not show yet, sorted by name as a
    /// LIST returns them. Forgets every expectation the store meets, or that is older than
    /// [`EXPECTATION_TTL`] at `now`.
    pub fn view(
        &mut self,
        namespace: &str,
        stored: Vec<Arc<NodeClaim>>,
        now: Instant,
    ) -> Vec<Arc<NodeClaim>> {
        for e in self.by_uid.values_mut() {
            e.expire(now, EXPECTATION_TTL);
        }
        self.by_uid.retain(|_, e| !e.is_empty());
        let mut seen: HashSet<String> = HashSet::new();
        let mut out: Vec<Arc<NodeClaim>> = Vec::with_capacity(stored.len());
        for claim in stored {
            let expected = claim
                .metadata
                .uid
                .as_ref()
                .and_then(|uid| Some((uid, self.by_uid.get_mut(uid)?)));
            match expected {
                Some((uid, e)) => {
                    seen.insert(uid.clone());
                    e.settle(&claim);
                    out.push(e.apply(claim));
                }
                None => out.push(claim),
            }
        }
        // What the store does not hold: claims created a moment ago, or gone.
        for (uid, e) in self.by_uid.iter_mut() {
            if e.namespace != namespace || seen.contains(uid) {
                continue;
            }
            match &e.created {
                Some((claim, _)) => out.push(e.apply(claim.clone())),
                None => {
                    e.deleted = None;
                    e.annotations.clear();
                }
            }
        }
        self.by_uid.retain(|_, e| !e.is_empty());
        out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(ns: &str, name: &str, uid: &str) -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid},
            "spec": {"vClusterRef": {"name": "t"}},
        }))
        .expect("claim")
    }

    fn names(claims: &[Arc<NodeClaim>]) -> Vec<&str> {
        claims
            .iter()
            .map(|c| c.metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    fn terminating(claims: &[Arc<NodeClaim>], name: &str) -> bool {
        claims
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).expect("time")
    }

    #[test]
    fn a_claim_created_a_moment_ago_counts_until_the_store_shows_it() {
        let now = Instant::now();
        let mut e = ClaimExpectations::default();
        let a = Arc::new(claim("ns", "a", "1"));
        e.created(claim("ns", "b", "2"), now);
        let view = e.view("ns", vec![a.clone()], now);
        assert_eq!(names(&view), ["a", "b"], "the store lags: b counts");
        let view = e.view("ns", vec![a.clone()], now);
        assert_eq!(names(&view), ["a", "b"], "still lagging: b still counts");
        let b = Arc::new(claim("ns", "b", "2"));
        let view = e.view("ns", vec![b.clone(), a.clone()], now);
        assert_eq!(names(&view), ["a", "b"]);
        assert!(e.is_empty(), "the store shows b: nothing left to expect");
        assert_eq!(names(&e.view("ns", vec![a], now)), ["a"]);
    }

    #[test]
    fn a_claim_deleted_a_moment_ago_counts_as_terminating_until_the_store_shows_the_deletion() {
        let now = Instant::now();
        let mut e = ClaimExpectations::default();
        let a = claim("ns", "a", "1");
        e.deleted(&a, at(5_000), now);
        let view = e.view("ns", vec![Arc::new(a.clone())], now);
        assert!(terminating(&view, "a"));
        assert_eq!(
            view[0].metadata.deletion_timestamp,
            Some(Time(at(5_000))),
            "the deletion time is the one written"
        );
        let mut deleting = a.clone();
        deleting.metadata.deletion_timestamp = Some(Time(at(6_000)));
        let view = e.view("ns", vec![Arc::new(deleting)], now);
        assert_eq!(view[0].metadata.deletion_timestamp, Some(Time(at(6_000))));
        assert!(e.is_empty());
    }

    #[test]
    fn a_deleted_claim_the_store_no_longer_holds_is_gone() {
        let now = Instant::now();
        let mut e = ClaimExpectations::default();
        let a = claim("ns", "a", "1");
        e.deleted(&a, at(0), now);
        e.annotated(&a, "k", Some("v"), now);
        assert!(e.view("ns", Vec::new(), now).is_empty());
        assert!(e.is_empty());
    }

    #[test]
    fn a_claim_created_and_deleted_before_the_store_showed_it_stays_terminating_until_it_does() {
        let now = Instant::now();
        let mut e = ClaimExpectations::default();
        let b = claim("ns", "b", "2");
        e.created(b.clone(), now);
        e.deleted(&b, at(0), now);
        let view = e.view("ns", Vec::new(), now);
        assert!(terminating(&view, "b"), "not live, not forgotten");
        // The store catches up with the creation but not yet the deletion.
        let view = e.view("ns", vec![Arc::new(b.clone())], now);
        assert!(terminating(&view, "b"));
        assert_eq!(e.len(), 1);
    }

    #[test]
    fn a_written_annotation_shows_until_the_store_has_it() {
        let now = Instant::now();
        let mut e = ClaimExpectations::default();
        let mut a = claim("ns", "a", "1");
        a.metadata.annotations = Some(BTreeMap::from([("gone".to_string(), "x".to_string())]));
        e.annotated(&a, "since", Some("t1"), now);
        e.annotated(&a, "gone", None, now);
        let view = e.view("ns", vec![Arc::new(a.clone())], now);
        let annotations = view[0].metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations,
            BTreeMap::from([("since".to_string(), "t1".to_string())])
        );
        assert_eq!(e.len(), 1);
        a.metadata.annotations = Some(BTreeMap::from([("since".to_string(), "t1".to_string())]));
        e.view("ns", vec![Arc::new(a)], now);
        assert!(e.is_empty());
    }

    #[test]
    fn an_expectation_the_store_never_meets_is_dropped_after_the_ttl() {
        let now = Instant::now();
        let mut e = ClaimExpectations::default();
        e.created(claim("ns", "b", "2"), now);
        let later = now + EXPECTATION_TTL - Duration::from_millis(1);
        assert_eq!(names(&e.view("ns", Vec::new(), later)), ["b"]);
        assert!(e.view("ns", Vec::new(), now + EXPECTATION_TTL).is_empty());
        assert!(e.is_empty());
    }

    #[test]
    fn writes_in_another_namespace_do_not_show_and_wait_for_their_own_store() {
        let now = Instant::now();
        let mut e = ClaimExpectations::default();
        e.created(claim("other", "b", "2"), now);
        e.deleted(&claim("other", "c", "3"), at(0), now);
        assert!(e.view("ns", Vec::new(), now).is_empty());
        assert_eq!(e.len(), 2, "not settled by a look at another namespace");
        let c = Arc::new(claim("other", "c", "3"));
        let view = e.view("other", vec![c], now);
        assert_eq!(names(&view), ["b", "c"]);
        assert!(terminating(&view, "c"));
    }
}
