//! Tenant namespaces shared out among replicas (`autonodes run --shard-tenants`).
//!
//! Each replica is a *member*: it renews a Lease of its own and lists the others'. A tenant
//! namespace belongs to the live member with the highest [`score`] for it (rendezvous
//! hashing, [`owner`]): when a member comes or goes, only the namespaces it gains or loses
//! move, and every member that sees the same members computes the same owner.
//!
//! Members see each other through lists made at different moments, so their views differ
//! for a while. Two rules keep two members from acting for one namespace at once:
//!
//! - **A member is live while its Lease changes** ([`MemberClock`]): a Lease that no list
//!   showed changing for its duration belongs to a member that stopped. Its holder stops
//!   acting once it could not renew for the renew deadline (shorter than the duration), and
//!   the clock judges by the moment *this* member saw the last change, which is after the
//!   change was made; so by the time a member is judged gone it has stopped, and its
//!   namespaces are taken at once.
//! - **A namespace taken from a live member waits one Lease duration** ([`Ownership`]):
//!   a namespace moves from a live member only because another member appeared, and the
//!   member losing it may not have listed since. Every member lists within the renew
//!   deadline or stops, so after one Lease duration the old owner has seen the newcomer
//!   and let go. A member that just started waits one Lease duration before it acts for
//!   anything: it cannot know what the others saw before its Lease existed.
//!
//! What stays with one replica (providers, node types, quotas, the host sweep, and every
//! scheduling decision, which is the capacity ledger's write) is decided by the leader
//! Lease, not here.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::names::fnv1a;

/// The score of `member` for `namespace`: a 64-bit hash of both, mixed so that members
/// whose names differ in one character still spread evenly.
pub fn score(namespace: &str, member: &str) -> u64 {
    // splitmix64's finalizer over FNV-1a: FNV alone leaves the high bits of similar
    // inputs correlated.
    let mut z = fnv1a(&[namespace, member]);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The member that owns `namespace` among `members`: the one with the highest
/// [`score`] (the greater name on a tie); `None` when there is no member.
pub fn owner<'a>(
    namespace: &str,
    members: impl IntoIterator<Item = &'a String>,
) -> Option<&'a str> {
    members
        .into_iter()
        .map(|m| (score(namespace, m), m.as_str()))
        .max()
        .map(|(_, m)| m)
}

/// A member's Lease as one list showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSeen {
    /// The member (the Lease's name).
    pub member: String,
    /// What changes at each renewal (the Lease's `resourceVersion`).
    pub version: String,
    /// How long the Lease holds after a renewal (`leaseDurationSeconds`).
    pub duration: Duration,
    /// The member let it go on its way out (no `holderIdentity`): it stopped acting
    /// before it wrote that.
    pub released: bool,
}

/// When this replica last saw each member's Lease change, and so which members are live.
#[derive(Clone, Debug, Default)]
pub struct MemberClock {
    seen: BTreeMap<String, (String, Instant, Duration)>,
}

impl MemberClock {
    /// Records a list of the member Leases answered at `listed_at` and returns the live
    /// members: those whose Lease changed within its duration before `listed_at`, as this
    /// replica saw it (a Lease seen for the first time counts as just changed). A released
    /// Lease's member is gone at once. A Lease the list no longer shows without having
    /// been released (deleted by hand while its member may still run) is live until it
    /// expires as if it were there unchanged.
    pub fn observe(&mut self, listed_at: Instant, leases: &[LeaseSeen]) -> BTreeSet<String> {
        for l in leases {
            if l.released {
                self.seen.remove(&l.member);
                continue;
            }
            let changed = match self.seen.get(&l.member) {
                Some((version, _, _)) => version != &l.version,
                None => true,
            };
            if changed {
                self.seen
                    .insert(l.member.clone(), (l.version.clone(), listed_at, l.duration));
            } else if let Some(entry) = self.seen.get_mut(&l.member) {
                entry.2 = l.duration;
            }
        }
        // A Lease no longer listed is forgotten once it expired four times over (memory
        // stays bounded by the Leases the lists show); a listed one is kept, or it would
        // look new and live again.
        let listed: BTreeSet<&str> = leases.iter().map(|l| l.member.as_str()).collect();
        self.seen.retain(|m, (_, since, duration)| {
            listed.contains(m.as_str())
                || listed_at.saturating_duration_since(*since) <= duration.saturating_mul(4)
        });
        self.seen
            .iter()
            .filter(|(_, (_, since, duration))| {
                listed_at.saturating_duration_since(*since) <= *duration
            })
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Whether `member`'s Lease has not changed for `longer_than` beyond its duration as of
    /// `at`, or was never seen or was released (the leader deletes such Leases).
    pub fn long_gone(&self, member: &str, at: Instant, longer_than: Duration) -> bool {
        self.seen.get(member).is_none_or(|(_, since, duration)| {
            at.saturating_duration_since(*since) > duration.saturating_add(longer_than)
        })
    }
}

/// Which namespaces one member acts for: the views of the live members it had within the
/// last Lease duration, and since when it runs.
#[derive(Clone, Debug)]
pub struct Ownership {
    me: String,
    window: Duration,
    started: Option<Instant>,
    /// Each view of the live members, from when it was first seen (oldest first); views
    /// that ended before the window are dropped.
    views: VecDeque<(Instant, BTreeSet<String>)>,
}

impl Ownership {
    /// The ownership of member `me`, whose Leases hold for `window` (the Lease duration).
    pub fn new(me: &str, window: Duration) -> Self {
        Ownership {
            me: me.to_string(),
            window,
            started: None,
            views: VecDeque::new(),
        }
    }

