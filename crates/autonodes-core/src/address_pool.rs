//! Static node addresses: a node type's `addressPool` read and checked, the lowest address
//! of it no claim holds, and the cloud-init network data that gives a VM that address.
//!
//! Which addresses are held is not kept here: the capacity ledger
//! ([`crate::ledger::ClaimedLedger::address_taken`]) knows every claim's `status.address`
//! and this process's reservations, and scheduling picks an address under the same lock as
//! the node type, so two claims never get one address.

use std::collections::BTreeSet;
use std::net::IpAddr;

use autonodes_api::AddressPool;

/// The most addresses [`PreparedAddressPool::allocate`] looks at before it gives up (a pool
/// that large with that many held is not one a cluster has).
const MAX_SCAN: u128 = 1 << 20;

/// An address pool, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedAddressPool {
    /// The subnet's first address, as a number.
    base: u128,
    /// The prefix length.
    prefix: u8,
    /// Whether the subnet is IPv6.
    v6: bool,
    /// The default gateway.
    gateway: Option<IpAddr>,
    /// DNS servers.
    dns: Vec<IpAddr>,
    /// Addresses never handed out: the gateway, DNS servers and `exclude`.
    kept: BTreeSet<IpAddr>,
}

fn bits(v6: bool) -> u8 {
    if v6 {
        128
    } else {
        32
    }
}

fn number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn address(v6: bool, n: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(n.into())
    } else {
        // A v4 pool's numbers stay below 2^32.
        IpAddr::V4(u32::try_from(n).unwrap_or(u32::MAX).into())
    }
}

/// The name the network data gives the node's interface.
pub const NIC: &str = "eth0";

/// The MAC address of the VM interface that takes static address `ip`: locally
/// administered (`02:a5:`), then an IPv4 address's four bytes, or four bytes of a hash of an
/// IPv6 address. The same address always gives the same MAC, and two IPv4 addresses never
/// one MAC.
pub fn mac_for(ip: IpAddr) -> String {
    use sha2::{Digest, Sha256};
    let tail: [u8; 4] = match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let d = Sha256::digest(a.octets());
            [d[0], d[1], d[2], d[3]]
        }
    };
    format!(
        "02:a5:{:02x}:{:02x}:{:02x}:{:02x}",
        tail[0], tail[1], tail[2], tail[3]
    )
}

/// An address with or without a prefix length (`10.0.0.5` or `10.0.0.5/24`), as an address.
pub fn parse_address(text: &str) -> Option<IpAddr> {
    text.split('/').next()?.trim().parse().ok()
}

