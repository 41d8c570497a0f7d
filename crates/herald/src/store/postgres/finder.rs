//! The finding tools' searches on PostgreSQL.

use super::apps::APP_COLUMNS;
use super::*;
use crate::store::finder::{add_counts, like_pattern};

/// The WHERE clause (after `WHERE`) and its text arguments (cast in the
/// SQL). Indexes as on SQLite: the primary key, `(app_id, event_id)` or
/// `messages_by_event_id` for an id, `messages_by_app_type` /
/// `messages_by_type` for an event type, else `messages_by_app` or the
/// primary key in id order; the status through `deliveries_by_msg`.
pub(super) fn find_filter_sql(filter: &FindFilter) -> (String, Vec<String>) {
    let mut cond = String::from("TRUE");
    let mut args: Vec<String> = Vec::new();
    let mut add = |cond: &mut String, fragment: &str, value: String| {
        args.push(value);
        cond.push_str(&fragment.replace('#', &format!("${}", args.len())));
    };
    if let Some(app) = &filter.app {
        add(&mut cond, " AND m.app_id = #", app.as_str().to_owned());
    }
    if let Some(key) = &filter.id_or_event_id {
        add(&mut cond, " AND (m.id = # OR m.event_id = #)", key.clone());
    }
    if let Some(t) = &filter.event_type {
        add(&mut cond, " AND m.event_type = #", t.clone());
    }
    if let Some(state) = filter.status {
        add(
            &mut cond,
            " AND EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state = #::int2)",
            (state as i64).to_string(),
        );
    }
    if let Some(after) = filter.created_after {
        add(&mut cond, " AND m.created_at >= #::int8", after.to_string());
    }
    if let Some(before) = filter.created_before {
        add(&mut cond, " AND m.created_at < #::int8", before.to_string());
    }
    if let Some(channel) = &filter.channel {
        add(
            &mut cond,
            " AND jsonb_exists(m.channels::jsonb, #)",
            channel.clone(),
        );
    }
    (cond, args)
}

#[async_trait]
impl Finder for PostgresStore {
    async fn find_messages(
        &self,
        filter: &FindFilter,
        page: &PageReq,
    ) -> StoreResult<Page<FoundMessage>> {
        let (cond, args) = find_filter_sql(filter);
        let sql = format!(
            "SELECT m.id, m.app_id, a.name AS app_name, m.event_type, m.event_id, m.created_at \
             FROM messages m JOIN applications a ON a.id = m.app_id WHERE {cond}"
        );
        let mut found = self
            .page_of(&sql, "m.id", args, page, found_from_row)
            .await?;
        if found.items.is_empty() {
            return Ok(found);
        }
        let ids: Vec<String> = found
            .items
            .iter()
            .map(|m| m.id.as_str().to_owned())
            .collect();
        let rows = sqlx::query(
            "SELECT msg_id, state, count(*) AS n FROM deliveries \
             WHERE msg_id = ANY($1) GROUP BY msg_id, state",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        let counts = map_rows(&rows, |r| {
            Ok((
                get::<String>(r, "msg_id")?,
                i64::from(get::<i16>(r, "state")?),
                get::<i64>(r, "n")?,
            ))
        })?;
        add_counts(&mut found.items, counts);
        Ok(found)
    }

    async fn find_apps(&self, search: Option<&str>, page: &PageReq) -> StoreResult<Page<App>> {
        let mut sql = format!("SELECT {APP_COLUMNS} FROM applications WHERE TRUE");
        let mut args = Vec::new();
        if let Some(search) = search {
            sql.push_str(" AND (name ILIKE $1 ESCAPE '\\' OR uid = $2 OR id = $2)");
            args.push(like_pattern(search));
            args.push(search.to_owned());
        }
        self.page_of(&sql, "id", args, page, app_from_row).await
    }
}