    /// This member's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Records the live members as a list answered at `at` showed them (this member is
    /// always among them: its own Lease holds while it runs).
    pub fn observe(&mut self, at: Instant, mut live: BTreeSet<String>) {
        live.insert(self.me.clone());
        self.started.get_or_insert(at);
        if self.views.back().map(|(_, v)| v) != Some(&live) {
            self.views.push_back((at, live));
        }
        // Drop the views that stopped being current before the window began.
        while self.views.len() >= 2 && self.views[1].0 + self.window <= at {
            self.views.pop_front();
        }
    }

    /// The live members of the latest view.
    pub fn members(&self) -> Option<&BTreeSet<String>> {
        self.views.back().map(|(_, v)| v)
    }

    /// The owner of `namespace` in the latest view.
    pub fn owner_of(&self, namespace: &str) -> Option<&str> {
        owner(namespace, self.members()?)
    }

    /// Whether this member acts for `namespace` at `now`: it owns it in the latest view, it
    /// has run for one window, and no view of the window gave the namespace to another
    /// member that is still live.
    pub fn acts_for(&self, namespace: &str, now: Instant) -> bool {
        let Some(started) = self.started else {
            return false;
        };
        if now.saturating_duration_since(started) < self.window {
            return false;
        }
        let Some(current) = self.members() else {
            return false;
        };
        if owner(namespace, current) != Some(self.me.as_str()) {
            return false;
        }
        self.views.iter().enumerate().all(|(i, (_, view))| {
            let ended = self.views.get(i + 1).map(|(t, _)| *t);
            if ended.is_some_and(|t| now.saturating_duration_since(t) >= self.window) {
                return true;
            }
            match owner(namespace, view) {
                Some(o) if o != self.me => !current.contains(o),
                _ => true,
            }
        })
    }

