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
/// not parse (a typo in its port) is shown without whatever stands between
/// its scheme and its last `@`: that may be a password too.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("redacted"));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => match (url.split_once("://"), url.rfind('@')) {
            (Some((scheme, _)), Some(at)) if at > scheme.len() => {
                format!("{scheme}://redacted{}", &url[at..])
            }
            _ => url.to_owned(),
        },
    }
}
