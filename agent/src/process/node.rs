//! The node's addresses as this pod sees them: where the kubelet's hooks come from. The kubelet
//! runs in the node's network namespace and connects to the pod's IP; the kernel gives the
//! connection the node's address toward the pod network, which is one of the node's own IPs
//! (`status.hostIPs`, given as [`HOST_IPS`], with Calico and most routed CNIs) or the pod's
//! default gateway (the bridge plugin's and flannel's `cni0`, Cilium's `cilium_host`). Another
//! pod's connection comes from that pod's own IP, which is neither; restricted pods cannot spoof
//! a source address (they have no `NET_RAW`). Where the kubelet connects from elsewhere
//! (OVN-Kubernetes' join subnet, a second network card), the operator's `--node-networks` names
//! those ranges ([`NODE_NETWORKS`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use toa_context::network::{networks, Network};

pub use toa_context::control::HOST_IPS;
pub use toa_context::network::NODE_NETWORKS;

/// Where the node's connections come from: its addresses, and the ranges named for it.
#[derive(Debug, Clone, Default)]
pub struct Node {
    addresses: Vec<IpAddr>,
    networks: Vec<Network>,
}

impl Node {
    pub fn new(addresses: Vec<IpAddr>, networks: Vec<Network>) -> Self {
        Self {
            addresses,
            networks,
        }
    }

    /// Whether a connection from `peer` comes from the node.
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.addresses.contains(&peer) || self.networks.iter().any(|n| n.contains(peer))
    }
}

/// The node's addresses: `host_ips` (comma-separated, as the downward API writes
/// `status.hostIPs`) and the default gateways in `route` (`/proc/net/route`) and `route6`
/// (`/proc/net/ipv6_route`). Unreadable entries are skipped.
pub fn addresses(host_ips: &str, route: &str, route6: &str) -> Vec<IpAddr> {
    let mut found: Vec<IpAddr> = host_ips
        .split(',')
        .filter_map(|ip| ip.trim().parse().ok())
        .chain(gateways(route).map(IpAddr::V4))
        .chain(gateways6(route6).map(IpAddr::V6))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// This process's view: [`HOST_IPS`] from its environment and its network namespace's routes,
/// and the ranges [`NODE_NETWORKS`] names; a range that is not one is refused naming the
/// variable.
pub fn seen() -> Result<Node, String> {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let addresses = addresses(
        &std::env::var(HOST_IPS).unwrap_or_default(),
        &read("/proc/net/route"),
        &read("/proc/net/ipv6_route"),
    );
    let named = std::env::var(NODE_NETWORKS).unwrap_or_default();
    let networks = networks(&named).map_err(|error| format!("`{NODE_NETWORKS}`: {error}"))?;
    Ok(Node::new(addresses, networks))
}

/// The gateways of the IPv4 default routes: destination and mask 0, a gateway that is not 0. The
/// kernel prints the address's bytes as one integer in the machine's own order.
fn gateways(route: &str) -> impl Iterator<Item = Ipv4Addr> + '_ {
    route.lines().skip(1).filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (destination, gateway, mask) = (fields.get(1)?, fields.get(2)?, fields.get(7)?);
        if *destination != "00000000" || *mask != "00000000" {
            return None;
        }
        let gateway = u32::from_str_radix(gateway, 16).ok()?;
        (gateway != 0).then(|| Ipv4Addr::from(gateway.to_ne_bytes()))
    })
}

/// The next hops of the IPv6 default routes (`::/0`), when not `::`.
fn gateways6(route6: &str) -> impl Iterator<Item = Ipv6Addr> + '_ {
    route6.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (destination, prefix, next) = (fields.first()?, fields.get(1)?, fields.get(4)?);
        if destination.chars().any(|c| c != '0') || *prefix != "00" {
            return None;
        }
        let next = u128::from_str_radix(next, 16).ok()?;
        (next != 0).then(|| Ipv6Addr::from(next))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod's routes on the bridge plugin: the default via 10.244.0.1 (`cni0`), its subnet.
    const ROUTE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t0000F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
";
    const ROUTE6: &str = "\
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth0
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0
";

    #[test]
    fn the_node_is_its_host_ips_and_the_pods_default_gateways() {
        let found = addresses("192.168.1.7, fd00::7", ROUTE, ROUTE6);
        let expected: Vec<IpAddr> = ["10.244.0.1", "192.168.1.7", "fd00::7", "fe80::1"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn the_node_is_also_the_ranges_named_for_it() {
        let join = toa_context::network::Network::parse("100.64.0.0/16").unwrap();
        let node = Node::new(vec!["192.168.1.7".parse().unwrap()], vec![join]);
        for (peer, from_the_node) in [
            ("192.168.1.7", true),
            ("100.64.0.3", true),
            ("::ffff:100.64.0.3", true),
            ("10.244.0.9", false),
        ] {
            assert_eq!(
                node.contains(peer.parse().unwrap()),
                from_the_node,
                "{peer}"
            );
        }
        assert!(!Node::default().contains("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn nothing_readable_is_no_address() {
        assert!(addresses("", "", "").is_empty());
        assert!(addresses("not an ip,", "garbage\nmore garbage", "x").is_empty());
        // A subnet route is not a gateway; neither is a default route without one.
        let direct = "h\neth0\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert!(addresses("", direct, "").is_empty());
    }
}
