//! Property tests of the SSRF guard's parser: no spelling of a forbidden
//! address gets through [`WebhookUrl::parse`], public ones in the same
//! spellings do, and whatever the URL parser leaves as a name is one the
//! HTTP client resolves (through [`GuardedResolver`]) rather than
//! connects to directly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;

const DENY: NetworkPolicy = NetworkPolicy {
    allow_private: false,
};

/// The IPv4 ranges `is_global_v4` refuses, as (network, prefix length).
const FORBIDDEN_V4: &[([u8; 4], u32)] = &[
    ([0, 0, 0, 0], 8),
    ([10, 0, 0, 0], 8),
    ([127, 0, 0, 0], 8),
    ([100, 64, 0, 0], 10),
    ([169, 254, 0, 0], 16),
    ([172, 16, 0, 0], 12),
    ([192, 168, 0, 0], 16),
    ([192, 0, 0, 0], 24),
    ([192, 0, 2, 0], 24),
    ([192, 88, 99, 0], 24),
    ([198, 18, 0, 0], 15),
    ([198, 51, 100, 0], 24),
    ([203, 0, 113, 0], 24),
    ([224, 0, 0, 0], 3), // multicast, reserved, broadcast
];

/// Some IPv6 ranges `is_global_v6` refuses (beside those embedding IPv4).
const FORBIDDEN_V6: &[(u128, u32)] = &[
    (0, 128),                     // ::
    (1, 128),                     // ::1
    (0xfe80 << 112, 10),          // link-local
    (0xfc00 << 112, 7),           // unique-local
    (0xfec0 << 112, 10),          // site-local
    (0xff00 << 112, 8),           // multicast
    (0x2001_0db8 << 96, 32),      // documentation
    (0x3fff << 112, 20),          // documentation
    (0x2001 << 112, 23),          // IETF protocol assignments
    (0x0064_ff9b_0001 << 80, 48), // NAT64 local-use
    (0x0100 << 112, 64),          // discard-only
    (0x4000 << 112, 2),           // unassigned, above 2000::/3
    (0, 16),                      // unassigned, below it
];

fn in_v4_range(net: [u8; 4], len: u32, noise: u32) -> Ipv4Addr {
    let base = u32::from_be_bytes(net);
    let host_bits = if len == 0 { u32::MAX } else { u32::MAX >> len };
    Ipv4Addr::from(base | (noise & host_bits))
}

fn forbidden_v4() -> impl Strategy<Value = Ipv4Addr> {
    (
        proptest::sample::select(FORBIDDEN_V4.to_vec()),
        any::<u32>(),
    )
        .prop_map(|((net, len), noise)| in_v4_range(net, len, noise))
}

fn public_v4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        Just(Ipv4Addr::new(8, 8, 8, 8)),
        Just(Ipv4Addr::new(1, 1, 1, 1)),
        any::<u32>().prop_map(Ipv4Addr::from),
    ]
    .prop_filter("a global address", |ip| is_global(IpAddr::V4(*ip)))
}

fn forbidden_v6() -> impl Strategy<Value = Ipv6Addr> {
    (
        proptest::sample::select(FORBIDDEN_V6.to_vec()),
        any::<u128>(),
    )
        .prop_map(|((net, len), noise)| {
            let host_bits = if len >= 128 { 0 } else { u128::MAX >> len };
            Ipv6Addr::from(net | (noise & host_bits))
        })
}

/// One part of a dotted IPv4 host, in the base `how` picks: decimal,
/// octal (a leading 0) or hex (0x or 0X), with extra leading zeros.
fn part(n: u32, how: u8, zeros: usize) -> String {
    let z = "0".repeat(zeros);
    match how % 4 {
        0 => n.to_string(),
        1 => format!("0{z}{n:o}"),
        2 => format!("0x{z}{n:x}"),
        _ => format!("0X{z}{n:X}"),
    }
}

