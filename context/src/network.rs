//! Address ranges (`10.0.0.0/8`, `fd00::/64`): the networks the kubelet's hooks may come from on
//! nodes where they do not come from the node's own addresses or the pod's gateway (OVN-Kubernetes'
//! join subnet, a second network card). Written once here: the operator checks its flag with it,
//! the agent its variable.

use std::fmt;
use std::net::IpAddr;

/// The variable the operator gives the agent: the networks, comma-separated.
pub const NODE_NETWORKS: &str = "TOA_NODE_NETWORKS";

/// An address range: an address and how many of its leading bits a member shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    /// `ADDRESS/PREFIX`; the error says what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        let refused =
            || format!("expected an address range such as 10.0.0.0/8 or fd00::/64, got {text:?}");
        let (address, prefix) = text.trim().split_once('/').ok_or_else(refused)?;
        let address: IpAddr = address.parse().map_err(|_| refused())?;
        let prefix: u8 = prefix.parse().map_err(|_| refused())?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err(refused());
        }
        Ok(Self { address, prefix })
    }

    /// Whether `ip` is in the range (an IPv4 address written as IPv6, `::ffff:a.b.c.d`, as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let shared = |a: u128, b: u128, bits: u32| {
            let shift = bits - u32::from(self.prefix);
            shift >= bits || (a >> shift) == (b >> shift)
        };
        match (self.address, ip.to_canonical()) {
            (IpAddr::V4(range), IpAddr::V4(ip)) => {
                shared(u128::from(u32::from(range)), u128::from(u32::from(ip)), 32)
            }
            (IpAddr::V6(range), IpAddr::V6(ip)) => shared(u128::from(range), u128::from(ip), 128),
            _ => false,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// Comma-separated ranges; blank: none.
pub fn networks(text: &str) -> Result<Vec<Network>, String> {
    text.split(',')
        .filter(|part| !part.trim().is_empty())
        .map(Network::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hold_their_members_only() {
        let join = Network::parse("100.64.0.0/16").unwrap();
        assert!(join.contains("100.64.3.7".parse().unwrap()));
        assert!(join.contains("::ffff:100.64.0.1".parse().unwrap()));
        assert!(!join.contains("100.65.0.1".parse().unwrap()));
        assert!(!join.contains("fd00::1".parse().unwrap()));
        let six = Network::parse("fd00:10::/32").unwrap();
        assert!(six.contains("fd00:10:ffff::1".parse().unwrap()));
        assert!(!six.contains("fd00:11::1".parse().unwrap()));
        assert!(Network::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        let one = Network::parse("10.0.0.9/32").unwrap();
        assert!(one.contains("10.0.0.9".parse().unwrap()));
        assert!(!one.contains("10.0.0.8".parse().unwrap()));
        assert_eq!(one.to_string(), "10.0.0.9/32");
    }

    #[test]
    fn a_list_reads_back_and_a_bad_entry_is_named() {
        let read = networks("100.64.0.0/16, fd00::/8,").unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!(networks("").unwrap(), Vec::new());
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "fd00::/129",
            "node/8",
            "10.0.0.0/x",
        ] {
            let error = networks(bad).unwrap_err();
            assert!(
                error.starts_with("expected an address range"),
                "{bad}: {error}"
            );
        }
    }
}
