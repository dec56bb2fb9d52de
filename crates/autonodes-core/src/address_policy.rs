//! Which addresses autonodes may connect to for a tenant or host cluster: checked on every
//! connection, after DNS, so a kubeconfig whose server name resolves to a forbidden address
//! is refused as surely as one that names it. Pure: the controller's connector resolves
//! and asks [`AddressPolicy::check`].
//!
//! In this order:
//! 1. the management cluster's own API server ([`AddressPolicy::protected`]: the
//!    `kubernetes` Service and its endpoints, the server autonodes itself talks to), by
//!    address and port — always refused;
//! 2. the deny list (`--tenant-deny-cidrs`, `--host-deny-cidrs`) — refused;
//! 3. the allow list (`--tenant-allow-cidrs`, `--host-allow-cidrs`) — accepted, over the
//!    built-in list below (so a lab can allow one loopback address);
//! 4. the built-in list: loopback, unspecified, link-local (where cloud metadata services
//!    answer), multicast and broadcast addresses, the shared address space `100.64.0.0/10`
//!    (where some clouds' metadata services answer) and AWS's IPv6 metadata address
//!    `fd00:ec2::254` — refused;
//! 5. anything else — accepted. Private ranges and the Service CIDR are not refused by
//!    default: a vCluster's kubeconfig usually names its Service.
//!
//! An IPv6 address that carries an IPv4 one — IPv4-mapped (`::ffff:a.b.c.d`),
//! IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`)
//! — is judged as that IPv4 address at every step, so no spelling reaches an address that
//! the plain IPv4 form could not.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// An IPv4 or IPv6 network: an address and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `fd00::/8`, or a single address (`127.0.0.1`, a /32 or /128).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or network such as 10.0.0.0/8"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { network, prefix })
    }

    /// Parses a comma-separated list (empty: none).
    pub fn parse_list(s: &str) -> Result<Vec<Cidr>, String> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(Cidr::parse)
            .collect()
    }

    /// Whether `ip` lies in the network (an IPv4-mapped IPv6 address counts as its IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// An IPv6 address that carries an IPv4 one as that IPv4 address: IPv4-mapped
/// (`::ffff:0:0/96`), IPv4-compatible (`::/96`, but `::` and `::1`), the NAT64 well-known
/// prefix (`64:ff9b::/96`, RFC 6052) and 6to4 (`2002::/16`, the IPv4 address in bits
/// 16–47); others unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    let v6 = match ip {
        IpAddr::V6(v6) => v6,
        v4 => return v4,
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let bits = u128::from(v6);
    let low = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    let compatible = bits >> 32 == 0 && bits > 1;
    let nat64 = bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000;
    if compatible || nat64 {
        return IpAddr::V4(low);
    }
    if v6.segments()[0] == 0x2002 {
        return IpAddr::V4(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32));
    }
    IpAddr::V6(v6)
}

/// AWS's instance metadata service over IPv6.
const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Why an address is refused (coarse: what a tenant may be told).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The management cluster's own API server.
    ManagementApiServer,
    /// The management cluster's API server's addresses are not known (not read yet):
    /// nothing is connected to until they are.
    ManagementApiServerUnknown,
    /// An address of the deny list.
    Denied,
    /// Loopback.
    Loopback,
    /// `0.0.0.0` or `::`.
    Unspecified,
    /// Link-local (cloud metadata services answer there).
    LinkLocal,
    /// Multicast or broadcast.
    Multicast,
    /// The shared address space `100.64.0.0/10` (carrier-grade NAT; some clouds' metadata
    /// services answer there).
    SharedAddressSpace,
    /// A cloud's metadata service (`fd00:ec2::254`).
    MetadataService,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::ManagementApiServer => "it is the management cluster's API server",
            Refusal::ManagementApiServerUnknown => {
                "the management cluster's API server's addresses are not known yet"
            }
            Refusal::Denied => "it is on the deny list",
            Refusal::Loopback => "it is a loopback address",
            Refusal::Unspecified => "it is the unspecified address",
            Refusal::LinkLocal => "it is link-local (where cloud metadata services answer)",
            Refusal::Multicast => "it is a multicast or broadcast address",
            Refusal::SharedAddressSpace => {
                "it is in the shared address space 100.64.0.0/10 (where some clouds' metadata services answer)"
            }
            Refusal::MetadataService => "it is a cloud metadata service's address",
        })
    }
}

