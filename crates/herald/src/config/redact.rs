//! How the configuration shows what it holds without its credentials:
//! the password in a URL, the admin token, the operator webhook's secret
//! (its `Debug`, and the messages that name a URL).

pub(super) fn redacted_url(url: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    std::fmt::Debug::fmt(&redact_url(url), f)
}

pub(super) fn redacted_optional_url(
    url: &Option<String>,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    std::fmt::Debug::fmt(&url.as_deref().map(redact_url), f)
}

pub(super) fn redacted_secret(
    secret: &Option<String>,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    std::fmt::Debug::fmt(&secret.as_ref().map(|_| "<redacted>"), f)
}

pub(super) fn masked_url(url: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    std::fmt::Debug::fmt(&crate::net::masked_url(url), f)
}

pub(super) fn webhook_url_only(
    webhook: &Option<(String, String)>,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    std::fmt::Debug::fmt(
        &webhook
            .as_ref()
            .map(|(url, _secret)| crate::net::masked_url(url)),
        f,
    )
}

/// The URL without its password, for messages and logs. One that does
/// not parse as a URL with a host (a typo in its port; `user:pw@host:8080`,
/// which parses with `user` as its scheme) is shown without whatever
/// stands before its last `@` (after its scheme): that may be a password.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("redacted"));
            u.to_string()
        }
        Ok(u) if u.has_authority() => url.to_owned(),
        _ => match (url.split_once("://"), url.rfind('@')) {
            (Some((scheme, _)), Some(at)) if at > scheme.len() => {
                format!("{scheme}://redacted{}", &url[at..])
            }
            (None, Some(at)) => format!("redacted{}", &url[at..]),
            _ => url.to_owned(),
        },
    }
}