/// The host spellings the WHATWG IPv4 parser (and inet_aton) read as `ip`.
fn v4_spellings(ip: Ipv4Addr, how: [u8; 4], zeros: [usize; 4]) -> Vec<String> {
    let n = u32::from(ip);
    let [a, b, c, d] = ip.octets().map(u32::from);
    let p = |i: usize, v: u32| part(v, how[i], zeros[i]);
    vec![
        ip.to_string(),
        n.to_string(),
        format!("0x{n:x}"),
        format!("0X{n:08X}"),
        format!("0{n:o}"),
        p(0, n),
        format!("{}.{}.{}.{}", p(0, a), p(1, b), p(2, c), p(3, d)),
        // Short forms: the last part fills the remaining bytes.
        format!("{}.{}.{}", p(0, a), p(1, b), p(2, (c << 8) | d)),
        format!("{}.{}", p(0, a), p(1, (b << 16) | (c << 8) | d)),
        // A trailing dot, in the long and a short form.
        format!("{ip}."),
        format!("{}.{}.", p(0, a), p(1, (b << 16) | (c << 8) | d)),
        // What IDNA maps to ASCII: fullwidth digits and ideographic stops.
        fullwidth(&ip.to_string()),
        ip.to_string().replace('.', "\u{3002}"),
        ip.to_string().replace('.', "\u{ff0e}"),
        ip.to_string().replace('.', "\u{ff61}"),
        // Percent-encoded, which the URL parser decodes in a host.
        ip.to_string()
            .bytes()
            .map(|b| format!("%{b:02X}"))
            .collect(),
        {
            let last = d.to_string();
            let (head, tail) = last.split_at(last.len() - 1);
            format!("{a}.{b}.{c}.{head}%{:02X}", tail.as_bytes()[0])
        },
    ]
}

fn fullwidth(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '0'..='9' => char::from_u32(0xff10 + (c as u32 - '0' as u32)).unwrap_or(c),
            other => other,
        })
        .collect()
}

/// IPv6 literals (inside brackets) that carry `ip` as the address the
/// packet goes to: IPv4-mapped, in every notation.
fn mapped_spellings(ip: Ipv4Addr) -> Vec<String> {
    let [a, b, c, d] = ip.octets();
    let hi = u16::from_be_bytes([a, b]);
    let lo = u16::from_be_bytes([c, d]);
    vec![
        format!("[::ffff:{ip}]"),
        format!("[::FFFF:{ip}]"),
        format!("[::ffff:{hi:x}:{lo:x}]"),
        format!("[::FFFF:{hi:04X}:{lo:04X}]"),
        format!("[0:0:0:0:0:ffff:{hi:x}:{lo:x}]"),
        format!("[0000:0000:0000:0000:0000:ffff:{ip}]"),
    ]
}

/// IPv6 literals whose packet goes to `ip` some other way, or that embed
/// it in a range refused whatever it embeds.
fn embedding_spellings(ip: Ipv4Addr) -> Vec<(String, Ipv6Addr)> {
    let [a, b, c, d] = ip.octets();
    let hi = u16::from_be_bytes([a, b]);
    let lo = u16::from_be_bytes([c, d]);
    let v6 = |s: [u16; 8]| Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
    vec![
        // IPv4-compatible (deprecated): refused whatever it embeds.
        (format!("[::{ip}]"), v6([0, 0, 0, 0, 0, 0, hi, lo])),
        // IPv4-translated: refused whatever it embeds.
        (
            format!("[::ffff:0:{ip}]"),
            v6([0, 0, 0, 0, 0xffff, 0, hi, lo]),
        ),
        // NAT64, the well-known prefix: judged by the IPv4 address.
        (
            format!("[64:ff9b::{ip}]"),
            v6([0x64, 0xff9b, 0, 0, 0, 0, hi, lo]),
        ),
        (
            format!("[64:FF9B::{hi:x}:{lo:x}]"),
            v6([0x64, 0xff9b, 0, 0, 0, 0, hi, lo]),
        ),
        // NAT64 local-use: refused whatever it embeds.
        (
            format!("[64:ff9b:1::{ip}]"),
            v6([0x64, 0xff9b, 1, 0, 0, 0, hi, lo]),
        ),
        // 6to4: judged by the IPv4 address.
        (
            format!("[2002:{hi:x}:{lo:x}::1]"),
            v6([0x2002, hi, lo, 0, 0, 0, 0, 1]),
        ),
    ]
}

