//! The SSRF guard: which addresses Herald may send webhooks to.
//!
//! Checked twice: when an endpoint is created (so users hear about it at once)
//! and inside the HTTP client's DNS resolution on every connection, where the
//! addresses that passed are the only ones the client may connect to, so a
//! DNS answer that changes between check and connect cannot slip through.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Whether an endpoint URL carries credentials in its userinfo
/// (`https://user:pass@host/`): sealed at rest and masked when shown.
pub fn url_has_credentials(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
}

/// `url` with its userinfo masked (`https://••••@host/…`), for whoever may
/// not read the endpoint's secret, and for the attempt log; a URL without
/// credentials (or one that does not parse) as it is.
pub fn masked_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            // Both setters only fail for URLs that cannot have userinfo,
            // which these have.
            let _ = u.set_password(None);
            let _ = u.set_username("****");
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// True when `ip` is a public unicast address on the internet.
pub fn is_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_global_v4(v4),
        IpAddr::V6(v6) => is_global_v6(v6),
    }
}

/// The IANA IPv4 Special-Purpose Address Registry's ranges that are not
/// globally reachable (192.0.0.0/24 whole, its two anycast exceptions too).
fn is_global_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0                                   // "this network", 0.0.0.0
        || a == 10                             // RFC 1918
        || a == 127                            // loopback
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 169 && b == 254)              // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b)) // RFC 1918
        || (a == 192 && b == 168)              // RFC 1918
        || (a == 192 && b == 0 && c == 0)      // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)      // TEST-NET-1
        || (a == 192 && b == 88 && c == 99)    // 6to4 relay anycast (deprecated)
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100)   // TEST-NET-2
        || (a == 203 && b == 0 && c == 113)    // TEST-NET-3
        || a >= 224) // multicast, reserved, broadcast
}

/// Global unicast is `2000::/3` and nothing else: everything outside it is
/// loopback, unspecified, IPv4-compatible or -translated, NAT64 local-use
/// (`64:ff9b:1::/48`), discard-only, dummy, segment-routing, unique-local,
/// link-local, site-local, multicast or unassigned. Three forms that carry
/// an IPv4 address the packet really goes to are judged by it: IPv4-mapped
/// (`::ffff:0:0/96`), NAT64 (`64:ff9b::/96`) and 6to4 (`2002::/16`). Inside
/// `2000::/3` the IANA IPv6 Special-Purpose Address Registry's non-global
/// ranges are refused: `2001::/23` whole (Teredo `2001::/32`, benchmarking,
/// ORCHID; its anycast and identifier exceptions are no web servers
/// either) and the documentation prefixes `2001:db8::/32` and `3fff::/20`.
fn is_global_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    let v4 = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if let Some(mapped) = ip.to_ipv4_mapped() {
        return is_global_v4(mapped);
    }
    if seg[..6] == [0x0064, 0xff9b, 0, 0, 0, 0] {
        return is_global_v4(v4(seg[6], seg[7]));
    }
    if seg[0] == 0x2002 {
        return is_global_v4(v4(seg[1], seg[2]));
    }
    if seg[0] & 0xe000 != 0x2000 {
        return false;
    }
    match seg[0] {
        // IETF protocol assignments 2001::/23 (Teredo among them), and
        // documentation 2001:db8::/32.
        0x2001 => !(seg[1] < 0x0200 || seg[1] == 0x0db8),
        // Documentation 3fff::/20 (RFC 9637).
        0x3fff => seg[1] >= 0x1000,
        _ => true,
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("not a valid URL: {0}")]
    Invalid(String),
    #[error("URL scheme must be http or https, not `{0}`")]
    Scheme(String),
    #[error("URL has no host")]
    NoHost,
    #[error("URL host {host} is a non-public address ({ip}); set HERALD_ALLOW_PRIVATE_NETWORKS=true to allow it")]
    Forbidden { host: String, ip: IpAddr },
}

/// Whether private, loopback and other non-global addresses are allowed.
#[derive(Debug, Clone, Copy)]
pub struct NetworkPolicy {
    pub allow_private: bool,
}