/// The addresses connections to one kind of cluster (tenant or host) may go to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Accepted over the built-in list.
    pub allow: Vec<Cidr>,
    /// Refused.
    pub deny: Vec<Cidr>,
    /// The management cluster's API server: refused whatever the lists say.
    pub protected: Vec<SocketAddr>,
}

impl AddressPolicy {
    /// Whether a connection to `addr` may be made.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Refusal> {
        let ip = canonical(addr.ip());
        if self
            .protected
            .iter()
            .any(|p| canonical(p.ip()) == ip && p.port() == addr.port())
        {
            return Err(Refusal::ManagementApiServer);
        }
        if self.deny.iter().any(|c| c.contains(ip)) {
            return Err(Refusal::Denied);
        }
        if self.allow.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
        match built_in(ip) {
            Some(r) => Err(r),
            None => Ok(()),
        }
    }
}

impl AddressPolicy {
    /// Whether the loopback address (`127.0.0.1`) is refused, as it is by default.
    pub fn refuses_loopback(&self) -> bool {
        self.check(SocketAddr::from((Ipv4Addr::LOCALHOST, 443)))
            .is_err()
    }
}

/// The built-in refusal of `ip`, if any.
fn built_in(ip: IpAddr) -> Option<Refusal> {
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_loopback() {
                Some(Refusal::Loopback)
            } else if v4.is_unspecified() {
                Some(Refusal::Unspecified)
            } else if v4.is_link_local() {
                Some(Refusal::LinkLocal)
            } else if v4.is_multicast() || v4 == Ipv4Addr::BROADCAST {
                Some(Refusal::Multicast)
            } else if u32::from(v4) & 0xffc0_0000 == 0x6440_0000 {
                Some(Refusal::SharedAddressSpace)
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_loopback() {
                Some(Refusal::Loopback)
            } else if v6.is_unspecified() {
                Some(Refusal::Unspecified)
            } else if is_link_local_v6(v6) {
                Some(Refusal::LinkLocal)
            } else if v6.is_multicast() {
                Some(Refusal::Multicast)
            } else if v6 == AWS_METADATA_V6 {
                Some(Refusal::MetadataService)
            } else {
                None
            }
        }
    }
}

