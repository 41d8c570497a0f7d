//! The egress settings' own checks: the proxy's URL and the hosts
//! reached around it.

use std::net::IpAddr;

use super::redact_url;

/// `HERALD_PROXY_URL`, checked: empty is no proxy; else a URL of a scheme
/// the client speaks, with a host and a port.
pub(super) fn proxy_url_of(text: &str) -> Result<Option<String>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    let shown = redact_url(text);
    let url = url::Url::parse(text).map_err(|e| format!("`{shown}` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "socks5" | "socks5h") {
        return Err(format!(
            "`{shown}`: the scheme must be http, socks5 or socks5h (https proxies are not supported)"
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{shown}` has no host"));
    }
    if url.port_or_known_default().is_none() {
        return Err(format!("`{shown}` needs a port"));
    }
    if url.path() != "/" && !url.path().is_empty() || url.query().is_some() {
        return Err(format!("`{shown}`: a proxy URL has no path or query"));
    }
    Ok(Some(text.to_owned()))
}

/// `HERALD_NO_PROXY`, checked entry by entry: empty is none. The proxy
/// client compares a name entry with the host as text, so an entry that
/// is not a bare host, `.domain`, address, CIDR block or `*` (a port, a
/// scheme, a `*.` wildcard) would never match, and the traffic meant to
/// go around the proxy would silently go through it.
pub(super) fn no_proxy_of(text: &str) -> Result<Option<String>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    // Empty entries (`a,,b`, a trailing comma) are skipped, as curl does.
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        no_proxy_entry(entry)?;
    }
    Ok(Some(text.to_owned()))
}

fn no_proxy_entry(entry: &str) -> Result<(), String> {
    if entry == "*" || entry.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let whole_host =
        "give the host alone (no scheme, no port): every port of it goes around the proxy";
    if entry.contains("://") {
        return Err(format!("`{entry}`: {whole_host}"));
    }
    if let Some((address, prefix)) = entry.split_once('/') {
        let longest = match address.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => 32,
            Ok(IpAddr::V6(_)) => 128,
            Err(_) => {
                return Err(format!(
                    "`{entry}`: a CIDR block is an address, `/` and a prefix length"
                ))
            }
        };
        return match prefix.parse::<u8>() {
            Ok(bits) if bits <= longest => Ok(()),
            _ => Err(format!("`{entry}`: the prefix length is 0 to {longest}")),
        };
    }
    if entry.starts_with('[') {
        return Err(format!("`{entry}`: write an IPv6 address without brackets"));
    }
    // An IPv6 address was taken above: a colon left is a port.
    if entry.contains(':') {
        return Err(format!("`{entry}`: {whole_host}"));
    }
    if let Some(domain) = entry.strip_prefix("*.") {
        return Err(format!(
            "`{entry}`: write `.{domain}` for a domain and its subdomains"
        ));
    }
    let name = entry.strip_prefix('.').unwrap_or(entry);
    let is_label = |label: &str| {
        !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if name.split('.').all(is_label) {
        Ok(())
    } else {
        Err(format!(
            "`{entry}` is not a host name, `.domain`, IP address or CIDR block"
        ))
    }
}