impl NetworkPolicy {
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), UrlError> {
        if self.allow_private || is_global(ip) {
            Ok(())
        } else {
            Err(UrlError::Forbidden {
                host: host.to_owned(),
                ip,
            })
        }
    }

    /// Resolves `url`'s host and checks every address, as endpoint creation
    /// does. A name that does not resolve now is accepted: it may be set up
    /// later, and the connect-time check still guards it.
    pub async fn check_resolved(&self, url: &WebhookUrl) -> Result<(), UrlError> {
        if self.allow_private {
            return Ok(());
        }
        let Some(url::Host::Domain(name)) = url.0.host() else {
            return Ok(()); // IP literals were checked when parsing.
        };
        let port = url.0.port_or_known_default().unwrap_or(443);
        if let Ok(addrs) = tokio::net::lookup_host((name, port)).await {
            for addr in addrs {
                self.check_ip(name, addr.ip())?;
            }
        }
        Ok(())
    }
}

/// An endpoint URL: http(s), with a host, and not a forbidden IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl(url::Url);

impl WebhookUrl {
    pub fn parse(s: &str, policy: NetworkPolicy) -> Result<Self, UrlError> {
        let url = url::Url::parse(s.trim()).map_err(|e| UrlError::Invalid(e.to_string()))?;
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(UrlError::Scheme(other.to_owned())),
        }
        let host = url.host().ok_or(UrlError::NoHost)?;
        if let Some(ip) = host_ip(&host) {
            policy.check_ip(&host.to_string(), ip)?;
        }
        if let url::Host::Domain(name) = &host {
            // No DNS name has an empty label, but the URL parser keeps
            // `0.0.0.0..` as a name, which some resolvers read as the
            // address without the dots: refuse it here rather than rely on
            // the resolver's reading.
            if name
                .strip_suffix('.')
                .unwrap_or(name)
                .split('.')
                .any(str::is_empty)
            {
                return Err(UrlError::Invalid(format!(
                    "host `{name}` has an empty label"
                )));
            }
        }
        Ok(WebhookUrl(url))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn host_str(&self) -> Option<&str> {
        self.0.host_str()
    }

    pub fn into_url(self) -> url::Url {
        self.0
    }

    /// The host as an address, when it is an IP literal (the HTTP client
    /// skips DNS for those, so the sender checks them itself).
    pub fn ip_literal(&self) -> Option<IpAddr> {
        self.0.host().as_ref().and_then(host_ip)
    }
}

fn host_ip(host: &url::Host<&str>) -> Option<IpAddr> {
    match host {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(*v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(*v6)),
        url::Host::Domain(_) => None,
    }
}

