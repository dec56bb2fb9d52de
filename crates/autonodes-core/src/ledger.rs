//! The capacity ledger: [`crate::catalogue::count_claimed`]'s rule kept up to date as
//! claims change, instead of recounted over every claim for each decision (with 10,000
//! claims, recounting made each scheduling decision O(N) and the whole run O(N²)).
//!
//! A claim holds one unit of its NodeType's capacity once it is scheduled and until its VM
//! is gone. The ledger keeps, per claim UID, what the claim store shows (its
//! `status.typeRef` and `status.zone`, none once Failed), what this process decided but the
//! store may not show yet (a reservation), and whether its cleanup finished (released: it
//! holds nothing, whatever a cache still shows). A reservation wins over the store, a
//! release over both: exactly [`crate::catalogue::count_claimed`], checked by a property
//! test. The same holdings are also counted per type and zone, for
//! [`crate::zones::choose_zone`], and per namespace and type, for [`crate::quota`].
//!
//! A claim that is powered off (`status.power: Off`: its VM stopped) still holds its unit,
//! and is also counted as parked, per type and zone: its VM takes no host room
//! ([`crate::host_capacity::place_in_flight`]).
//!
//! It also knows the static address each claim holds ([`crate::address_pool`]): the one
//! its `status.address` shows, in any phase (a Failed claim keeps its address until it is
//! deleted), or the one this process gave it and the store does not show yet, until the
//! claim's cleanup finished.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use autonodes_api::{NodeClaim, NodeClaimPhase};

/// What a claim holds: a unit of a node type, in a zone when the type lists zones, for
/// the claim's namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Hold {
    namespace: String,
    node_type: String,
    zone: Option<String>,
    /// Powered off: its VM is stopped.
    parked: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entry {
    stored: Option<Hold>,
    reserved: Option<Hold>,
    stored_address: Option<IpAddr>,
    reserved_address: Option<IpAddr>,
    released: bool,
}

impl Entry {
    fn held(&self) -> Option<&Hold> {
        if self.released {
            return None;
        }
        self.reserved.as_ref().or(self.stored.as_ref())
    }

    /// What the claim holds, parked when the store shows it powered off (a reservation
    /// never is: it was made for a claim whose VM was yet to run).
    fn holds(&self) -> Option<Hold> {
        let mut hold = self.held()?.clone();
        hold.parked = self
            .stored
            .as_ref()
            .is_some_and(|s| s.parked && s.node_type == hold.node_type);
        Some(hold)
    }

    fn address(&self) -> Option<IpAddr> {
        if self.released {
            return None;
        }
        self.reserved_address.or(self.stored_address)
    }

    fn is_empty(&self) -> bool {
        self.stored.is_none()
            && self.reserved.is_none()
            && self.stored_address.is_none()
            && self.reserved_address.is_none()
            && !self.released
    }
}

/// Claims per NodeType (and per NodeType and zone) that hold capacity, kept incrementally.
#[derive(Debug, Clone, Default)]
pub struct ClaimedLedger {
    entries: HashMap<String, Entry>,
    counts: BTreeMap<String, i64>,
    zones: BTreeMap<String, BTreeMap<String, i64>>,
    namespaces: BTreeMap<String, BTreeMap<String, i64>>,
    /// Powered-off claims per type, and per type and zone (`""`: no zone).
    parked: BTreeMap<String, BTreeMap<String, i64>>,
    /// How many claims hold each static address (one, unless a store was written by hand).
    addresses: HashMap<IpAddr, u32>,
}

/// An empty count: what a type without claims in any zone, or a namespace without claims, has.
static NONE_COUNTED: BTreeMap<String, i64> = BTreeMap::new();

fn add(counts: &mut BTreeMap<String, i64>, key: &str, delta: i64) {
    let n = counts.entry(key.to_string()).or_insert(0);
    *n += delta;
    if *n <= 0 {
        counts.remove(key);
    }
}

