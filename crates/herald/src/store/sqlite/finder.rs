//! The finding tools' searches on SQLite.

use super::apps::app_from_row;
use super::*;
use crate::store::finder::{add_counts, like_pattern};

fn found_from_row(r: &Row<'_>) -> StoreResult<FoundMessage> {
    Ok(FoundMessage {
        id: MsgId::from_trusted(get(r, "id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        app_name: get(r, "app_name")?,
        event_type: get(r, "event_type")?,
        event_id: get(r, "event_id")?,
        created_at: get(r, "created_at")?,
        deliveries: DeliveryCounts::default(),
    })
}

/// The WHERE clause (after `WHERE`) and its arguments. Which index serves
/// it: the primary key or `UNIQUE (app_id, event_id)` /
/// `messages_by_event_id` for an id; `messages_by_app_type`
/// for an event type in an application (across all of them, no index: the
/// walk in id order tests each); else `messages_by_app` or the
/// primary key, walked in id order. The status is checked per message
/// through `deliveries_by_msg`.
pub(super) fn find_filter_sql(filter: &FindFilter) -> (String, Vec<Value>) {
    let mut cond = String::from("1 = 1");
    let mut args: Vec<Value> = Vec::new();
    if let Some(app) = &filter.app {
        // With an id to look up, the id's indexes answer in one step: the
        // `+` keeps the planner from walking the whole application instead.
        cond.push_str(if filter.id_or_event_id.is_some() {
            " AND +m.app_id = ?"
        } else {
            " AND m.app_id = ?"
        });
        args.push(app.as_str().to_owned().into());
    }
    if let Some(key) = &filter.id_or_event_id {
        cond.push_str(" AND (m.id = ? OR m.event_id = ?)");
        args.push(key.clone().into());
        args.push(key.clone().into());
    }
    if let Some(t) = &filter.event_type {
        cond.push_str(" AND m.event_type = ?");
        args.push(t.clone().into());
    }
    if let Some(state) = filter.status {
        cond.push_str(
            " AND EXISTS (SELECT 1 FROM deliveries d INDEXED BY deliveries_by_msg \
             WHERE d.msg_id = m.id AND d.state = ?)",
        );
        args.push((state as i64).into());
    }
    if let Some(after) = filter.created_after {
        cond.push_str(" AND m.created_at >= ?");
        args.push(after.into());
    }
    if let Some(before) = filter.created_before {
        cond.push_str(" AND m.created_at < ?");
        args.push(before.into());
    }
    if let Some(channel) = &filter.channel {
        cond.push_str(" AND EXISTS (SELECT 1 FROM json_each(m.channels) WHERE value = ?)");
        args.push(channel.clone().into());
    }
    (cond, args)
}

#[async_trait]
impl Finder for SqliteStore {
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
        let page = page.clone();
        self.read(move |c| {
            let mut found = page_of(c, &sql, "m.id", args, &page, found_from_row)?;
            if found.items.is_empty() {
                return Ok(found);
            }
            let ids: Vec<&str> = found.items.iter().map(|m| m.id.as_str()).collect();
            let mut stmt = c
                .prepare_cached(
                    "SELECT msg_id, state, COUNT(*) FROM deliveries INDEXED BY deliveries_by_msg \
                     WHERE msg_id IN (SELECT value FROM json_each(?1)) GROUP BY msg_id, state",
                )
                .map_err(map_err)?;
            let counts = stmt
                .query_map(params![to_json(&ids)?], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .map_err(map_err)?
                .collect::<Result<Vec<(String, i64, i64)>, _>>()
                .map_err(map_err)?;
            add_counts(&mut found.items, counts);
            Ok(found)
        })
        .await
    }

    async fn find_apps(&self, search: Option<&str>, page: &PageReq) -> StoreResult<Page<App>> {
        let mut sql = String::from("SELECT * FROM applications WHERE 1 = 1");
        let mut args: Vec<Value> = Vec::new();
        if let Some(search) = search {
            // Applications are few beside messages: the walk by id with
            // this test stops after a page of matches.
            sql.push_str(" AND (name LIKE ? ESCAPE '\\' OR uid = ? OR id = ?)");
            args.push(like_pattern(search).into());
            args.push(search.to_owned().into());
            args.push(search.to_owned().into());
        }
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, app_from_row))
            .await
    }
}