impl PreparedAddressPool {
    /// Reads `pool`; what is wrong with it otherwise (a message for the NodeType's status).
    pub fn new(pool: &AddressPool) -> Result<Self, String> {
        let (ip, prefix) = pool.cidr.split_once('/').ok_or_else(|| {
            format!(
                "addressPool.cidr {:?} is not a CIDR (address/prefix)",
                pool.cidr
            )
        })?;
        let ip: IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| format!("addressPool.cidr {:?}: not an IP address", pool.cidr))?;
        let v6 = ip.is_ipv6();
        let prefix: u8 = prefix
            .trim()
            .parse()
            .ok()
            .filter(|p| *p <= bits(v6))
            .ok_or_else(|| {
                format!(
                    "addressPool.cidr {:?}: the prefix length must be 0 to {}",
                    pool.cidr,
                    bits(v6)
                )
            })?;
        let host_bits = u32::from(bits(v6) - prefix);
        let mask = if host_bits >= 128 {
            0
        } else {
            !((1u128 << host_bits) - 1)
        };
        let base = number(ip) & mask;
        let mut out = PreparedAddressPool {
            base,
            prefix,
            v6,
            gateway: None,
            dns: Vec::new(),
            kept: BTreeSet::new(),
        };
        let read = |field: &str, text: &str| -> Result<IpAddr, String> {
            let a: IpAddr = text
                .trim()
                .parse()
                .map_err(|_| format!("addressPool.{field} {text:?}: not an IP address"))?;
            if a.is_ipv6() != v6 {
                return Err(format!(
                    "addressPool.{field} {text:?} is not of the family of cidr {:?}",
                    pool.cidr
                ));
            }
            Ok(a)
        };
        if let Some(g) = &pool.gateway {
            let g = read("gateway", g)?;
            if !out.contains(g) {
                return Err(format!(
                    "addressPool.gateway {g} is outside cidr {:?}",
                    pool.cidr
                ));
            }
            out.gateway = Some(g);
            out.kept.insert(g);
        }
        for d in &pool.dns_servers {
            let d = read("dnsServers", d)?;
            out.dns.push(d);
            out.kept.insert(d);
        }
        for e in &pool.exclude {
            out.kept.insert(read("exclude", e)?);
        }
        if out.usable() == 0 {
            return Err(format!(
                "addressPool.cidr {:?} leaves no address to hand out",
                pool.cidr
            ));
        }
        Ok(out)
    }

    /// Whether `ip` is inside the subnet.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv6() == self.v6 && number(ip) >= self.base && number(ip) <= self.last()
    }

    /// The subnet's last address.
    fn last(&self) -> u128 {
        let host_bits = u32::from(bits(self.v6) - self.prefix);
        if host_bits >= 128 {
            u128::MAX
        } else {
            self.base + ((1u128 << host_bits) - 1)
        }
    }

    /// The first and last address a node may get: not the subnet's own address (nor an
    /// IPv4 subnet's broadcast address), except in subnets of one or two addresses.
    fn range(&self) -> (u128, u128) {
        let (first, last) = (self.base, self.last());
        if last - first < 2 {
            (first, last)
        } else if self.v6 {
            (first + 1, last)
        } else {
            (first + 1, last - 1)
        }
    }

    /// How many addresses the pool can hand out at most (the gateway, DNS servers and
    /// exclusions inside the subnet left out), capped at 2^64.
    pub fn usable(&self) -> u128 {
        let (first, last) = self.range();
        let kept = self
            .kept
            .iter()
            .filter(|k| self.contains(**k) && (first..=last).contains(&number(**k)))
            .count() as u128;
        (last - first + 1).min(1 << 64).saturating_sub(kept)
    }

    /// How many addresses the pool can still hand out, given every address a claim holds
    /// (`held`, of any pool).
    pub fn free<'a>(&self, held: impl IntoIterator<Item = &'a IpAddr>) -> u128 {
        let (first, last) = self.range();
        let taken = held
            .into_iter()
            .filter(|a| {
                self.contains(**a)
                    && (first..=last).contains(&number(**a))
                    && !self.kept.contains(*a)
            })
            .count() as u128;
        self.usable().saturating_sub(taken)
    }

    /// The lowest address of the pool that is not kept back and that `taken` says no claim
    /// holds; `None` when there is none (the pool is exhausted).
    pub fn allocate(&self, taken: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
        let (first, last) = self.range();
        let mut n = first;
        let mut looked = 0;
        loop {
            let a = address(self.v6, n);
            if !self.kept.contains(&a) && !taken(a) {
                return Some(a);
            }
            looked += 1;
            if n == last || looked >= MAX_SCAN {
                return None;
            }
            n += 1;
        }
    }

    /// `ip` with the pool's prefix length (`10.20.0.5/24`): what a claim's `status.address`
    /// holds and the network data writes.
    pub fn with_prefix(&self, ip: IpAddr) -> String {
        format!("{ip}/{}", self.prefix)
    }

    /// Cloud-init network data (version 2) that gives the VM's interface whose MAC address
    /// is [`mac_for`]`(ip)` the address `ip` of this pool (naming it [`NIC`]), the pool's
    /// default route and DNS servers, and no DHCP. Matched by MAC, which every renderer of
    /// cloud-init (netplan, networkd, ENI, sysconfig) reads alike.
    pub fn network_data(&self, ip: IpAddr) -> String {
        let mut out = format!(
            "version: 2\nethernets:\n  {NIC}:\n    match:\n      macaddress: \"{}\"\n    set-name: {NIC}\n",
            mac_for(ip)
        );
        out.push_str(if self.v6 {
            "    dhcp6: false\n    accept-ra: false\n"
        } else {
            "    dhcp4: false\n"
        });
        out.push_str(&format!(
            "    addresses:\n      - \"{}\"\n",
            self.with_prefix(ip)
        ));
        if let Some(g) = self.gateway {
            let default = if self.v6 { "::/0" } else { "0.0.0.0/0" };
            out.push_str(&format!(
                "    routes:\n      - to: \"{default}\"\n        via: \"{g}\"\n"
            ));
        }
        if !self.dns.is_empty() {
            out.push_str("    nameservers:\n      addresses:\n");
            for d in &self.dns {
                out.push_str(&format!("        - \"{d}\"\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn pool(cidr: &str, gateway: Option<&str>, dns: &[&str], exclude: &[&str]) -> AddressPool {
        AddressPool {
            cidr: cidr.into(),
            gateway: gateway.map(Into::into),
            dns_servers: dns.iter().map(|s| s.to_string()).collect(),
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_lowest_free_address_skips_the_subnet_address_gateway_dns_and_exclusions() {
        let p = PreparedAddressPool::new(&pool(
            "10.20.0.0/24",
            Some("10.20.0.1"),
            &["10.20.0.2"],
            &["10.20.0.3"],
        ))
        .unwrap();
        assert_eq!(p.allocate(|_| false), Some("10.20.0.4".parse().unwrap()));
        let held: HashSet<IpAddr> = ["10.20.0.4", "10.20.0.5"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(
            p.allocate(|a| held.contains(&a)),
            Some("10.20.0.6".parse().unwrap())
        );
        assert_eq!(p.usable(), 254 - 3);
        // Held addresses of the pool count, others (and the kept-back ones) do not.
        let others: Vec<IpAddr> = ["10.20.0.4", "10.20.0.1", "10.21.0.4"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(p.free(&others), 254 - 3 - 1);
        assert_eq!(p.with_prefix("10.20.0.6".parse().unwrap()), "10.20.0.6/24");
    }

    #[test]
    fn an_ipv4_pool_never_hands_out_its_broadcast_address_and_is_exhausted_after_its_last_host() {
        let p = PreparedAddressPool::new(&pool("192.168.7.8/29", Some("192.168.7.9"), &[], &[]))
            .unwrap();
        let mut held = HashSet::new();
        while let Some(a) = p.allocate(|a| held.contains(&a)) {
            held.insert(a);
        }
        let mut got: Vec<String> = held.iter().map(ToString::to_string).collect();
        got.sort();
        assert_eq!(
            got,
            [
                "192.168.7.10",
                "192.168.7.11",
                "192.168.7.12",
                "192.168.7.13",
                "192.168.7.14"
            ]
        );
        assert_eq!(p.usable(), 5);
    }

    #[test]
    fn an_ipv6_pool_hands_out_addresses_after_the_subnet_router_address() {
        let p = PreparedAddressPool::new(&pool(
            "fd00:20::/64",
            Some("fd00:20::1"),
            &["fd00:20::53"],
            &[],
        ))
        .unwrap();
        assert_eq!(p.allocate(|_| false), Some("fd00:20::2".parse().unwrap()));
        let data = p.network_data("fd00:20::2".parse().unwrap());
        assert!(data.contains("\"fd00:20::2/64\""), "{data}");
        assert!(data.contains("to: \"::/0\""), "{data}");
        assert!(data.contains("via: \"fd00:20::1\""), "{data}");
    }

    #[test]
    fn a_pool_that_cannot_be_used_says_what_is_wrong() {
        for (p, says) in [
            (pool("10.0.0.0", None, &[], &[]), "not a CIDR"),
            (pool("10.0.0.0/33", None, &[], &[]), "prefix length"),
            (pool("x/24", None, &[], &[]), "not an IP address"),
            (
                pool("10.0.0.0/24", Some("10.0.1.1"), &[], &[]),
                "outside cidr",
            ),
            (pool("10.0.0.0/24", Some("fd00::1"), &[], &[]), "family"),
            (pool("10.0.0.0/24", None, &["dns"], &[]), "dnsServers"),
            (pool("10.0.0.0/32", None, &[], &["10.0.0.0"]), "no address"),
        ] {
            let e = PreparedAddressPool::new(&p).unwrap_err();
            assert!(e.contains(says), "{p:?}: {e}");
        }
    }

    #[test]
    fn the_network_data_is_cloud_init_version_2_with_the_address_route_and_dns_servers() {
        let p = PreparedAddressPool::new(&pool(
            "10.20.0.0/24",
            Some("10.20.0.1"),
            &["10.20.0.2", "1.1.1.1"],
            &[],
        ))
        .unwrap();
        let data = p.network_data("10.20.0.9".parse().unwrap());
        let v: serde_json::Value = crate::yaml::from_str(&data).unwrap();
        let nic = &v["ethernets"]["eth0"];
        assert_eq!(v["version"], 2);
        assert_eq!(nic["match"]["macaddress"], "02:a5:0a:14:00:09");
        assert_eq!(nic["set-name"], "eth0");
        assert_eq!(nic["dhcp4"], false);
        assert_eq!(nic["addresses"][0], "10.20.0.9/24");
        assert_eq!(nic["routes"][0]["to"], "0.0.0.0/0");
        assert_eq!(nic["routes"][0]["via"], "10.20.0.1");
        assert_eq!(nic["nameservers"]["addresses"][1], "1.1.1.1");
    }

    proptest! {
        /// Claims come and go in any order; each new one gets the lowest free address: no
        /// address is ever held twice, all lie in the subnet's host range and none is kept
        /// back, and the pool is exhausted only when every usable address is held.
        #[test]
        fn no_address_is_ever_held_by_two_claims(
            ops in proptest::collection::vec((any::<bool>(), 0usize..40), 1..300),
            prefix in 26u8..30,
        ) {
            let p = PreparedAddressPool::new(&pool(
                &format!("10.9.8.0/{prefix}"),
                Some("10.9.8.1"),
                &["10.9.8.2"],
                &["10.9.8.5"],
            ))
            .unwrap();
            let mut held: Vec<IpAddr> = Vec::new();
            for (add, which) in ops {
                if add || held.is_empty() {
                    let set: HashSet<IpAddr> = held.iter().copied().collect();
                    match p.allocate(|a| set.contains(&a)) {
                        Some(a) => {
                            prop_assert!(!set.contains(&a), "{a} handed out twice");
                            prop_assert!(p.contains(a));
                            prop_assert!(!["10.9.8.0", "10.9.8.1", "10.9.8.2", "10.9.8.5"]
                                .contains(&a.to_string().as_str()));
                            prop_assert_ne!(number(a), p.last(), "the broadcast address");
                            held.push(a);
                        }
                        None => prop_assert_eq!(held.len() as u128, p.usable()),
                    }
                } else {
                    held.remove(which % held.len());
                }
            }
        }
    }
}
