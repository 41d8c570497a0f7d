//! Calls with an `Idempotency-Key`, as the SDKs make them.

use axum::http::StatusCode;
use serde_json::Value;

use super::AsToken;

impl AsToken<'_> {
    /// `POST path` with `body` as JSON and the `Idempotency-Key` `key`: the
    /// status, whether the answer was a replay (`Idempotent-Replayed`), and
    /// the body as it came.
    pub async fn post_keyed(
        &self,
        path: &str,
        key: &str,
        body: Value,
    ) -> (StatusCode, bool, String) {
        let resp = self
            .app
            .client
            .post(self.app.url(path))
            .bearer_auth(self.token)
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .expect("request reaches herald");
        let status = StatusCode::from_u16(resp.status().as_u16()).expect("status");
        let replayed = resp.headers().get("idempotent-replayed").is_some();
        (status, replayed, resp.text().await.expect("body"))
    }
}