    /// When [`Ownership::acts_for`] may next change without a new view: the end of the
    /// start wait or of the window of the latest view (`None`: only a new view changes it).
    pub fn settles_at(&self) -> Option<Instant> {
        let started = self.started?;
        let last = self.views.back().map(|(t, _)| *t)?;
        Some(started.max(last) + self.window)
    }
}

/// What `autonodes explain` says of who serves `namespace`, given each member Lease and
/// whether it looked live at a glance (held, renewed within its duration).
pub fn served_by_line(namespace: &str, members: &[(String, bool)]) -> String {
    let live: BTreeSet<String> = members
        .iter()
        .filter(|(_, live)| *live)
        .map(|(m, _)| m.clone())
        .collect();
    match owner(namespace, &live) {
        Some(o) => format!(
            "served by replica {o} (member {} of {} live; the leader schedules its claims)",
            live.iter().position(|m| m == o).map_or(0, |i| i + 1),
            live.len()
        ),
        None => format!(
            "served by no replica: none of the {} member Leases is live",
            members.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn ns(i: usize) -> String {
        format!("tenant-{i}")
    }

    #[test]
    fn namespaces_spread_evenly_over_three_members() {
        let members = set(&["autonodes-0_1a2b", "autonodes-1_3c4d", "autonodes-2_5e6f"]);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for i in 0..3000 {
            *counts
                .entry(owner(&ns(i), &members).expect("an owner"))
                .or_default() += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        for (m, n) in &counts {
            assert!((800..=1200).contains(n), "{m} owns {n} of 3000: {counts:?}");
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_namespaces() {
        let three = set(&["a", "b", "c"]);
        let two = set(&["a", "b"]);
        for i in 0..1000 {
            let before = owner(&ns(i), &three).expect("an owner");
            let after = owner(&ns(i), &two).expect("an owner");
            if before != "c" {
                assert_eq!(before, after, "{}", ns(i));
            }
        }
        assert_eq!(owner("x", &BTreeSet::new()), None);
    }

    #[test]
    fn a_lease_that_stops_changing_expires_after_its_duration_as_this_replica_saw_it() {
        let t0 = Instant::now();
        let d = Duration::from_secs(15);
        let lease = |m: &str, v: &str| LeaseSeen {
            member: m.into(),
            version: v.into(),
            duration: d,
            released: false,
        };
        let mut clock = MemberClock::default();
        assert_eq!(
            clock.observe(t0, &[lease("a", "1"), lease("b", "7")]),
            set(&["a", "b"])
        );
        // b keeps renewing, a does not.
        let t = t0 + Duration::from_secs(10);
        assert_eq!(
            clock.observe(t, &[lease("a", "1"), lease("b", "8")]),
            set(&["a", "b"])
        );
        let t = t0 + Duration::from_secs(16);
        assert_eq!(
            clock.observe(t, &[lease("a", "1"), lease("b", "9")]),
            set(&["b"])
        );
        assert!(!clock.long_gone("a", t, Duration::from_secs(30)));
        assert!(clock.long_gone("a", t0 + Duration::from_secs(50), Duration::from_secs(30)));
        // A renewed Lease is live again; one deleted by hand stays live until it expires;
        // a released one is gone at once.
        let t = t0 + Duration::from_secs(20);
        assert_eq!(clock.observe(t, &[lease("a", "2")]), set(&["a", "b"]));
        let t = t0 + Duration::from_secs(32);
        assert_eq!(clock.observe(t, &[lease("a", "2")]), set(&["a"]));
        let released = LeaseSeen {
            released: true,
            ..lease("a", "3")
        };
        assert_eq!(clock.observe(t, &[released]), set(&[]));
        assert!(clock.long_gone("a", t, Duration::ZERO));
    }

    #[test]
    fn a_new_member_waits_one_lease_duration_and_the_others_let_go_at_once() {
        let t0 = Instant::now();
        let w = Duration::from_secs(15);
        let mut a = Ownership::new("a", w);
        a.observe(t0, set(&["a"]));
        assert!(
            !a.acts_for("n", t0 + Duration::from_secs(14)),
            "waits after its start"
        );
        assert!(
            a.acts_for("n", t0 + w),
            "alone, it owns everything after the wait"
        );
        // c appears; find a namespace that moves to it.
        let moved = (0..1000)
            .map(ns)
            .find(|n| owner(n, &set(&["a", "c"])) == Some("c"))
            .expect("some namespace moves to c");
        let t1 = t0 + Duration::from_secs(30);
        a.observe(t1, set(&["a", "c"]));
        assert!(!a.acts_for(&moved, t1), "a lets go at once");
        let mut c = Ownership::new("c", w);
        c.observe(t1, set(&["a", "c"]));
        assert!(!c.acts_for(&moved, t1 + Duration::from_secs(14)));
        assert!(c.acts_for(&moved, t1 + w));
        assert_eq!(c.settles_at(), Some(t1 + w));
    }

    #[test]
    fn namespaces_of_a_member_judged_gone_are_taken_at_once_but_not_from_one_still_live() {
        let t0 = Instant::now();
        let w = Duration::from_secs(15);
        let mut a = Ownership::new("a", w);
        a.observe(t0, set(&["a", "b", "c"]));
        let of_c = (0..1000)
            .map(ns)
            .find(|n| {
                owner(n, &set(&["a", "b", "c"])) == Some("c")
                    && owner(n, &set(&["a", "b"])) == Some("a")
            })
            .expect("a namespace of c that goes to a");
        let t1 = t0 + Duration::from_secs(40);
        a.observe(t1, set(&["a", "b"]));
        assert!(
            a.acts_for(&of_c, t1),
            "c is gone: a takes its namespace at once"
        );
        // c comes back within the window, then goes again: while c was live within the
        // window, a waits.
        a.observe(t1 + Duration::from_secs(1), set(&["a", "b", "c"]));
        assert!(!a.acts_for(&of_c, t1 + Duration::from_secs(1)));
        a.observe(t1 + Duration::from_secs(2), set(&["a", "b"]));
        assert!(
            a.acts_for(&of_c, t1 + Duration::from_secs(2)),
            "gone again: taken at once"
        );
    }

    #[test]
    fn explain_names_the_live_member_that_serves_a_namespace() {
        let members = vec![
            ("a".to_string(), true),
            ("b".to_string(), true),
            ("c".to_string(), false),
        ];
        let line = served_by_line("team-x", &members);
        let live = set(&["a", "b"]);
        let o = owner("team-x", &live).expect("an owner");
        assert!(
            line.starts_with(&format!("served by replica {o} (member ")),
            "{line}"
        );
        assert!(line.contains("of 2 live"), "{line}");
        assert_eq!(
            served_by_line("team-x", &[("c".to_string(), false)]),
            "served by no replica: none of the 1 member Leases is live"
        );
    }

    /// One replica of the simulation below.
    struct Sim {
        name: String,
        start: u64,
        killed_at: Option<u64>,
        exited: bool,
        clock: MemberClock,
        own: Ownership,
        last_ok: u64,
        renewals: u64,
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Three replicas start at random moments, list and renew every retry period with
        /// random delays and failures, one may be killed: at no moment do two running
        /// replicas act for one namespace, and once things are quiet every namespace has
        /// exactly one.
        #[test]
        fn no_two_replicas_ever_act_for_one_namespace_and_every_namespace_ends_with_one(
            starts in proptest::collection::vec(0u64..20_000, 3),
            kill in proptest::option::of((0usize..3, 5_000u64..60_000)),
            jitter in proptest::collection::vec(0u64..600, 400),
            failures in proptest::collection::vec(proptest::bool::weighted(0.15), 400),
        ) {
            let lease = 15_000u64;
            let renew_deadline = 10_000u64;
            let retry = 2_000u64;
            let t0 = Instant::now();
            let at = |ms: u64| t0 + MS(ms);
            // The simulation steps by 250 ms: replicas start on a step.
            let starts: Vec<u64> = starts.iter().map(|s| s / 250 * 250).collect();
            let mut sims: Vec<Sim> = starts.iter().enumerate().map(|(i, s)| Sim {
                name: format!("r{i}"),
                start: *s,
                killed_at: kill.filter(|(k, _)| *k == i).map(|(_, t)| s + t),
                exited: false,
                clock: MemberClock::default(),
                own: Ownership::new(&format!("r{i}"), MS(lease)),
                last_ok: *s,
                renewals: 0,
            }).collect();
            let namespaces: Vec<String> = (0..24).map(ns).collect();
            let quiet_from = 120_000u64;
            let mut k = 0usize;
            let mut t = 0u64;
            while t < 200_000 {
                // Each running replica's turn: renew, then list what is stored.
                for i in 0..sims.len() {
                    let s = &sims[i];
                    let running = t >= s.start && !s.exited && s.killed_at.is_none_or(|kt| t < kt);
                    if !running || !(t - s.start).is_multiple_of(retry) {
                        continue;
                    }
                    k += 1;
                    let fails = t < quiet_from && failures[k % failures.len()];
                    let answered = t + jitter[k % jitter.len()];
                    if fails {
                        if answered - sims[i].last_ok > renew_deadline {
                            sims[i].exited = true;
                        }
                        continue;
                    }
                    if answered - sims[i].last_ok > renew_deadline {
                        sims[i].exited = true;
                        continue;
                    }
                    sims[i].renewals += 1;
                    sims[i].last_ok = answered;
                    // The Leases as stored: every replica that started and holds its Lease
                    // (an exited or killed one keeps its last renewal).
                    let leases: Vec<LeaseSeen> = sims.iter().filter(|o| o.start <= t).map(|o| LeaseSeen {
                        member: o.name.clone(),
                        version: o.renewals.to_string(),
                        duration: MS(lease),
                        released: false,
                    }).collect();
                    let s = &mut sims[i];
                    let live = s.clock.observe(at(answered), &leases);
                    s.own.observe(at(answered), live);
                }
                // Every 250 ms, who acts for what.
                if t.is_multiple_of(250) {
                    for n in &namespaces {
                        // A replica that could not renew for the renew deadline stops
                        // acting at once (its timer fires before its next turn).
                        let running = |s: &Sim| {
                            t >= s.start && !s.exited && s.killed_at.is_none_or(|kt| t < kt)
                                && t.saturating_sub(s.last_ok) <= renew_deadline
                        };
                        let acting: Vec<&str> = sims.iter().filter(|s| {
                            running(s) && s.own.acts_for(n, at(t))
                        }).map(|s| s.name.as_str()).collect();
                        prop_assert!(acting.len() <= 1, "at {t} ms {n} is acted for by {acting:?}");
                        if t >= 180_000 && sims.iter().any(running) {
                            prop_assert_eq!(acting.len(), 1, "at {} ms {} has no owner", t, n);
                        }
                    }
                }
                t += 250;
            }
        }
    }
}
