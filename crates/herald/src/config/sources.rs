//! Where configuration values come from besides the environment: a
//! secret's `<KEY>_FILE` (as Docker and Kubernetes mount them) and the
//! TOML file given to `--config`.

use std::collections::BTreeMap;

use super::{ConfigError, KEYS};

/// The settings that may be read from a file named by `<KEY>_FILE`
/// (Docker and Kubernetes mount secrets as files).
pub const FILE_KEYS: [&str; 3] = [
    "HERALD_ADMIN_TOKEN",
    "HERALD_ENCRYPTION_KEY",
    "HERALD_DATABASE_URL",
];

/// `values` with each `<KEY>_FILE` read into `<KEY>` (its trailing
/// whitespace, such as the newline an editor adds, dropped). Errors name
/// the `_FILE` key and the path, never what the file holds.
pub(super) fn with_secret_files(
    values: &BTreeMap<String, String>,
) -> Result<std::borrow::Cow<'_, BTreeMap<String, String>>, ConfigError> {
    let mut out = std::borrow::Cow::Borrowed(values);
    for key in FILE_KEYS {
        let file_key = format!("{key}_FILE");
        let Some(path) = values
            .get(&file_key)
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
        else {
            continue;
        };
        let invalid = |message: String| ConfigError::Invalid {
            key: file_key.clone(),
            message,
        };
        if values.get(key).is_some_and(|v| !v.trim().is_empty()) {
            return Err(invalid(format!("set {key} or {file_key}, not both")));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid(format!("cannot read {path}: {e}")))?;
        let secret = text.trim_end();
        if secret.is_empty() {
            return Err(invalid(format!("{path} is empty")));
        }
        out.to_mut().insert(key.to_owned(), secret.to_owned());
    }
    Ok(out)
}

/// Reads a flat TOML table into `HERALD_*` keys. Unknown keys are errors, so
/// a typo does not silently fall back to a default.
pub(super) fn parse_toml(text: &str) -> Result<BTreeMap<String, String>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = BTreeMap::new();
    for (key, value) in table {
        let env_key = format!("HERALD_{}", key.to_ascii_uppercase());
        if !KEYS.iter().any(|(k, _, _)| *k == env_key) {
            return Err(format!("unknown key `{key}`"));
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Array(items) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("`{key}`: list items must be strings"))
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
            other => return Err(format!("`{key}`: unsupported value {other}")),
        };
        out.insert(env_key, text);
    }
    Ok(out)
}