impl ClaimedLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims per NodeType name that hold capacity (types without any are absent).
    pub fn counts(&self) -> &BTreeMap<String, i64> {
        &self.counts
    }

    /// Claims that hold capacity of `node_type`.
    pub fn count(&self, node_type: &str) -> i64 {
        self.counts.get(node_type).copied().unwrap_or(0)
    }

    /// Claims of `node_type` that hold capacity, per zone (zones without any are absent).
    pub fn zone_counts(&self, node_type: &str) -> &BTreeMap<String, i64> {
        self.zones.get(node_type).unwrap_or(&NONE_COUNTED)
    }

    /// Powered-off claims of `node_type`, per zone (`""` for those without a zone).
    pub fn parked(&self, node_type: &str) -> &BTreeMap<String, i64> {
        self.parked.get(node_type).unwrap_or(&NONE_COUNTED)
    }

    /// Claims of `namespace` that hold capacity, per NodeType (types without any are
    /// absent).
    pub fn namespace_counts(&self, namespace: &str) -> &BTreeMap<String, i64> {
        self.namespaces.get(namespace).unwrap_or(&NONE_COUNTED)
    }

    /// The namespaces whose claims hold capacity.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.keys().map(String::as_str)
    }

    /// The claim as the store now shows it.
    pub fn observe(&mut self, claim: &NodeClaim) {
        let Some(uid) = claim.metadata.uid.as_deref() else {
            return;
        };
        let status = claim.status.as_ref();
        let stored = if status.and_then(|s| s.phase) == Some(NodeClaimPhase::Failed) {
            None
        } else {
            status.and_then(|s| {
                s.type_ref.clone().map(|node_type| Hold {
                    namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                    node_type,
                    zone: s.zone.clone(),
                    parked: s.power == Some(autonodes_api::PowerState::Off),
                })
            })
        };
        let address = status
            .and_then(|s| s.address.as_deref())
            .and_then(crate::address_pool::parse_address);
        self.update(uid, |e| {
            e.stored = stored;
            e.stored_address = address;
        });
    }

    /// The claim is gone from the store: it holds nothing, and is forgotten.
    pub fn forget(&mut self, uid: &str) {
        self.update(uid, |e| *e = Entry::default());
    }

    /// The store was listed anew: `claims` is everything it holds now. What the store
    /// showed before is replaced; reservations stay; a release is forgotten once the store
    /// no longer shows its claim (it was deleted while the watch was away).
    pub fn resync<'a>(&mut self, claims: impl IntoIterator<Item = &'a NodeClaim>) {
        let listed: Vec<&NodeClaim> = claims.into_iter().collect();
        let present: std::collections::HashSet<&str> = listed
            .iter()
            .filter_map(|c| c.metadata.uid.as_deref())
            .collect();
        let uids: Vec<String> = self.entries.keys().cloned().collect();
        for uid in uids {
            let gone = !present.contains(uid.as_str());
            self.update(&uid, |e| {
                e.stored = None;
                e.stored_address = None;
                if gone && e.reserved.is_none() && e.reserved_address.is_none() {
                    e.released = false;
                }
            });
        }
        for c in listed {
            self.observe(c);
        }
    }

    /// This process scheduled the claim (of `namespace`) to `node_type` (in `zone`), before
    /// the store shows it.
    pub fn reserve(&mut self, uid: &str, namespace: &str, node_type: &str, zone: Option<&str>) {
        let hold = Hold {
            namespace: namespace.to_string(),
            node_type: node_type.to_string(),
            zone: zone.map(str::to_string),
            parked: false,
        };
        self.update(uid, |e| e.reserved = Some(hold));
    }

    /// This process gave the claim the static address `address`, before the store shows it.
    pub fn reserve_address(&mut self, uid: &str, address: IpAddr) {
        self.update(uid, |e| e.reserved_address = Some(address));
    }

    /// The claim Failed: the capacity reserved for it is given back, its static address is
    /// not (a Failed claim holds its address until it is gone; its status shows it).
    pub fn unreserve_capacity(&mut self, uid: &str) {
        self.update(uid, |e| e.reserved = None);
    }

    /// Every static address a claim holds.
    pub fn addresses(&self) -> impl Iterator<Item = &IpAddr> {
        self.addresses.keys()
    }

    /// Whether a claim holds the static address `address`.
    pub fn address_taken(&self, address: IpAddr) -> bool {
        self.addresses.contains_key(&address)
    }

    /// The reservation of the claim is withdrawn (its status write failed): a static
    /// address reserved with it is given back too.
    pub fn unreserve(&mut self, uid: &str) {
        self.update(uid, |e| {
            e.reserved = None;
            e.reserved_address = None;
        });
    }

    /// The node type and zone the claim holds a unit of, if it holds one.
    pub fn holding(&self, uid: &str) -> Option<(&str, Option<&str>)> {
        self.entries
            .get(uid)
            .and_then(Entry::held)
            .map(|h| (h.node_type.as_str(), h.zone.as_deref()))
    }

    /// Whether this process holds a reservation for the claim.
    pub fn is_reserved(&self, uid: &str) -> bool {
        self.entries.get(uid).is_some_and(|e| e.reserved.is_some())
    }

    /// The claim's cleanup finished: it holds nothing any more, whatever caches show.
    pub fn release(&mut self, uid: &str) {
        self.update(uid, |e| {
            e.reserved = None;
            e.reserved_address = None;
            e.released = true;
        });
    }

    /// Whether the claim's cleanup finished.
    #[cfg(test)]
    pub fn is_released(&self, uid: &str) -> bool {
        self.entries.get(uid).is_some_and(|e| e.released)
    }

    fn update(&mut self, uid: &str, change: impl FnOnce(&mut Entry)) {
        let entry = self.entries.entry(uid.to_string()).or_default();
        let before = entry.holds();
        let address_before = entry.address();
        change(entry);
        let after = entry.holds();
        let address_after = entry.address();
        if entry.is_empty() {
            self.entries.remove(uid);
        }
        if address_before != address_after {
            if let Some(a) = address_before {
                if let Some(n) = self.addresses.get_mut(&a) {
                    *n -= 1;
                    if *n == 0 {
                        self.addresses.remove(&a);
                    }
                }
            }
            if let Some(a) = address_after {
                *self.addresses.entry(a).or_insert(0) += 1;
            }
        }
        if before == after {
            return;
        }
        for (hold, delta) in [(before, -1), (after, 1)] {
            let Some(hold) = hold else { continue };
            add(&mut self.counts, &hold.node_type, delta);
            let by_type = self.namespaces.entry(hold.namespace.clone()).or_default();
            add(by_type, &hold.node_type, delta);
            if by_type.is_empty() {
                self.namespaces.remove(&hold.namespace);
            }
            if let Some(zone) = &hold.zone {
                let zones = self.zones.entry(hold.node_type.clone()).or_default();
                add(zones, zone, delta);
                if zones.is_empty() {
                    self.zones.remove(&hold.node_type);
                }
            }
            if hold.parked {
                let zones = self.parked.entry(hold.node_type.clone()).or_default();
                add(zones, hold.zone.as_deref().unwrap_or_default(), delta);
                if zones.is_empty() {
                    self.parked.remove(&hold.node_type);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonodes_api::NodeClaimStatus;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn claim(uid: u8, type_ref: Option<u8>, failed: bool) -> NodeClaim {
        zoned_claim(uid, type_ref, None, failed)
    }

    fn zoned_claim(uid: u8, type_ref: Option<u8>, zone: Option<u8>, failed: bool) -> NodeClaim {
        let mut c: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": format!("c{uid}"), "namespace": "t", "uid": format!("u{uid}")},
            "spec": {"vClusterRef": {"name": "t"}}
        }))
        .expect("claim");
        c.status = Some(NodeClaimStatus {
            type_ref: type_ref.map(|t| format!("p.t{t}")),
            zone: zone.map(|z| format!("z{z}")),
            phase: failed.then_some(NodeClaimPhase::Failed),
            ..NodeClaimStatus::default()
        });
        c
    }

    #[derive(Debug, Clone)]
    enum Op {
        Store(u8, Option<u8>, Option<u8>, bool),
        Delete(u8),
        Relist,
        Reserve(u8, u8, Option<u8>),
        Unreserve(u8),
        Release(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let uid = 0u8..6;
        let t = 0u8..3;
        prop_oneof![
            (
                uid.clone(),
                proptest::option::of(t.clone()),
                proptest::option::of(0u8..2),
                any::<bool>()
            )
                .prop_map(|(u, t, z, f)| Op::Store(u, t, z, f)),
            uid.clone().prop_map(Op::Delete),
            Just(Op::Relist),
            (uid.clone(), t, proptest::option::of(0u8..2))
                .prop_map(|(u, t, z)| Op::Reserve(u, t, z)),
            uid.clone().prop_map(Op::Unreserve),
            uid.prop_map(Op::Release),
        ]
    }

    proptest! {
        /// Whatever happens, in whatever order, the ledger counts what the full recount
        /// over the same store, reservations and releases counts.
        #[test]
        fn the_ledger_always_equals_the_full_recount(ops in proptest::collection::vec(op(), 0..60)) {
            let mut ledger = ClaimedLedger::new();
            let mut store: BTreeMap<u8, NodeClaim> = BTreeMap::new();
            let mut reserved: HashMap<String, (String, Option<String>)> = HashMap::new();
            let mut released: HashSet<String> = HashSet::new();
            for op in ops {
                match op {
                    Op::Store(u, t, z, f) => {
                        let c = zoned_claim(u, t, z, f);
                        ledger.observe(&c);
                        store.insert(u, c);
                    }
                    Op::Delete(u) => {
                        // A claim leaves the store once its cleanup is done; the
                        // controller forgets it then, and so does its bookkeeping.
                        if store.remove(&u).is_some() {
                            ledger.forget(&format!("u{u}"));
                            reserved.remove(&format!("u{u}"));
                            released.remove(&format!("u{u}"));
                        }
                    }
                    Op::Relist => {
                        // A release whose claim the store no longer shows is forgotten.
                        ledger.resync(store.values());
                        released.retain(|u| {
                            reserved.contains_key(u)
                                || store.values().any(|c| c.metadata.uid.as_deref() == Some(u))
                        });
                    }
                    Op::Reserve(u, t, z) => {
                        let zone = z.map(|z| format!("z{z}"));
                        ledger.reserve(&format!("u{u}"), "t", &format!("p.t{t}"), zone.as_deref());
                        reserved.insert(format!("u{u}"), (format!("p.t{t}"), zone));
                    }
                    Op::Unreserve(u) => {
                        ledger.unreserve(&format!("u{u}"));
                        reserved.remove(&format!("u{u}"));
                    }
                    Op::Release(u) => {
                        ledger.release(&format!("u{u}"));
                        reserved.remove(&format!("u{u}"));
                        released.insert(format!("u{u}"));
                    }
                }
                let types: HashMap<String, String> = reserved
                    .iter()
                    .map(|(u, (t, _))| (u.clone(), t.clone()))
                    .collect();
                let recount = crate::catalogue::count_claimed(store.values(), &types, &released);
                prop_assert_eq!(ledger.counts(), &recount);
                let zones = recount_zones(&store, &reserved, &released);
                for t in 0..3u8 {
                    let t = format!("p.t{t}");
                    prop_assert_eq!(ledger.zone_counts(&t), zones.get(&t).unwrap_or(&NONE_COUNTED));
                }
                // Every claim here is in namespace `t`: its counts are the type counts.
                prop_assert_eq!(ledger.namespace_counts("t"), &recount);
            }
        }
    }

    #[test]
    fn a_failed_claim_gives_back_its_capacity_but_keeps_its_address_until_released() {
        let mut ledger = ClaimedLedger::new();
        ledger.reserve("u1", "t", "p.t0", None);
        ledger.reserve_address("u1", ip(1));
        ledger.unreserve_capacity("u1");
        assert_eq!(ledger.count("p.t0"), 0);
        assert!(ledger.address_taken(ip(1)));
        ledger.release("u1");
        assert!(!ledger.address_taken(ip(1)));
    }

    #[derive(Debug, Clone)]
    enum AddressOp {
        Store(u8, Option<u8>, bool),
        Reserve(u8, u8),
        Unreserve(u8),
        Release(u8),
        Delete(u8),
        Relist,
    }

    fn address_op() -> impl Strategy<Value = AddressOp> {
        let uid = 0u8..5;
        let a = 0u8..4;
        prop_oneof![
            (uid.clone(), proptest::option::of(a.clone()), any::<bool>())
                .prop_map(|(u, a, f)| AddressOp::Store(u, a, f)),
            (uid.clone(), a).prop_map(|(u, a)| AddressOp::Reserve(u, a)),
            uid.clone().prop_map(AddressOp::Unreserve),
            uid.clone().prop_map(AddressOp::Release),
            uid.prop_map(AddressOp::Delete),
            Just(AddressOp::Relist),
        ]
    }

    fn ip(a: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, a])
    }

    proptest! {
        /// An address is taken exactly while a claim that is not released holds it: its
        /// reservation, else its stored `status.address` (Failed claims included).
        #[test]
        fn an_address_is_taken_exactly_while_a_live_claim_holds_it(
            ops in proptest::collection::vec(address_op(), 0..60),
        ) {
            let mut ledger = ClaimedLedger::new();
            let mut store: BTreeMap<u8, Option<u8>> = BTreeMap::new();
            let mut reserved: BTreeMap<u8, u8> = BTreeMap::new();
            let mut released: HashSet<u8> = HashSet::new();
            for op in ops {
                match op {
                    AddressOp::Store(u, a, failed) => {
                        let mut c = claim(u, Some(0), failed);
                        if let Some(s) = c.status.as_mut() {
                            s.address = a.map(|a| format!("{}/24", ip(a)));
                        }
                        ledger.observe(&c);
                        store.insert(u, a);
                    }
                    AddressOp::Reserve(u, a) => {
                        ledger.reserve_address(&format!("u{u}"), ip(a));
                        reserved.insert(u, a);
                    }
                    AddressOp::Unreserve(u) => {
                        ledger.unreserve(&format!("u{u}"));
                        reserved.remove(&u);
                    }
                    AddressOp::Release(u) => {
                        ledger.release(&format!("u{u}"));
                        reserved.remove(&u);
                        released.insert(u);
                    }
                    AddressOp::Delete(u) => {
                        if store.remove(&u).is_some() {
                            ledger.forget(&format!("u{u}"));
                            reserved.remove(&u);
                            released.remove(&u);
                        }
                    }
                    AddressOp::Relist => {
                        let claims: Vec<NodeClaim> = store
                            .iter()
                            .map(|(u, a)| {
                                let mut c = claim(*u, Some(0), false);
                                if let Some(s) = c.status.as_mut() {
                                    s.address = a.map(|a| ip(a).to_string());
                                }
                                c
                            })
                            .collect();
                        ledger.resync(claims.iter());
                        released.retain(|u| reserved.contains_key(u) || store.contains_key(u));
                    }
                }
                for a in 0..4u8 {
                    let held = (0..5u8).any(|u| {
                        !released.contains(&u)
                            && reserved.get(&u).copied().or(store.get(&u).copied().flatten())
                                == Some(a)
                    });
                    prop_assert_eq!(ledger.address_taken(ip(a)), held, "address {}", a);
                }
            }
        }
    }

    /// The per-zone count by the same rule as `count_claimed`, recounted from scratch.
    fn recount_zones(
        store: &BTreeMap<u8, NodeClaim>,
        reserved: &HashMap<String, (String, Option<String>)>,
        released: &HashSet<String>,
    ) -> BTreeMap<String, BTreeMap<String, i64>> {
        let mut by_uid: HashMap<String, (String, Option<String>)> = HashMap::new();
        for c in store.values() {
            let (Some(uid), Some(s)) = (c.metadata.uid.clone(), c.status.as_ref()) else {
                continue;
            };
            if s.phase == Some(NodeClaimPhase::Failed) || released.contains(&uid) {
                continue;
            }
            if let Some(t) = &s.type_ref {
                by_uid.insert(uid, (t.clone(), s.zone.clone()));
            }
        }
        for (uid, held) in reserved {
            if !released.contains(uid) {
                by_uid.insert(uid.clone(), held.clone());
            }
        }
        let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for (t, z) in by_uid.into_values() {
            if let Some(z) = z {
                *out.entry(t).or_default().entry(z).or_insert(0) += 1;
            }
        }
        out
    }

    #[test]
    fn a_claim_holds_its_reserved_type_and_zone_until_released() {
        let mut ledger = ClaimedLedger::new();
        assert_eq!(ledger.holding("u1"), None);
        ledger.reserve("u1", "t", "p.a", Some("zone-b"));
        assert_eq!(ledger.holding("u1"), Some(("p.a", Some("zone-b"))));
        ledger.release("u1");
        assert_eq!(ledger.holding("u1"), None);
    }

    #[test]
    fn namespace_counts_keep_namespaces_apart() {
        let mut l = ClaimedLedger::new();
        l.reserve("u1", "a", "p.t0", None);
        l.reserve("u2", "b", "p.t0", None);
        l.reserve("u3", "a", "p.t1", None);
        assert_eq!(
            l.namespace_counts("a"),
            &BTreeMap::from([("p.t0".to_string(), 1), ("p.t1".to_string(), 1)])
        );
        assert_eq!(
            l.namespace_counts("b"),
            &BTreeMap::from([("p.t0".to_string(), 1)])
        );
        l.release("u2");
        assert!(l.namespace_counts("b").is_empty());
        assert_eq!(l.count("p.t0"), 1);
    }

    #[test]
    fn zone_counts_follow_reservations_the_store_and_releases() {
        let mut l = ClaimedLedger::new();
        l.reserve("u1", "t", "p.t0", Some("z0"));
        l.reserve("u2", "t", "p.t0", Some("z1"));
        l.observe(&zoned_claim(3, Some(0), Some(1), false));
        assert_eq!(
            l.zone_counts("p.t0"),
            &BTreeMap::from([("z0".to_string(), 1), ("z1".to_string(), 2)])
        );
        l.release("u2");
        l.observe(&zoned_claim(3, Some(0), Some(1), true));
        assert_eq!(
            l.zone_counts("p.t0"),
            &BTreeMap::from([("z0".to_string(), 1)])
        );
        assert!(l.zone_counts("p.other").is_empty());
    }

    #[test]
    fn a_reservation_counts_until_the_store_shows_it_and_a_release_frees_it() {
        let mut l = ClaimedLedger::new();
        l.reserve("u1", "t", "p.a", None);
        assert_eq!(l.count("p.a"), 1);
        l.observe(&claim(1, None, false));
        assert_eq!(
            l.count("p.a"),
            1,
            "the reservation wins over a store behind"
        );
        l.release("u1");
        assert_eq!(l.count("p.a"), 0);
        assert!(l.is_released("u1"));
        l.observe(&claim(1, Some(0), false));
        assert_eq!(
            l.count("p.t0"),
            0,
            "a released claim holds nothing, whatever caches show"
        );
        l.forget("u1");
        assert!(!l.is_released("u1"));
        assert!(l.counts().is_empty());
    }
}