fn is_link_local_v6(v6: Ipv6Addr) -> bool {
    v6.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn networks_parse_with_or_without_a_prefix_and_bad_ones_say_why() {
        assert_eq!(
            Cidr::parse("10.0.0.0/8").expect("v4").to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            Cidr::parse("127.0.0.1").expect("host").to_string(),
            "127.0.0.1/32"
        );
        assert_eq!(Cidr::parse("fd00::/8").expect("v6").to_string(), "fd00::/8");
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("example.com").is_err());
        assert_eq!(
            Cidr::parse_list(" 10.0.0.0/8, ,192.168.0.0/16")
                .expect("list")
                .len(),
            2
        );
    }

    #[test]
    fn loopback_link_local_unspecified_and_multicast_are_refused_by_default_in_every_spelling() {
        let p = AddressPolicy::default();
        for (a, why) in [
            ("127.0.0.1:443", Refusal::Loopback),
            ("127.9.9.9:6443", Refusal::Loopback),
            ("[::1]:443", Refusal::Loopback),
            ("[::ffff:127.0.0.1]:443", Refusal::Loopback),
            ("169.254.169.254:80", Refusal::LinkLocal),
            ("[::ffff:169.254.169.254]:80", Refusal::LinkLocal),
            ("[fe80::1]:443", Refusal::LinkLocal),
            ("0.0.0.0:443", Refusal::Unspecified),
            ("[::]:443", Refusal::Unspecified),
            ("224.0.0.1:443", Refusal::Multicast),
            ("255.255.255.255:443", Refusal::Multicast),
        ] {
            assert_eq!(p.check(addr(a)), Err(why), "{a}");
        }
        for a in [
            "10.96.0.10:443",
            "192.168.1.5:6443",
            "203.0.113.7:443",
            "[fd00::5]:443",
        ] {
            assert_eq!(
                p.check(addr(a)),
                Ok(()),
                "{a}: private ranges and Services stay"
            );
        }
    }

    #[test]
    fn the_allow_list_wins_over_the_built_in_list_but_never_over_the_deny_list_or_the_management_server(
    ) {
        let p = AddressPolicy {
            allow: vec![Cidr::parse("127.0.0.1").expect("cidr")],
            deny: vec![Cidr::parse("10.0.0.0/8").expect("cidr")],
            protected: vec![addr("127.0.0.1:6443"), addr("10.96.0.1:443")],
        };
        assert_eq!(p.check(addr("127.0.0.1:8443")), Ok(()));
        assert_eq!(p.check(addr("127.0.0.2:8443")), Err(Refusal::Loopback));
        assert_eq!(
            p.check(addr("127.0.0.1:6443")),
            Err(Refusal::ManagementApiServer)
        );
        assert_eq!(
            p.check(addr("[::ffff:10.96.0.1]:443")),
            Err(Refusal::ManagementApiServer)
        );
        assert_eq!(p.check(addr("10.1.2.3:443")), Err(Refusal::Denied));
    }

    #[test]
    fn ipv6_spellings_that_carry_a_refused_ipv4_address_and_metadata_ranges_are_refused() {
        let p = AddressPolicy::default();
        for (a, why) in [
            ("[::127.0.0.1]:443", Refusal::Loopback),
            ("[::169.254.169.254]:80", Refusal::LinkLocal),
            ("[64:ff9b::127.0.0.1]:443", Refusal::Loopback),
            ("[64:ff9b::a9fe:a9fe]:80", Refusal::LinkLocal),
            ("[2002:7f00:1::]:443", Refusal::Loopback),
            ("[2002:a9fe:a9fe::1]:80", Refusal::LinkLocal),
            ("[fd00:ec2::254]:80", Refusal::MetadataService),
            ("100.64.0.1:443", Refusal::SharedAddressSpace),
            ("100.100.100.200:80", Refusal::SharedAddressSpace),
            ("100.127.255.254:443", Refusal::SharedAddressSpace),
            ("[64:ff9b::6464:64c8]:80", Refusal::SharedAddressSpace),
        ] {
            assert_eq!(p.check(addr(a)), Err(why), "{a}");
        }
        // The same forms around an address that may be reached stay reachable, as do the
        // neighbours of the refused ranges.
        for a in [
            "[64:ff9b::cb00:7107]:443",
            "[2002:cb00:7107::]:443",
            "100.63.255.255:443",
            "100.128.0.0:443",
            "[fd00:ec2::253]:443",
            "[2001:db8::1]:443",
        ] {
            assert_eq!(p.check(addr(a)), Ok(()), "{a}");
        }
        // The deny list and the management server see through them too.
        let p = AddressPolicy {
            deny: vec![Cidr::parse("203.0.113.0/24").expect("cidr")],
            protected: vec![addr("10.96.0.1:443")],
            ..AddressPolicy::default()
        };
        assert_eq!(
            p.check(addr("[2002:cb00:7107::]:443")),
            Err(Refusal::Denied)
        );
        assert_eq!(
            p.check(addr("[64:ff9b::a60:1]:443")),
            Err(Refusal::ManagementApiServer)
        );
        // An allow list names the range to reach it (a lab on 100.64.0.0/10).
        let lab = AddressPolicy {
            allow: vec![Cidr::parse("100.64.0.0/10").expect("cidr")],
            ..AddressPolicy::default()
        };
        assert_eq!(lab.check(addr("100.64.3.4:443")), Ok(()));
    }

    proptest! {
        #[test]
        fn every_ipv6_spelling_of_an_ipv4_address_gets_the_same_answer_as_it(
            a in any::<u32>(), port in any::<u16>(), deny in any::<u32>(), prefix in 0u8..=32
        ) {
            let v4 = Ipv4Addr::from(a);
            let p = AddressPolicy {
                deny: vec![Cidr { network: IpAddr::V4(Ipv4Addr::from(deny)), prefix }],
                ..AddressPolicy::default()
            };
            let plain = p.check(SocketAddr::new(IpAddr::V4(v4), port));
            let a128 = u128::from(a);
            for bits in [a128 | 0x0064_ff9b << 96, a128 << 80 | 0x2002 << 112] {
                let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::from(bits)), port);
                prop_assert_eq!(p.check(v6), plain, "{}", v6);
            }
            if a > 1 {
                let compatible = SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a128)), port);
                prop_assert_eq!(p.check(compatible), plain);
            }
        }

        #[test]
        fn an_ipv4_address_and_its_mapped_ipv6_spelling_get_the_same_answer(
            a in any::<u32>(), port in any::<u16>(), allow in any::<u32>(), prefix in 0u8..=32
        ) {
            let v4 = Ipv4Addr::from(a);
            let p = AddressPolicy {
                allow: vec![Cidr { network: IpAddr::V4(Ipv4Addr::from(allow)), prefix }],
                ..AddressPolicy::default()
            };
            let plain = SocketAddr::new(IpAddr::V4(v4), port);
            let mapped = SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), port);
            prop_assert_eq!(p.check(plain), p.check(mapped));
        }
    }
}
