//! The client address of a request (docs/CONFIG.md, `http.trusted_proxies`):
//! the TCP peer, unless the peer is a trusted proxy; then `X-Forwarded-For`
//! is read from the right, skipping trusted proxies, and the first address
//! that is not one is the client. A header from an untrusted peer is never
//! read: anyone can send one.

use std::net::IpAddr;

use actix_web::HttpRequest;

/// An address block: `10.0.0.0/8`, `fd00::/8`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `ADDR/PREFIX` or a single `ADDR`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = addr.parse().map_err(|_| format!("`{text}` is not an address or CIDR"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{text}`: the prefix must be 0..={max}"))?,
        };
        Ok(Self { network, prefix })
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = canonical(addr);
        match (self.network, addr) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                masked(u32::from(net).into(), 32, self.prefix) == masked(u32::from(a).into(), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                masked(u128::from(net), 128, self.prefix) == masked(u128::from(a), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// An IPv4 address a dual-stack socket reports as `::ffff:a.b.c.d` is the
/// IPv4 address.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        v4 => v4,
    }
}

fn masked(bits: u128, width: u8, prefix: u8) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let keep = u32::from(width - prefix);
    (bits >> keep) << keep
}

/// The trusted proxies of the settings (validated when they were loaded).
pub fn trusted(proxies: &[String]) -> Vec<Cidr> {
    proxies.iter().filter_map(|p| Cidr::parse(p).ok()).collect()
}

/// Whether the TCP peer of `req` is a trusted proxy, whose forwarding
/// headers may be believed.
pub fn peer_is_trusted(req: &HttpRequest, proxies: &[Cidr]) -> bool {
    req.peer_addr().is_some_and(|peer| proxies.iter().any(|c| c.contains(canonical(peer.ip()))))
}

/// The client address of `req`, or None when the peer is unknown.
pub fn client_addr(req: &HttpRequest, proxies: &[Cidr]) -> Option<IpAddr> {
    let peer = canonical(req.peer_addr()?.ip());
    let forwarded = req.headers().get_all("x-forwarded-for").filter_map(|v| v.to_str().ok()).collect::<Vec<_>>();
    Some(from_chain(peer, &forwarded, proxies))
}

/// The client given the peer and the `X-Forwarded-For` values in order.
fn from_chain(peer: IpAddr, forwarded: &[&str], proxies: &[Cidr]) -> IpAddr {
    let trusted = |a: IpAddr| proxies.iter().any(|c| c.contains(a));
    if !trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded.iter().flat_map(|v| v.split(',')).map(str::trim).collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        // A hop that is not an address ends what can be believed.
        let Ok(addr) = hop.parse::<IpAddr>().map(canonical) else { break };
        client = addr;
        if !trusted(addr) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_parse_and_match() {
        let net = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(net.contains(ip("10.1.200.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.0.9")), "IPv4-mapped peers are IPv4");
        assert!(Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.1")));
        assert!(!Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.2")));
        assert!(Cidr::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("nonsense").is_err());
        assert!(Cidr::parse("10.0.0.0/x").is_err());
    }

    #[test]
    fn forwarded_for_is_read_only_from_trusted_proxies() {
        let proxies = vec![Cidr::parse("10.0.0.0/8").unwrap()];
        // Untrusted peer: its header is ignored.
        assert_eq!(from_chain(ip("203.0.113.5"), &["1.2.3.4"], &proxies), ip("203.0.113.5"));
        // Trusted peer: the rightmost untrusted hop is the client.
        assert_eq!(from_chain(ip("10.0.0.2"), &["1.2.3.4"], &proxies), ip("1.2.3.4"));
        assert_eq!(from_chain(ip("10.0.0.2"), &["6.6.6.6, 1.2.3.4, 10.0.0.7"], &proxies), ip("1.2.3.4"));
        assert_eq!(from_chain(ip("10.0.0.2"), &["6.6.6.6", "1.2.3.4"], &proxies), ip("1.2.3.4"));
        // No header, or garbage: the proxy itself.
        assert_eq!(from_chain(ip("10.0.0.2"), &[], &proxies), ip("10.0.0.2"));
        assert_eq!(from_chain(ip("10.0.0.2"), &["junk"], &proxies), ip("10.0.0.2"));
        // Without trusted proxies the peer counts.
        assert_eq!(from_chain(ip("10.0.0.2"), &["1.2.3.4"], &[]), ip("10.0.0.2"));
    }
}