/// How a host is placed in a URL: the address connected to is the host,
/// whatever precedes or follows it.
fn in_url(host: &str, how: u8) -> String {
    match how % 8 {
        0 => format!("http://{host}/"),
        1 => format!("https://{host}:8443/hook?x=1#f"),
        2 => format!("http://user:pass@{host}/"),
        3 => format!("http://example.com@{host}/"),
        4 => format!("HTTP://{host}"),
        5 => format!("  https://{host}/path  "),
        6 => format!("http://{host}:80"),
        _ => format!("https://{host}:0443/"),
    }
}

/// The host the URL parser sees, as an address, if it sees one.
fn parsed_ip(url: &str) -> Option<IpAddr> {
    let url = url::Url::parse(url.trim()).ok()?;
    url.host().as_ref().and_then(host_ip)
}

fn refused(url: &str) -> Result<(), TestCaseError> {
    let result = WebhookUrl::parse(url, DENY);
    prop_assert!(
        matches!(
            result,
            Err(UrlError::Forbidden { .. }) | Err(UrlError::Invalid(_))
        ),
        "{url:?} must be refused, got {result:?}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Every spelling of a forbidden IPv4 address is read as that address
    /// (or not at all) and refused.
    #[test]
    fn forbidden_v4_in_any_spelling_is_refused(
        ip in forbidden_v4(),
        how in any::<[u8; 4]>(),
        zeros in proptest::array::uniform4(0usize..3),
        wrap in any::<u8>(),
    ) {
        for host in v4_spellings(ip, how, zeros).into_iter().chain(mapped_spellings(ip)) {
            let url = in_url(&host, wrap);
            if let Some(seen) = parsed_ip(&url) {
                let expected = match seen {
                    IpAddr::V4(_) => IpAddr::V4(ip),
                    IpAddr::V6(_) => IpAddr::V6(ip.to_ipv6_mapped()),
                };
                prop_assert_eq!(seen, expected, "{:?}", url);
            }
            refused(&url)?;
            refused(&url.to_uppercase())?;
        }
    }

    /// Forbidden IPv4 addresses embedded in IPv6 (compatible, translated,
    /// NAT64, 6to4) are refused.
    #[test]
    fn forbidden_v4_embedded_in_v6_is_refused(ip in forbidden_v4(), wrap in any::<u8>()) {
        for (host, v6) in embedding_spellings(ip) {
            let url = in_url(&host, wrap);
            prop_assert_eq!(parsed_ip(&url), Some(IpAddr::V6(v6)), "{:?}", url);
            refused(&url)?;
        }
    }

    /// Public IPv4 addresses embedded in the forms that are refused
    /// whatever they embed are refused too (compatible, translated,
    /// NAT64 local-use).
    #[test]
    fn v4_in_always_refused_v6_forms_is_refused(ip in public_v4(), wrap in any::<u8>()) {
        for (host, _) in embedding_spellings(ip)
            .into_iter()
            .filter(|(h, _)| h.starts_with("[::") || h.starts_with("[64:ff9b:1"))
        {
            refused(&in_url(&host, wrap))?;
        }
    }

    /// Forbidden IPv6 addresses, compressed, in full, in capitals, with the
    /// last 32 bits dotted, with a zone id.
    #[test]
    fn forbidden_v6_in_any_spelling_is_refused(
        ip in forbidden_v6(),
        wrap in any::<u8>(),
        zone in "[a-z0-9]{1,8}",
    ) {
        let s = ip.segments();
        let [_, _, _, _, _, _, g, h] = s;
        let dotted = Ipv4Addr::from((u32::from(g) << 16) | u32::from(h));
        let full = s.iter().map(|x| format!("{x:04x}")).collect::<Vec<_>>().join(":");
        let head = s[..6].iter().map(|x| format!("{x:x}")).collect::<Vec<_>>().join(":");
        for host in [
            format!("[{ip}]"),
            format!("[{}]", ip.to_string().to_uppercase()),
            format!("[{full}]"),
            format!("[{head}:{dotted}]"),
        ] {
            let url = in_url(&host, wrap);
            prop_assert_eq!(parsed_ip(&url), Some(IpAddr::V6(ip)), "{:?}", url);
            refused(&url)?;
        }
        // Zone ids, percent-encoded or not: the URL parser has no notion
        // of them, so the URL is refused outright.
        for host in [format!("[{ip}%25{zone}]"), format!("[{ip}%{zone}]")] {
            let url = in_url(&host, wrap);
            prop_assert!(matches!(WebhookUrl::parse(&url, DENY), Err(UrlError::Invalid(_))), "{url:?}");
        }
    }

    /// Public IPv4 addresses in the same spellings are accepted, as that
    /// very address.
    #[test]
    fn public_v4_in_any_spelling_is_accepted(
        ip in public_v4(),
        how in any::<[u8; 4]>(),
        zeros in proptest::array::uniform4(0usize..3),
        wrap in any::<u8>(),
    ) {
        for host in v4_spellings(ip, how, zeros) {
            let url = in_url(&host, wrap);
            let parsed = WebhookUrl::parse(&url, DENY);
            prop_assert!(parsed.is_ok(), "{url:?}: {parsed:?}");
            let parsed = parsed.expect("checked");
            prop_assert_eq!(parsed.ip_literal(), Some(IpAddr::V4(ip)), "{:?}", url);
        }
        for host in mapped_spellings(ip) {
            let url = in_url(&host, wrap);
            let parsed = WebhookUrl::parse(&url, DENY);
            prop_assert!(parsed.is_ok(), "{url:?}: {parsed:?}");
        }
    }

    /// Whatever the URL parser leaves as a name (and `WebhookUrl::parse`
    /// accepts) is no address the HTTP client would connect to without
    /// resolving it (it skips DNS, and so the guarded resolver, only for
    /// text `IpAddr` parses), even with its trailing dots taken off.
    #[test]
    fn names_left_by_the_parser_are_never_addresses(
        host in "[0-9a-fA-FxX.%:\\[\\]]{1,24}|[0-9.]{1,20}[a-z]{0,3}|[a-z0-9.-]{1,20}\\.[0-9]{1,4}",
        wrap in any::<u8>(),
    ) {
        let url = in_url(&host, wrap);
        if let (Ok(parsed), Ok(_)) = (url::Url::parse(url.trim()), WebhookUrl::parse(&url, DENY)) {
            if let Some(url::Host::Domain(name)) = parsed.host() {
                prop_assert!(name.parse::<IpAddr>().is_err(), "{url:?} → name {name:?}");
                let bare = name.trim_end_matches('.');
                prop_assert!(bare.parse::<IpAddr>().is_err(), "{url:?} → name {name:?}");
            }
        }
    }

    /// Any text: no panic; an accepted URL is http(s) with a host and no
    /// forbidden address, and its stored form parses back to itself (the
    /// sender parses it again on every attempt).
    #[test]
    fn url_parse_never_panics_and_stored_forms_are_stable(
        s in prop_oneof![
            any::<String>(),
            "(https?|ftp|file|HTTP)://[\\PC]{0,40}",
            "https?://[a-z0-9.:@\\[\\]%/?#-]{0,40}",
        ],
    ) {
        if let Ok(url) = WebhookUrl::parse(&s, DENY) {
            let inner = url.clone().into_url();
            prop_assert!(matches!(inner.scheme(), "http" | "https"));
            prop_assert!(inner.host().is_some());
            if let Some(ip) = url.ip_literal() {
                prop_assert!(is_global(ip), "{s:?} → {ip}");
            }
            prop_assert_eq!(WebhookUrl::parse(url.as_str(), DENY), Ok(url.clone()));
        }
    }
}