/// The outbound client's resolver: resolves, then refuses the whole name if
/// any address is non-global, and hands the client only checked addresses.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    pub policy: NetworkPolicy,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for addr in &addrs {
                policy.check_ip(&host, addr.ip())?;
            }
            let iter: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(iter)
        })
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    const DENY: NetworkPolicy = NetworkPolicy {
        allow_private: false,
    };
    const ALLOW: NetworkPolicy = NetworkPolicy {
        allow_private: true,
    };

    /// Found by the property tests: the URL parser keeps `0.0.0.0..` as a
    /// name, which reads as an address once its dots are taken off.
    #[test]
    fn names_with_an_empty_label_are_refused_and_one_root_dot_is_fine() {
        for url in [
            "http://0.0.0.0../",
            "http://a..example.com/",
            "https://example.com../",
        ] {
            assert!(
                matches!(WebhookUrl::parse(url, ALLOW), Err(UrlError::Invalid(_))),
                "{url}"
            );
        }
        assert!(WebhookUrl::parse("https://example.com./hook", DENY).is_ok());
    }

    #[test]
    fn non_global_addresses_are_refused() {
        for ip in [
            "0.0.0.0",
            "10.1.2.3",
            "127.0.0.1",
            "127.255.255.254",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.1.1.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:c0a8:0101::1",
            "100::1",
            // IPv4-translated (::ffff:0:0:0/96), whatever it embeds.
            "::ffff:0:7f00:1",
            "::ffff:0:808:808",
            // IPv4-compatible (deprecated), whatever it embeds.
            "::8.8.8.8",
            // NAT64: local-use, and the well-known prefix to a private IPv4.
            "64:ff9b:1::1",
            "64:ff9b:1:ffff::808:808",
            "64:ff9b::7f00:1",
            "64:ff9b::a00:1",
            // 6to4 of loopback and of link-local.
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
            // Teredo, benchmarking, ORCHIDv2, and the rest of 2001::/23.
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:2::1",
            "2001:20::1",
            "2001:1ff:ffff::1",
            // Documentation, both prefixes.
            "2001:db8:85a3::8a2e:370:7334",
            "3fff::1",
            "3fff:fff:ffff::1",
            // Discard-only and dummy (100::/64, 100:0:0:1::/64).
            "100::ffff:1",
            "100:0:0:1::1",
            // Segment routing SIDs, unassigned space.
            "5f00::1",
            "4000::1",
            "1::1",
            // Site-local, link-local, unique-local, multicast.
            "fec0::1",
            "fe80::1:2:3:4",
            "fd00::1",
            "ff05::2",
            // 6to4 relay anycast.
            "192.88.99.1",
            "::ffff:192.88.99.1",
        ] {
            let ip: IpAddr = ip.parse().expect("test address parses");
            assert!(!is_global(ip), "{ip} must not be global");
        }
    }

    #[test]
    fn public_addresses_are_allowed() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.1.1",
            "169.253.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:200::1",
            "2001:4860:4860::8888",
            "2620:fe::fe",
            "3fff:1000::1",
            "2a00:1450:4001:81c::200e",
        ] {
            let ip: IpAddr = ip.parse().expect("test address parses");
            assert!(is_global(ip), "{ip} must be global");
        }
    }

    #[test]
    fn urls_are_parsed_and_checked() {
        assert!(WebhookUrl::parse("https://example.com/hook", DENY).is_ok());
        assert!(WebhookUrl::parse("http://8.8.8.8:8080/x", DENY).is_ok());
        assert_eq!(
            WebhookUrl::parse("ftp://example.com", DENY),
            Err(UrlError::Scheme("ftp".into()))
        );
        assert!(matches!(
            WebhookUrl::parse("not a url", DENY),
            Err(UrlError::Invalid(_))
        ));
        assert!(matches!(
            WebhookUrl::parse("http://169.254.169.254/latest/meta-data", DENY),
            Err(UrlError::Forbidden { .. })
        ));
        assert!(matches!(
            WebhookUrl::parse("http://[::1]:80/", DENY),
            Err(UrlError::Forbidden { .. })
        ));
        assert!(matches!(
            WebhookUrl::parse("http://[::ffff:7f00:1]/", DENY),
            Err(UrlError::Forbidden { .. })
        ));
        for literal in [
            "[::ffff:0:7f00:1]",
            "[64:ff9b:1::a9fe:a9fe]",
            "[2001::1]",
            "[3fff::1]",
        ] {
            assert!(
                matches!(
                    WebhookUrl::parse(&format!("http://{literal}/hook"), DENY),
                    Err(UrlError::Forbidden { .. })
                ),
                "{literal} is refused at parse"
            );
        }
        // Decimal and hex IPv4 forms are normalised by the URL parser.
        assert!(matches!(
            WebhookUrl::parse("http://2130706433/", DENY),
            Err(UrlError::Forbidden { .. })
        ));
        assert!(matches!(
            WebhookUrl::parse("http://0x7f.1/", DENY),
            Err(UrlError::Forbidden { .. })
        ));
        assert!(WebhookUrl::parse("http://127.0.0.1:9/", ALLOW).is_ok());
    }

    #[tokio::test]
    async fn names_resolving_to_loopback_are_refused_at_creation() {
        let url = WebhookUrl::parse("http://localhost:9/", DENY).expect("syntax is fine");
        assert!(matches!(
            DENY.check_resolved(&url).await,
            Err(UrlError::Forbidden { .. })
        ));
        assert!(ALLOW.check_resolved(&url).await.is_ok());
    }
}
